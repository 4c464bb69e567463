"""Idle-gap classification and roofline classes on hand-made traces whose answers are worked out below."""

from __future__ import annotations

import json

import pytest

from gpuadvisor.analysis.bundle import analyze_trace
from gpuadvisor.device.peaks import lookup_peaks
from gpuadvisor.trace.kineto import load_trace

H200 = dict(id=0, name="NVIDIA H200", totalGlobalMem=150109880320, computeMajor=9, computeMinor=0, numSms=132)


def x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur, "args": args}


def kernel(name, ts, dur, corr, ext, grid=(264, 1, 1)):
    return x(
        "kernel",
        name,
        ts,
        dur,
        tid=7,
        device=0,
        stream=7,
        correlation=corr,
        grid=list(grid),
        block=[128, 1, 1],
        **{"External id": ext},
    )


def launch(ts, dur, corr, ext, name="cudaLaunchKernel"):
    return x("cuda_runtime", name, ts, dur, correlation=corr, **{"External id": ext})


def write(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"deviceProperties": [H200], "traceEvents": events}))
    return load_trace(path)


def test_idle_gaps_are_split_by_what_ended_them(tmp_path):
    """One 100 µs step. Kernel A 10-20 (launched 5-8), a stream sync 15-21; kernel B 40-50 launched at
    35-37, after the GPU went idle at 20 but the sync returned inside that gap -> the 20 µs gap is sync;
    kernel C 55-60 was launched at 30-33, before the gap 50-55 began -> other; the lead 0-10 (A's launch
    ended at 8, inside the gap) and the tail 60-100 (no more work) are launch. Busy 25, launch 50, sync 20,
    other 5."""
    events = [
        x("user_annotation", "ProfilerStep#1", 0, 100),
        launch(5, 3, 1, 11),
        kernel("gemm_a", 10, 10, 1, 11),
        x("cuda_runtime", "cudaStreamSynchronize", 15, 6, correlation=2),
        launch(30, 3, 3, 13),
        launch(35, 2, 4, 14),
        kernel("gemm_b", 40, 10, 4, 14),
        kernel("gemm_c", 55, 5, 3, 13),
    ]
    steps = analyze_trace(write(tmp_path, events), lookup_peaks(None)).steps
    row = steps.iloc[0]
    assert (row.step_time_us, row.gpu_busy_us) == (100, 25)
    assert (row.idle_launch_us, row.idle_sync_us, row.idle_other_us) == (50, 20, 5)
    assert row.host_syncs == 1 and row.launch_calls == 3 and row.kernels == 3


def test_roofline_classes_from_shapes_grids_and_launches(tmp_path):
    """On an H200 (132 SMs; datasheet bf16 989.5 TFLOP/s, 4.8 TB/s):
    - a bf16 4096^3 mm: 137.4 GFLOP over 100.7 MB -> intensity 1365 FLOP/B, above the ridge (206): compute;
      in 200 µs it runs at 687 TFLOP/s = 69.4% of its roof;
    - a bf16 add of two 4096x4096 tensors: 16.8 M FLOP over 100.7 MB -> memory; 30 µs -> 3.36 TB/s = 70%;
    - the same add with a 64-block grid (under one wave of 132 SMs): latency;
    - a 2 µs kernel whose launch call took 5 µs: launch."""
    mm_args = {"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}
    add_args = {
        "Input Dims": [[4096, 4096], [4096, 4096], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "Scalar"],
    }
    events = [
        x("user_annotation", "ProfilerStep#1", 0, 1000),
        x("cpu_op", "aten::mm", 1, 9, **{"External id": 1, "flops": 2 * 4096**3, **mm_args}),
        launch(2, 5, 1, 1),
        kernel("nvjet_gemm", 10, 200, 1, 1),
        x("cpu_op", "aten::add", 300, 9, **{"External id": 2, **add_args}),
        launch(301, 5, 2, 2),
        kernel("vectorized_elementwise_kernel_add", 310, 30, 2, 2),
        x("cpu_op", "aten::add", 400, 9, **{"External id": 3, **add_args}),
        launch(401, 5, 3, 3),
        kernel("vectorized_elementwise_kernel_add_small", 410, 30, 3, 3, grid=(64, 1, 1)),
        launch(500, 5, 4, 4),
        kernel("tiny_fill", 510, 2, 4, 4),
    ]
    trace = write(tmp_path, events)
    k = analyze_trace(trace, lookup_peaks(trace.device)).kernels.set_index("name")
    assert k.loc["nvjet_gemm", "bound"] == "compute"
    assert k.loc["nvjet_gemm", "intensity"] == pytest.approx(2 * 4096**3 / (3 * 4096 * 4096 * 2), rel=1e-9)
    assert k.loc["nvjet_gemm", "pct_of_roof"] == pytest.approx(100 * 2 * 4096**3 / 200e-6 / 989.5e12, rel=1e-3)
    assert not k.loc["nvjet_gemm", "estimated"]  # the profiler's own FLOP count
    assert k.loc["vectorized_elementwise_kernel_add", "bound"] == "memory"
    assert k.loc["vectorized_elementwise_kernel_add", "pct_of_roof"] == pytest.approx(
        100 * (3 * 4096 * 4096 * 2) / 30e-6 / 4.8e12, rel=1e-3
    )
    assert k.loc["vectorized_elementwise_kernel_add_small", "bound"] == "latency"
    assert k.loc["tiny_fill", "bound"] == "launch"

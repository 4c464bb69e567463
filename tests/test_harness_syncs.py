"""Runtime calls of the profiling harness are not the user's (gpuadvisor.analysis.harness).

Synthetic traces shaped like the public H100 transformers-pipeline trace (no ProfilerStep: the whole trace is
the step; a final cudaDeviceSynchronize in the function that drives the profiler), and like a user's own
``profile.py`` whose step syncs inside a ProfilerStep window (still the user's).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuadvisor.pipeline import analyze_path

H100 = dict(id=0, name="NVIDIA H100 80GB HBM3", totalGlobalMem=85e9, computeMajor=9, computeMinor=0, numSms=132)


def x(cat: str, name: str, ts: float, dur: float, tid=1, args: dict | None = None) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur}
    if args is not None:
        event["args"] = args
    return event


def kernel(ts: float, dur: float, corr: int, ext: int) -> dict:
    args = {"device": 0, "stream": 7, "correlation": corr, "External id": ext}
    args.update(grid=[264, 1, 1], block=[128, 1, 1])
    return x("kernel", "elementwise_kernel", ts, dur, tid=7, args=args)


def write(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [H100], "traceEvents": events}))
    return path


def pipeline_events(harness_sync: bool) -> list[dict]:
    """A pipeline call (library frames) with 8 kernels and one .item(), then host post-processing, then (when
    ``harness_sync``) torch.cuda.synchronize() in run_torch_profiler, the function that drives the profiler."""
    events = [
        x("python_function", "profiling/profile.py(20): run_torch_profiler", 0, 3000),
        x("python_function", "transformers/pipelines/base.py(1200): __call__", 10, 1400),
        x("python_function", "torch/profiler/profiler.py(760): __exit__", 2900, 100),
    ]
    for i in range(8):
        ext, corr, t = 100 + i, 10 + i, 20 + 100 * i
        events += [
            x("cpu_op", "aten::add", t, 20, args={"External id": ext}),
            x("cuda_runtime", "cudaLaunchKernel", t + 5, 5, args={"correlation": corr, "External id": ext}),
            kernel(t + 12, 60, corr, ext),
        ]
    # .item() inside the pipeline: the user's sync (an operator issued it).
    events += [
        x("cpu_op", "aten::_local_scalar_dense", 830, 40, args={"External id": 200}),
        x("cuda_runtime", "cudaStreamSynchronize", 835, 30, args={"correlation": 90, "External id": 200}),
    ]
    if harness_sync:
        events += [
            x("python_function", "torch/cuda/__init__.py(1152): synchronize", 2000, 300),
            x("cuda_runtime", "cudaDeviceSynchronize", 2005, 290, args={"correlation": 91}),
        ]
    return events


def test_harness_sync_in_a_whole_trace_step_is_left_out(tmp_path):
    before = analyze_path(write(tmp_path, pipeline_events(harness_sync=False)))
    report = analyze_path(write(tmp_path, pipeline_events(harness_sync=True)))
    # The step, its syncs and its findings are those of the trace without the harness's sync.
    for key in ("step_time_us", "host_syncs_per_step", "idle_sync_us", "idle_launch_us", "gpu_busy_pct"):
        assert report["summary"][key] == before["summary"][key], key
    assert report["summary"]["host_syncs_per_step"] == 1.0
    assert report["summary"]["step_time_us"] < 1000  # not stretched to the harness's sync at 2.3 ms
    assert [f["rule_id"] for f in report["findings"]] == [f["rule_id"] for f in before["findings"]]
    sources = [s["name"] for s in report["host_syncs"]]
    assert sources == ["cudaStreamSynchronize"]
    note = [n for n in report["notes"] if "profiling harness" in n]
    assert note and "cudaDeviceSynchronize" in note[0] and "run_torch_profiler" in note[0]


def stepped_events() -> list[dict]:
    """Two ProfilerSteps driven by bench.py's main (which calls prof.step()); the step function lives in the
    user's profile.py and calls torch.cuda.synchronize() itself; main also synchronizes before prof.step()."""
    events = [x("python_function", "bench.py(5): main", 0, 2000)]
    for i, t0 in enumerate((100.0, 900.0)):
        ext, corr = 100 + i, 10 + 10 * i
        events += [
            x("user_annotation", f"ProfilerStep#{i + 1}", t0, 700),
            x("python_function", "profile.py(10): step", t0 + 10, 500),
            x("cpu_op", "aten::mul", t0 + 20, 20, args={"External id": ext}),
            x("cuda_runtime", "cudaLaunchKernel", t0 + 25, 5, args={"correlation": corr, "External id": ext}),
            kernel(t0 + 35, 200, corr, ext),
            x("python_function", "torch/cuda/__init__.py(1152): synchronize", t0 + 300, 20),
            x("cuda_runtime", "cudaDeviceSynchronize", t0 + 302, 15, args={"correlation": corr + 1}),
            # main's own synchronize before prof.step(): the harness's
            x("python_function", "torch/cuda/__init__.py(1152): synchronize", t0 + 600, 20),
            x("cuda_runtime", "cudaDeviceSynchronize", t0 + 602, 15, args={"correlation": corr + 2}),
            x("python_function", "torch/profiler/profiler.py(884): step", t0 + 690, 20),
        ]
    return events


def test_sync_in_the_users_profile_py_step_stays_the_users(tmp_path):
    report = analyze_path(write(tmp_path, stepped_events()))
    assert report["summary"]["steps"] == 2
    assert report["summary"]["host_syncs_per_step"] == 1.0  # profile.py's own; main's left out
    assert [s["source"] for s in report["host_syncs"]][0].startswith("profile.py:")
    note = [n for n in report["notes"] if "profiling harness" in n]
    assert note and "bench.py" in note[0] and note[0].startswith("2 host sync(s)")

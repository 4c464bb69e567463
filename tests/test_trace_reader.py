"""The Kineto reader on small synthetic traces: which event lands in which table, with which values."""

from __future__ import annotations

import gzip
import json
import math
import tracemalloc
import zlib
from pathlib import Path

import pandas as pd
import pytest
from pandas.api.types import is_numeric_dtype
from pandas.testing import assert_frame_equal

from gpuadvisor.errors import BadInputError
from gpuadvisor.trace import columns, kineto
from gpuadvisor.trace.kineto import load_trace

TABLES = ("kernels", "memcpys", "runtime", "cpu_ops", "annotations", "syncs", "python_frames", "steps")
MEMCPY_NAME = "Memcpy HtoD (Pageable -> Device)"
H200 = dict(id=0, name="NVIDIA H200", totalGlobalMem=150109880320, computeMajor=9, computeMinor=0, numSms=132)


def x(cat: str, name: str, ts: float, dur: float, tid=1, args: dict | None = None) -> dict:
    """A complete ("X") event as torch.profiler writes it."""
    event = {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur}
    if args is not None:
        event["args"] = args
    return event


def gpu_args(correlation: int, external_id: int, **more) -> dict:
    return {"device": 0, "stream": 7, "correlation": correlation, "External id": external_id, **more}


def synthetic_events() -> list[dict]:
    """Two profiler steps of a tiny model: one operator, its kernel, a copy, a memset and a sync each."""
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        x("python_function", "model.py(12): forward", 95, 60, tid=11),
    ]
    for i, t0 in enumerate((100.0, 300.0)):
        step, corr, ext = 3 + i, 10 * (i + 1), 100 + i
        mm = {"External id": ext, "Input Dims": [[4, 8], [8, 16]], "Input type": ["float", "float"], "flops": 1024}
        gemm = gpu_args(corr, ext, grid=[4, 2, 3], block=[128, 2, 1])
        gemm.update({"registers per thread": 32, "shared memory": 1024})
        triton = gpu_args(corr + 1, ext, grid=[1, 1, 1], block=[32, 1, 1])
        launch = [{"correlation": corr + n, "External id": ext} for n in range(4)]
        events += [
            x("user_annotation", f"ProfilerStep#{step}", t0, 150.0),
            x("gpu_user_annotation", f"ProfilerStep#{step}", t0 + 20, 100.0, tid=7),
            x("cpu_op", "aten::mm", t0 + 5, 30.0, args=mm),
            x("cuda_runtime", "cudaLaunchKernel", t0 + 10, 4.0, args=launch[0]),
            x("kernel", "gemm_kernel", t0 + 40, 12.5, tid=7, args=gemm),
            x("cuda_driver", "cuLaunchKernel", t0 + 50, 2.0, args=launch[1]),
            x("kernel", "triton_add", t0 + 60, 3.0, tid=7, args=triton),
            x("cuda_runtime", "cudaMemcpyAsync", t0 + 70, 5.0, args=launch[2]),
            x("gpu_memcpy", MEMCPY_NAME, t0 + 80, 6.0, tid=7, args=gpu_args(corr + 2, ext, bytes=4096)),
            x("cuda_runtime", "cudaMemsetAsync", t0 + 90, 1.0, args=launch[3]),
            x("gpu_memset", "Memset (Device)", t0 + 95, 0.5, tid=7, args=gpu_args(corr + 3, ext, bytes=256)),
            x("cuda_sync", "Stream Sync", t0 + 110, 3.0, tid=7, args={"stream": 7, "correlation": corr + 4}),
            {"ph": "s", "id": corr, "pid": 0, "tid": 1, "ts": t0 + 10, "cat": "ac2g", "name": "ac2g"},
        ]
    return events


def trace_doc(events: list[dict] | None = None, rank: int | None = None) -> dict:
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [H200],
        "traceEvents": synthetic_events() if events is None else events,
    }
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    return doc


def write_json(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


def assert_same_tables(a, b) -> None:
    """Same rows, columns and values; numeric and bool columns also of the same dtype (text columns may be
    object or str, which pandas picks from whether a piece was empty)."""
    for name in TABLES:
        left, right = getattr(a, name), getattr(b, name)
        if name == "annotations":  # host and GPU annotations interleave per decode chunk; no row order is promised
            left, right = (df.sort_values(["ts_us", "on_gpu"]).reset_index(drop=True) for df in (left, right))
        assert_frame_equal(left, right, check_dtype=False, obj=name)
        numeric = [c for c in left.columns if is_numeric_dtype(left[c]) or is_numeric_dtype(right[c])]
        assert {c: left[c].dtype for c in numeric} == {c: right[c].dtype for c in numeric}, name


@pytest.fixture
def trace(tmp_path):
    return load_trace(write_json(tmp_path / "t.json", trace_doc()))


def test_kernels_table(trace):
    k = trace.kernels
    assert list(k["name"]) == ["gemm_kernel", "triton_add", "gemm_kernel", "triton_add"]
    assert list(k["ts_us"]) == [140.0, 160.0, 340.0, 360.0]
    assert list(k["dur_us"]) == [12.5, 3.0, 12.5, 3.0]
    assert list(k["end_us"]) == [152.5, 163.0, 352.5, 363.0]
    assert list(k["correlation"]) == [10, 11, 20, 21]
    assert list(k["external_id"]) == [100, 100, 101, 101]
    assert set(k["device"]) == {0} and set(k["stream"]) == {7} and set(k["rank"]) == {0}
    gemm = k.iloc[0]
    assert (gemm["grid_x"], gemm["grid_y"], gemm["grid_z"]) == (4, 2, 3)
    assert (gemm["block_x"], gemm["block_y"], gemm["block_z"]) == (128, 2, 1)
    assert gemm["blocks"] == 4 * 2 * 3
    assert gemm["threads_per_block"] == 256
    assert gemm["registers_per_thread"] == 32 and gemm["shared_memory_bytes"] == 1024
    triton = k.iloc[1]
    assert triton["blocks"] == 1 and triton["threads_per_block"] == 32
    assert triton["registers_per_thread"] == -1 and triton["shared_memory_bytes"] == -1  # not recorded


def test_memcpy_and_memset_rows(trace):
    m = trace.memcpys
    assert list(m["op"]) == ["memcpy", "memset", "memcpy", "memset"]
    copy, memset = m.iloc[0], m.iloc[1]
    assert copy["name"] == MEMCPY_NAME
    assert (copy["direction"], copy["src_kind"], copy["dst_kind"]) == ("HtoD", "Pageable", "Device")
    assert (copy["bytes"], copy["correlation"], copy["ts_us"], copy["dur_us"]) == (4096, 12, 180.0, 6.0)
    assert (memset["direction"], memset["src_kind"], memset["dst_kind"]) == ("Memset", "", "Device")
    assert (memset["bytes"], memset["correlation"], memset["ts_us"]) == (256, 13, 195.0)


def test_runtime_table_has_runtime_and_driver_calls(trace):
    r = trace.runtime
    assert list(r["name"]) == ["cudaLaunchKernel", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync"] * 2
    assert list(r["api"]) == ["runtime", "driver", "runtime", "runtime"] * 2
    assert list(r["correlation"]) == [10, 11, 12, 13, 20, 21, 22, 23]
    assert list(r["ts_us"][:4]) == [110.0, 150.0, 170.0, 190.0]
    assert set(r["tid"]) == {1}


def test_cpu_ops_keep_flops_and_shapes(trace):
    ops = trace.cpu_ops
    assert list(ops["name"]) == ["aten::mm", "aten::mm"]
    assert list(ops["external_id"]) == [100, 101]
    assert list(ops["flops"]) == [1024.0, 1024.0]
    dims, types = kineto.input_shapes(ops)
    assert dims == [[[4, 8], [8, 16]]] * 2
    assert types == [["float", "float"]] * 2


def test_annotations_syncs_frames_and_steps(trace):
    ann = trace.annotations
    host = ann[~ann["on_gpu"]]
    gpu = ann[ann["on_gpu"]]
    assert sorted(host["name"]) == ["ProfilerStep#3", "ProfilerStep#4"]
    assert sorted(gpu["ts_us"]) == [120.0, 320.0]
    steps = trace.steps
    # Only host annotations make steps (the GPU copies of ProfilerStep#N do not add rows).
    assert list(steps["step"]) == [3, 4]
    assert list(steps["ts_us"]) == [100.0, 300.0]
    assert list(steps["dur_us"]) == [150.0, 150.0]
    assert list(steps["end_us"]) == [250.0, 450.0]
    assert list(trace.syncs["stream"]) == [7, 7] and list(trace.syncs["correlation"]) == [14, 24]
    frames = trace.python_frames
    assert list(frames["name"]) == ["model.py(12): forward"] and list(frames["tid"]) == [11]


def test_metadata_and_device(trace):
    assert trace.ranks == [0]
    assert trace.device.name == "NVIDIA H200" and trace.device.sm_count == 132
    assert trace.device.compute_capability == (9, 0)
    assert trace.metadata["schema_version"] == 1
    assert trace.event_count == len(synthetic_events())
    assert trace.has_gpu_activity and trace.other_device_events == 0


def test_steps_without_profiler_step_annotations(tmp_path):
    events = [e for e in synthetic_events() if not str(e.get("name", "")).startswith("ProfilerStep#")]
    trace = load_trace(write_json(tmp_path / "t.json", trace_doc(events)))
    assert trace.steps.empty and list(trace.steps.columns) == ["rank", "step", "ts_us", "dur_us", "end_us", "cut_us"]
    assert len(trace.kernels) == 4


def _profiler_span(t0: float, t1: float) -> dict:
    """The profiler's own span of its recording, as torch.profiler writes it."""
    return {
        "ph": "X",
        "cat": "Trace",
        "name": "PyTorch Profiler (0)",
        "pid": "Spans",
        "tid": "PyTorch Profiler",
        "ts": t0,
        "dur": t1 - t0,
        "args": {"Op count": 0},
    }


@pytest.mark.parametrize("checked", [False, True], ids=["fast", "checked"])
def test_a_step_that_ends_after_the_recording_is_cut_at_its_end(tmp_path, monkeypatch, checked):
    """The second step's annotation runs 13 s past everything recorded (a public trace of a compiled step did):
    it ends where the recording does, the latest end of the profiler's span and of every other event."""
    events = synthetic_events()
    for event in events:
        if event.get("name") == "ProfilerStep#4" and event["cat"] == "user_annotation":
            event["dur"] = 13e6
    events.append(_profiler_span(90.0, 460.0))
    if checked:
        monkeypatch.setattr(columns, "load_columns", lambda *args: None)
    steps = load_trace(write_json(tmp_path / "t.json", trace_doc(events))).steps
    assert steps["step"].tolist() == [3, 4]
    assert steps["end_us"].tolist() == [250.0, 460.0]
    assert steps["dur_us"].tolist() == [150.0, 160.0]
    assert steps["cut_us"].tolist() == [0.0, 13e6 - 160.0]


def test_without_the_profilers_span_no_step_is_cut(tmp_path):
    """Traces written by other tools may lack the span: the window's end is unknown, the steps stay."""
    events = synthetic_events()
    for event in events:
        if event.get("name") == "ProfilerStep#4" and event["cat"] == "user_annotation":
            event["dur"] = 13e6
    steps = load_trace(write_json(tmp_path / "t.json", trace_doc(events))).steps
    assert steps["dur_us"].tolist() == [150.0, 13e6] and steps["cut_us"].tolist() == [0.0, 0.0]


def test_a_step_inside_the_recording_keeps_its_own_end(tmp_path):
    """The profiler's span ends after the last step (on every H200 trace under sample_traces/, by 0.2 ms to 0.3 s),
    whose tail holds no other event: nothing is cut."""
    events = synthetic_events() + [_profiler_span(90.0, 480.0)]
    steps = load_trace(write_json(tmp_path / "t.json", trace_doc(events))).steps
    assert steps["end_us"].tolist() == [250.0, 450.0] and steps["cut_us"].tolist() == [0.0, 0.0]


def test_bare_event_array_is_a_trace(tmp_path, trace):
    bare = load_trace(write_json(tmp_path / "bare.json", synthetic_events()))
    assert bare.devices == [] and bare.ranks == [0]
    assert_same_tables(bare, trace)


def test_unexpected_types_load_through_the_lenient_path(tmp_path):
    events = [
        x(
            "kernel",
            "k_str",
            10,
            2,
            args={"device": "0", "correlation": "abc", "grid": [2, "x", 1], "block": [64, 1, 1]},
        ),
        x("kernel", "k_ok", 20, 2, args={"device": 0, "correlation": 5, "grid": [2, 3, 1], "block": [64, 1, 1]}),
        x("cuda_runtime", "cudaLaunchKernel", 5, 1, args={"correlation": None, "External id": "7"}),
        x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 30, 1, args={"bytes": "lots", "device": 0}),
    ]
    trace = load_trace(write_json(tmp_path / "odd.json", {"traceEvents": events}))
    k = trace.kernels
    assert list(k["name"]) == ["k_str", "k_ok"]
    assert list(k["correlation"]) == [-1, 5]  # "abc" is no number
    assert list(k["device"]) == [0, 0]
    assert list(k["grid_y"]) == [-1, 3] and list(k["blocks"]) == [-1, 6]  # an unknown dimension: unknown product
    assert list(trace.runtime["correlation"]) == [-1] and list(trace.runtime["external_id"]) == [7]
    m = trace.memcpys.iloc[0]
    assert (m["bytes"], m["direction"], m["src_kind"], m["dst_kind"]) == (-1, "DtoH", "Device", "Pinned")


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_chunked_decode_gives_the_same_tables(tmp_path, monkeypatch, trace, chunk):
    events = synthetic_events()
    assert len(events) > 3 * chunk
    path = write_json(tmp_path / "t.json", trace_doc(events))
    monkeypatch.setattr(kineto, "CHUNK_EVENTS", chunk)
    monkeypatch.setattr(columns, "load_columns", lambda *args: None)  # the checked path's chunks, not the fast path's
    chunked = load_trace(path)
    assert chunked.event_count == len(events)
    assert_same_tables(chunked, trace)


def test_chunk_with_odd_types_next_to_typed_chunks(tmp_path, monkeypatch):
    """One chunk takes the lenient path, the others the typed one: the columns still line up."""
    events = synthetic_events()
    kernel = next(i for i, e in enumerate(events) if e.get("cat") == "kernel")
    events[kernel]["args"]["correlation"] = "abc"
    path = write_json(tmp_path / "t.json", trace_doc(events))
    whole = load_trace(path)
    monkeypatch.setattr(kineto, "CHUNK_EVENTS", 3)
    chunked = load_trace(path)
    assert_same_tables(chunked, whole)
    assert list(whole.kernels["correlation"]) == [-1, 11, 20, 21]


def test_rank_folder(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    # File names sort opposite to the ranks: the rank comes from distributedInfo, not the name.
    write_json(folder / "a.json", trace_doc(rank=1))
    shifted = synthetic_events()
    for e in shifted:
        if "ts" in e:
            e["ts"] += 1.0
    with gzip.open(folder / "b.json.gz", "wt") as f:
        json.dump(trace_doc(shifted, rank=0), f)
    (folder / "notes.txt").write_text("not a trace")
    trace = load_trace(folder)
    assert trace.ranks == [0, 1]
    assert trace.metadata["world_size"] == 2
    for name in ("kernels", "memcpys", "runtime", "cpu_ops", "annotations", "steps"):
        table = getattr(trace, name)
        assert sorted(set(table["rank"])) == [0, 1], name
        assert len(table[table["rank"] == 0]) == len(table[table["rank"] == 1]), name
    rank0 = trace.for_rank(0)
    assert list(rank0.kernels["ts_us"]) == [141.0, 161.0, 341.0, 361.0]
    rank1 = trace.for_rank(1)
    assert list(rank1.kernels["ts_us"]) == [140.0, 160.0, 340.0, 360.0]
    assert list(rank1.steps["step"]) == [3, 4]


def test_json_and_gzip_give_identical_tables(tmp_path, trace):
    data = json.dumps(trace_doc()).encode()
    (tmp_path / "t.json.gz").write_bytes(gzip.compress(data))
    gz = load_trace(tmp_path / "t.json.gz")
    assert_same_tables(gz, trace)
    assert gz.size_bytes == len(data)


def gzip_member(data: bytes, level: int = 6) -> bytes:
    comp = zlib.compressobj(level, zlib.DEFLATED, 31)
    return comp.compress(data) + comp.flush()


@pytest.mark.parametrize("parts", [2, 5])
def test_concatenated_gzip_members_are_read_whole(tmp_path, trace, parts):
    data = json.dumps(trace_doc()).encode()
    cuts = [len(data) * i // parts for i in range(parts + 1)]
    members = b"".join(gzip_member(data[a:b]) for a, b in zip(cuts, cuts[1:]))
    path = tmp_path / "multi.json.gz"
    path.write_bytes(members)
    assert gzip.decompress(members) == data
    assert kineto.read_trace_bytes(path) == data
    assert_same_tables(load_trace(path), trace)


def test_gzip_member_boundary_on_a_read_boundary(tmp_path, monkeypatch):
    data = json.dumps(trace_doc()).encode()
    first = gzip_member(data[:1000])
    path = tmp_path / "multi.json.gz"
    path.write_bytes(first + gzip_member(data[1000:]))
    for size in (len(first), len(first) + 3, len(first) - 3):
        monkeypatch.setattr(kineto, "_CHUNK", size)
        assert kineto.read_trace_bytes(path) == data, size


# Multi-member bombs: every member is small and legitimate on its own; the guard must still refuse
# once the output passes RATIO_CHECK_AFTER_BYTES at a ratio above MAX_GZIP_RATIO, not after inflating
# everything that one read brought in.
BOMB_MIB = 128


def bomb_peak_bytes(path: Path) -> tuple[str, int]:
    tracemalloc.start()
    try:
        with pytest.raises(BadInputError) as caught:
            kineto.read_trace_bytes(path)
        return str(caught.value), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_multi_member_bomb_is_refused_early(tmp_path, monkeypatch):
    monkeypatch.setattr(kineto, "RATIO_CHECK_AFTER_BYTES", 1 << 20)
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip_member(b'{"traceEvents": [') + gzip_member(b" " * (1 << 20), 9) * BOMB_MIB)
    message, peak = bomb_peak_bytes(path)
    assert "bomb" in message
    assert peak < (BOMB_MIB << 20) // 4, f"{peak / 2**20:.0f} MiB held before refusing"


def test_multi_member_non_json_is_refused_early(tmp_path, monkeypatch):
    monkeypatch.setattr(kineto, "RATIO_CHECK_AFTER_BYTES", 1 << 20)
    path = tmp_path / "zeros.json.gz"
    path.write_bytes(gzip_member(b"\0" * (1 << 20), 9) * BOMB_MIB)
    message, peak = bomb_peak_bytes(path)
    assert "not a JSON trace" in message or "bomb" in message
    assert peak < (BOMB_MIB << 20) // 4, f"{peak / 2**20:.0f} MiB held before refusing"


def test_events_of_unmodelled_accelerators_are_counted(tmp_path):
    events = synthetic_events() + [x("mtia_kernel", "m", 5, 1), x("mtia_runtime", "r", 6, 1)]
    trace = load_trace(write_json(tmp_path / "t.json", trace_doc(events)))
    assert trace.other_device_events == 2
    assert len(trace.kernels) == 4


def test_nan_free_times(trace):
    for name in ("kernels", "memcpys", "runtime", "cpu_ops", "annotations"):
        table: pd.DataFrame = getattr(trace, name)
        assert not any(math.isnan(v) for v in table["ts_us"]), name

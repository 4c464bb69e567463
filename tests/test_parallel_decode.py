"""The fast reader (gpuadvisor.trace.columns): byte-level split, per-piece columns, the forked worker.

Every test compares against the checked path (kineto's raw pass and lenient structs), which the fast path
must match table for table, dtypes included."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from pandas.testing import assert_frame_equal

from gpuadvisor.trace import columns, kineto
from gpuadvisor.trace.kineto import load_trace

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "llama_decode.json.gz"
TABLES = ("kernels", "memcpys", "runtime", "cpu_ops", "annotations", "syncs", "python_frames", "steps")


def x(cat: str, name: str, ts: float, dur: float, tid=1, args: dict | None = None) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur}
    if args is not None:
        event["args"] = args
    return event


def events(steps: int = 6, odd_name: str = "") -> list[dict]:
    out: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}}]
    for i in range(steps):
        t0, corr, ext = 100.0 + 200 * i, 10 * (i + 1), 100 + i
        mm = {"External id": ext, "Input Dims": [[4, 8], [8, 16]], "Input type": ["float", "float"], "flops": 1024}
        gemm = {"device": 0, "stream": 7, "correlation": corr, "External id": ext}
        gemm.update(grid=[4, 2, 3], block=[128, 2, 1])
        out += [
            x("user_annotation", f"ProfilerStep#{i}", t0, 150.0),
            x("gpu_user_annotation", f"ProfilerStep#{i}", t0 + 20, 100.0, tid=7),
            x("cpu_op", "aten::mm" + odd_name, t0 + 5, 30.0, args=mm),
            x("python_function", f"model.py(12): forward{odd_name}", t0 + 1, 60, tid="11"),
            x("cuda_runtime", "cudaLaunchKernel", t0 + 10, 4.0, args={"correlation": corr, "External id": ext}),
            x("cuda_driver", "cuLaunchKernel", t0 + 10, 2.0, args={"correlation": corr + 1, "External id": ext}),
            x("kernel", "gemm_kernel" + odd_name, t0 + 40, 12.5, tid=7, args=gemm),
            x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t0 + 80, 6.0, tid=7, args={"bytes": 4096, "device": 0}),
            x("gpu_memset", "Memset (Device)", t0 + 80, 0.5, tid=7, args={"bytes": 256, "device": 0}),
            x("cuda_sync", "Stream Sync", t0 + 110, 3.0, tid=7, args={"stream": 7, "correlation": corr + 4}),
            {"ph": "s", "id": corr, "pid": 0, "tid": 1, "ts": t0 + 10, "cat": "ac2g", "name": "ac2g"},
        ]
    return out


def write(path: Path, evs: list[dict], **more) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, **more.pop("head", {}), "traceEvents": evs, **more}, indent=1))
    return path


def checked(path: Path, monkeypatch):
    """The tables of the checked path (the fast path turned off)."""
    with monkeypatch.context() as m:
        m.setattr(columns, "load_columns", lambda *args: None)
        return load_trace(path)


def assert_same(a, b) -> None:
    for name in TABLES:
        assert_frame_equal(getattr(a, name), getattr(b, name), check_dtype=True, obj=name)
    for name in ("event_count", "size_bytes", "other_device_events", "devices", "ranks", "metadata"):
        assert getattr(a, name) == getattr(b, name), name
    for col in ("input_dims_raw", "input_types_raw"):
        assert [bytes(r) for r in a.cpu_ops[col]] == [bytes(r) for r in b.cpu_ops[col]]


def fast(path: Path) -> bool:
    return columns.load_columns(kineto.read_trace_bytes(path), path, 0) is not None


@pytest.mark.parametrize("chunk_bytes", [1, 300, 2000, 1 << 30])
def test_pieces_give_the_checked_tables(tmp_path, monkeypatch, chunk_bytes):
    path = write(tmp_path / "t.json", events())
    monkeypatch.setattr(columns, "CHUNK_BYTES", chunk_bytes)
    assert fast(path)
    assert_same(load_trace(path), checked(path, monkeypatch))


def test_cuts_never_land_inside_strings(tmp_path, monkeypatch):
    """Names holding the "}, {" the splitter looks for: a cut there fails to decode, and the reader falls back."""
    path = write(tmp_path / "t.json", events(odd_name='"}, {"x": 1}, {'))
    for chunk_bytes in (1, 50, 333, 1000):
        monkeypatch.setattr(columns, "CHUNK_BYTES", chunk_bytes)
        assert_same(load_trace(path), checked(path, monkeypatch))


def test_keys_after_the_events_and_nested_lookalikes(tmp_path, monkeypatch):
    logs = ["INFO ... ] Traces Recorded:", "]"]
    head = {"deviceProperties": [{"id": 0, "name": "GPU", "traceEvents": [{"cat": "kernel"}]}]}
    path = write(tmp_path / "t.json", events(), head=head, traceName="x]", logs=logs, baseTimeNanoseconds=1)
    monkeypatch.setattr(columns, "CHUNK_BYTES", 500)
    assert_same(load_trace(path), checked(path, monkeypatch))
    plain = write(tmp_path / "p.json", events(), traceName="x]", logs=logs)
    assert fast(plain)


def test_unusual_files_take_the_checked_path(tmp_path, monkeypatch):
    odd = events()
    odd[5]["args"] = {"correlation": "abc"}  # the lenient structs' job
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(events()))  # a bare event array
    for path in (write(tmp_path / "odd.json", odd), bare):
        assert not fast(path)
        assert_same(load_trace(path), checked(path, monkeypatch))


@pytest.fixture
def parallel(monkeypatch):
    """Force the forked worker on small traces."""
    monkeypatch.setattr(columns, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(columns, "CHUNK_BYTES", 64 * 1024)


def test_forked_worker_gives_the_same_tables(tmp_path, monkeypatch, parallel):
    path = tmp_path / "llama.json"
    path.write_bytes(gzip.decompress(SAMPLE.read_bytes()))
    calls = []
    real = columns.ForkedCall
    monkeypatch.setattr(columns, "ForkedCall", lambda fn: calls.append(1) or real(fn))
    together = load_trace(path)
    assert calls, "the worker was not used"
    monkeypatch.setattr(columns, "PARALLEL_MIN_BYTES", 1 << 60)
    assert_same(together, load_trace(path))
    assert_same(together, checked(path, monkeypatch))


def test_small_traces_do_not_fork(monkeypatch):
    monkeypatch.setattr(columns, "ForkedCall", None)  # calling it would fail
    assert len(load_trace(SAMPLE).kernels) == 1308


def test_a_failing_worker_is_replaced_by_the_parent(tmp_path, monkeypatch, parallel):
    path = tmp_path / "llama.json"
    path.write_bytes(gzip.decompress(SAMPLE.read_bytes()))
    expected = checked(path, monkeypatch)

    def dies(data, pieces):
        return lambda: os.kill(os.getpid(), signal.SIGKILL)

    def raises(data, pieces):
        def job():
            raise MemoryError("no room")

        return job

    for job in (dies, raises):
        monkeypatch.setattr(columns, "_worker_job", job)
        assert_same(load_trace(path), expected)


def test_odd_types_in_the_workers_half(tmp_path, monkeypatch, parallel):
    evs = events(steps=400)
    evs[-5]["args"] = {"stream": "seven"}
    path = write(tmp_path / "t.json", evs)
    monkeypatch.setattr(columns, "CHUNK_BYTES", 4096)
    assert not fast(path)
    assert_same(load_trace(path), checked(path, monkeypatch))


def test_interrupt_kills_and_reaps_the_worker(tmp_path, monkeypatch, parallel):
    path = write(tmp_path / "t.json", events(steps=400))
    monkeypatch.setattr(columns, "CHUNK_BYTES", 4096)
    parent = os.getpid()
    pid_file = tmp_path / "worker.pid"

    def decode(data, pieces, pools):
        if os.getpid() == parent:
            time.sleep(0.3)
            raise KeyboardInterrupt
        pid_file.write_text(str(os.getpid()))
        time.sleep(60)

    monkeypatch.setattr(columns, "_decode_pieces", decode)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        load_trace(path)
    assert time.monotonic() - start < 20
    worker = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped: no such process, not even a zombie
        os.kill(worker, 0)


def test_cli_ctrl_c_during_a_parallel_decode_exits_130_quietly(tmp_path):
    """Ctrl-C reaches the CLI and its worker alike: one line, exit 130, no traceback from either process."""
    path = tmp_path / "llama.json"
    path.write_bytes(gzip.decompress(SAMPLE.read_bytes()))
    script = textwrap.dedent(
        """
        import sys, time
        from gpuadvisor.trace import columns
        columns.PARALLEL_MIN_BYTES, columns.CHUNK_BYTES = 0, 64 * 1024
        real = columns.piece_columns
        def slow(*args):
            time.sleep(0.2)
            return real(*args)
        columns.piece_columns = slow
        sys.argv = ["gpuadvisor", "analyze", sys.argv[1], "--format", "json"]
        from gpuadvisor.cli import main
        main()
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUADVISOR_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    time.sleep(2.5)  # imports (~1 s), then into the decode (~7 s with the sleeps; the worker has started)
    os.killpg(proc.pid, signal.SIGINT)  # as the terminal does: the whole process group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert out == ""

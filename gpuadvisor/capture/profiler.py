"""Record a Kineto trace of a few steps of a workload with ``torch.profiler``.

The profiler slows an eager step down (3.2x for the Llama decode step on the H200, DESIGN.md
"Measuring"), so step times never come from here: this module only records what runs, with shapes
and FLOPs, for the analyses. Torch is imported inside the functions, never at import time.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from gpuadvisor.errors import BadInputError
from gpuadvisor.interrupt import deferred
from gpuadvisor.outputs import file_mode

if TYPE_CHECKING:
    from gpuadvisor.workload import Workload

# zlib level 6 is within a few % of level 9 on Kineto JSON and several times faster on large traces.
_GZIP_LEVEL = 6


def warm_up(workload: Workload, steps: int) -> None:
    """Run ``steps`` steps (allocator, cuBLAS handles, autotuning, lazy init) and wait for the GPU once."""
    import torch

    for _ in range(steps):
        workload.step_fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def record_trace(
    workload: Workload,
    out_path: Path,
    *,
    wait: int = 1,
    warmup: int = 2,
    active: int = 3,
    with_stack: bool = True,
) -> Path:
    """Profile ``wait + warmup + active`` steps and write the ``active`` ones as a gzipped Chrome trace.

    Each step runs inside the profiler's ``ProfilerStep#N`` annotation (``prof.step()`` opens the next
    one). Nothing synchronizes inside a step, so the trace shows the step as it runs unprofiled;
    the GPU is synchronized once, after the last step. CUDA activities are recorded when CUDA is
    available, otherwise the trace is CPU-only. The file is written to a temporary name in the same
    folder and renamed into place: an error or Ctrl-C leaves no half-written trace. Returns ``out_path``.
    """
    import torch

    for name, value, least in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise BadInputError(f"profiler schedule: {name} must be an int >= {least}, got {value!r}")
    out_path = Path(out_path)
    if not out_path.parent.is_dir():
        raise BadInputError(f"{out_path.parent}: no such folder for the trace")

    cuda = torch.cuda.is_available()
    with warnings.catch_warnings():
        # torch 2.11 warns that a schedule's events are cleared after each cycle; this records one cycle.
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        prof = _profile_steps(workload, cuda, wait=wait, warmup=warmup, active=active, with_stack=with_stack)
    _export_gzipped(prof, out_path)
    return out_path


def _profile_steps(workload: Workload, cuda: bool, *, wait: int, warmup: int, active: int, with_stack: bool):
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        record_shapes=True,
        with_flops=True,
        with_stack=with_stack,
    )
    # The profiler starts and stops inside prof.step() (at the schedule's transitions); only those calls run
    # with Kineto's log lines filtered from stderr, never the user's steps.
    # The profiler's transitions run with Ctrl-C held until they finish (interrupt.deferred): an interrupt that
    # lands inside Kineto's start or stop, or while stderr is redirected around it, left a half-stopped
    # profiler behind, and about 1 run in 20 then aborted (SIGABRT) with stderr still redirected.
    try:
        with deferred(), _without_kineto_log():
            prof.__enter__()
        for _ in range(wait + warmup + active):
            workload.step_fn()
            with deferred(), _without_kineto_log():
                prof.step()
        # prof.step() after the last active step already stopped the recording (the profiler waits for
        # the device as it stops); this makes sure nothing of the workload is still running afterwards.
        if cuda:
            torch.cuda.synchronize()
    except BaseException:
        # The step failed, or Ctrl-C landed anywhere, even inside prof.__enter__() or prof.step() while the
        # profiler was half started or stopped: its own __exit__ may then fail too ("AssertionError: Profiler
        # must be initialized before starting trace"). Stop it as far as it goes; the first error is the one
        # to report.
        try:
            with deferred(), _without_kineto_log():
                prof.__exit__(*sys.exc_info())
        except Exception:  # noqa: BLE001 - secondary to the error being raised
            pass
        raise
    with deferred(), _without_kineto_log():
        prof.__exit__(None, None, None)
    return prof


# Kineto's own log lines ("USDT:2026-11-29 10:57:00 31895:31895 SyncActivityProfilerHandler.cpp:52]
# profiler_start"): torch 2.13 prints them on stderr whatever KINETO_LOG_LEVEL says, which would break the
# CLI's one-line error output. Warnings and errors from Kineto are passed through.
_KINETO_LOG_LINE = re.compile(rb"^(USDT|INFO|VERBOSE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ [\w.]+:\d+\] ")


@contextmanager
def _without_kineto_log() -> Iterator[None]:
    """Run the body with file descriptor 2 captured; then write back what it printed, less Kineto's log lines."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no usable stderr: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if not _KINETO_LOG_LINE.match(line)]
            if kept:
                os.write(2, b"".join(kept))


def _export_gzipped(prof, out_path: Path) -> None:
    """Export the Chrome trace, add FLOPs, gzip it to ``out_path`` through temporary files in the same folder."""
    folder = out_path.parent
    json_fd, json_tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".json", dir=folder)
    os.close(json_fd)
    gz_tmp = None
    try:
        prof.export_chrome_trace(json_tmp)
        with open(json_tmp, "rb") as source:
            text = source.read()
        try:
            trace = json.loads(text)
        except ValueError:
            trace = None  # keep what the profiler wrote, without the additions below
        if isinstance(trace, dict):
            _add_flops(trace, prof)
            if "traceName" in trace:
                trace["traceName"] = out_path.name  # not the temporary file's name
            text = json.dumps(trace, separators=(",", ":")).encode()

        gz_fd, gz_tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=folder)
        with os.fdopen(gz_fd, "wb") as raw:
            # filename="" and mtime=0: no temporary name or date in the header, same bytes for the same trace.
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=_GZIP_LEVEL, mtime=0) as target:
                target.write(text)
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(gz_tmp, file_mode())  # mkstemp makes files private; a trace is meant to be shared
        os.replace(gz_tmp, out_path)
        gz_tmp = None
    finally:
        _remove(json_tmp)
        if gz_tmp is not None:
            _remove(gz_tmp)


def _add_flops(trace: dict, prof) -> int:
    """Write the profiler's FLOP counts into the trace: ``args["flops"]`` of each operator that has one.

    ``with_flops=True`` counts FLOPs of matmuls, convolutions and a few elementwise operators from their
    input shapes, but torch (2.11 to 2.13 at least) leaves them out of the exported Chrome trace. An
    operator's ``External id`` in the trace is its correlation id in the profiler's own events.
    Returns how many operators got a count.
    """
    flops_by_op = {(event.id, event.name): event.flops for event in prof.events() if event.flops}
    added = 0
    for event in trace.get("traceEvents") or ():
        if not isinstance(event, dict) or event.get("cat") != "cpu_op":
            continue
        args = event.get("args")
        if not isinstance(args, dict) or "flops" in args:
            continue
        flops = flops_by_op.get((args.get("External id"), event.get("name")))
        if flops:
            args["flops"] = flops
            added += 1
    return added


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass

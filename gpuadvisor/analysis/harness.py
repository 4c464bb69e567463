"""Runtime calls of the profiling harness, not of the user's step.

The code that drives the profiler (``with torch.profiler.profile(...)``, ``prof.step()``, a final
``torch.cuda.synchronize()`` before export) issues CUDA runtime calls of its own. On a public H100 trace of a
transformers pipeline, a ``cudaDeviceSynchronize`` in ``profiling/profile.py:34 (run_torch_profiler)`` made
GA401 report 58% of the (whole-trace) step. A runtime call is the harness's when

1. the trace has ProfilerStep windows and the call lies outside all of them; or
2. the profiler itself is on its Python stack (a ``torch/profiler/`` or ``torch/autograd/profiler.py`` frame
   encloses it: the sync ``prof.step()`` issues when it stops the recording); or
3. no operator issued it (no aten op shares its External id: an explicit ``torch.cuda.synchronize()``, not a
   ``.item()``), and its innermost frame outside torch is a *profiler-driving function*: one that directly
   calls into torch.profiler (the innermost non-torch frame enclosing some profiler frame).

A call in the user's step is never the harness's by its file name: a ``profile.py`` that defines the step
keeps its syncs, because its function does not drive the profiler. Library frames other than torch's
(transformers, ...) count as the user's: their calls stay the user's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuadvisor.trace.model import Trace

# Frames that are the profiler's own code.
_PROFILER_FRAME = r"(?:^|/)torch/(?:profiler/|autograd/profiler\.py)"
# Frames of torch itself, builtins and the standard library: skipped when looking for a call's caller.
_TORCH_FRAME = r"(?:^|/)torch/|^<built-in|<frozen|/lib/python\d[\d.]*/(?!site-packages|dist-packages)|^contextlib\.py"


def harness_runtime(trace: Trace) -> np.ndarray:
    """A bool per row of ``trace.runtime``: True where the call is the harness's (rules 2 and 3 of the module
    docstring; rule 1 depends on the step windows, see :func:`harness_calls`). Cached on the trace."""
    cached = trace.__dict__.get("_harness_runtime")
    if cached is not None and len(cached) == len(trace.runtime):
        return cached
    rt = trace.runtime
    mask = np.zeros(len(rt), dtype=bool)
    frames = trace.python_frames
    if len(rt) and len(frames):
        mask = _stack_harness(trace, rt, frames)
    trace.__dict__["_harness_runtime"] = mask
    return mask


def harness_calls(trace: Trace, calls: pd.DataFrame) -> np.ndarray:
    """For rows of ``calls`` (a subset of ``trace.runtime`` with its index and a step_index column): True where
    the call is the harness's (all three rules)."""
    if not len(calls):
        return np.zeros(0, dtype=bool)
    by_stack = pd.Series(harness_runtime(trace), index=trace.runtime.index)
    mask = np.array(by_stack.reindex(calls.index, fill_value=False).to_numpy(bool), dtype=bool)
    if len(trace.steps):
        mask |= calls["step_index"].to_numpy() < 0
    return mask


def _stack_harness(trace: Trace, rt: pd.DataFrame, frames: pd.DataFrame) -> np.ndarray:
    from gpuadvisor.analysis.linking import LAUNCH_CALL_PATTERN, SYNC_CALL_PATTERN, match_names, union_intervals

    mask = np.zeros(len(rt), dtype=bool)
    names = frames["name"].astype(str)
    is_profiler = names.str.contains(_PROFILER_FRAME, regex=True).to_numpy()
    if not is_profiler.any():
        return mask
    is_torch = names.str.contains(_TORCH_FRAME, regex=True).to_numpy() | is_profiler
    ts = frames["ts_us"].to_numpy(float)
    end = frames["end_us"].to_numpy(float)
    tid = frames["tid"].astype(str).to_numpy(object)
    name_arr = names.to_numpy(object)
    # Per thread, the frames outside torch sorted by start (a call's caller is the innermost open one).
    callers: dict[str, np.ndarray] = {}
    for t in np.unique(tid[~is_torch]):
        rows = np.flatnonzero((tid == t) & ~is_torch)
        callers[t] = rows[np.argsort(ts[rows], kind="stable")]

    def caller(t: str, at: float, until: float, skip: int = -1) -> int:
        rows = callers.get(t)
        if rows is None:
            return -1
        rows = rows[: np.searchsorted(ts[rows], at, side="right")]
        rows = rows[(end[rows] >= until) & (rows != skip)]
        return int(rows[-1]) if len(rows) else -1

    # Profiler-driving functions: the innermost non-torch frame enclosing a profiler frame (by name: the same
    # function may drive the profiler in several calls).
    drivers = set()
    for i in np.flatnonzero(is_profiler):
        c = caller(tid[i], ts[i], end[i])
        if c >= 0:
            drivers.add(str(name_arr[c]))
    # Only the calls the step figures count (syncs and launches) are looked at.
    rt_names = rt["name"]
    wanted = match_names(rt_names, SYNC_CALL_PATTERN) | match_names(rt_names, LAUNCH_CALL_PATTERN)
    rt_ts = rt["ts_us"].to_numpy(float)
    rt_tid = rt["tid"].astype(str).to_numpy(object)
    # Rule 2: inside a profiler frame of the same thread.
    for t in np.unique(tid[is_profiler]):
        rows = np.flatnonzero(is_profiler & (tid == t))
        starts, ends = union_intervals(ts[rows], end[rows])
        on = np.flatnonzero(wanted & (rt_tid == t))
        k = np.searchsorted(starts, rt_ts[on], side="right") - 1
        inside = (k >= 0) & (rt_ts[on] <= ends[np.maximum(k, 0)])
        mask[on[inside]] = True
    # Rule 3: no operator issued it and its caller drives the profiler.
    ops = trace.cpu_ops
    keys = set(zip(ops["rank"].tolist(), ops["external_id"].tolist())) if len(ops) else set()
    ranks = rt["rank"].tolist()
    external = rt["external_id"].tolist()
    for j in np.flatnonzero(wanted & ~mask):
        if (ranks[j], external[j]) in keys:
            continue
        c = caller(rt_tid[j], rt_ts[j], rt_ts[j])
        if c >= 0 and str(name_arr[c]) in drivers:
            mask[j] = True
    return mask


def harness_note(trace: Trace, excluded: pd.DataFrame, frames: pd.DataFrame) -> str | None:
    """One line for the report: the harness's syncs the step figures and findings left out, or None."""
    if not len(excluded):
        return None
    from gpuadvisor.analysis.timeline import call_sources

    where = call_sources(frames, excluded["ts_us"], excluded["tid"], [None] * len(excluded), max_lookups=20)
    by_call: dict[str, int] = {}
    for name, loc in zip(excluded["name"], where):
        label = f"{name} at {loc}" if loc else str(name)
        by_call[label] = by_call.get(label, 0) + 1
    listed = "; ".join(f"{label} x{count}" for label, count in sorted(by_call.items(), key=lambda kv: -kv[1])[:3])
    return (
        f"{len(excluded)} host sync(s) ({excluded['dur_us'].sum():,.0f} µs blocked) issued by the profiling harness "
        f"(by the profiler itself, or by the function that drives it), not by the step, were left out of the step "
        f"figures and findings: {listed}"
    )

"""Where each step's time goes: GPU busy, and GPU idle split by what it waited for.

A step's window runs from its start (the ProfilerStep annotation, or the end of the previous step's GPU
work when the GPU is still busy with it) to the later of the annotation's end and the end of the GPU
work launched inside the step. Inside the window, the GPU is busy where any kernel, memcpy or memset
runs (any stream), and idle elsewhere. Each idle gap is classified by what ended it:

- ``sync``: a host synchronization (cudaStreamSynchronize, cudaDeviceSynchronize, a synchronous
  cudaMemcpy, ...) returned inside the gap: the host waited for the GPU to drain, then the GPU waited
  for the host to queue new work;
- ``launch``: the work that ended the gap was launched after the gap began: the GPU waited for the CPU;
- ``other``: the work was already queued (waits on events, other streams, dependencies), or the host spent at
  least half of the gap inside CUDA calls of :data:`LONG_HOST_CALL_US` or more that neither launch a graph nor
  synchronize (:func:`long_host_calls`): creating the context, loading a kernel's module on its first launch,
  cudaMalloc and cudaFree. A launch takes microseconds; a CUDA graph does not remove those calls' time.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpuadvisor.analysis.linking import (
    LAUNCH_CALL_PATTERN,
    SYNC_CALL_PATTERN,
    assign_steps,
    factorize_names,
    gpu_activities,
    match_names,
    step_windows,
    union_intervals,
)
from gpuadvisor.trace.model import Trace

# A host CUDA call this long that neither synchronizes nor replays a graph is start-up or allocation work, not
# launch overhead: an eager launch call took a median of 7 to 11 µs and at most 150 µs in the H200 traces under
# sample_traces/ (none of them has a non-sync call of 1 ms, bar input_pipeline's pageable copies). A public
# trace of a first forward pass spent 29.9 s in cudaDeviceGetStreamPriorityRange (the context's creation),
# 6.0 s in one cudaFree and 3.1 s in one cudaLaunchKernel (its module's loading) while the GPU sat idle.
LONG_HOST_CALL_US = 1000.0
_NOT_LONG_CALLS = SYNC_CALL_PATTERN + r"|GraphLaunch"

# A sync call that returns within this many µs before the GPU went idle still explains the gap: the
# call's end and the last kernel's end are recorded by different clocks (host vs CUPTI).
SYNC_SLACK_US = 2.0

STEP_COLUMNS = [
    "step",
    "start_us",
    "end_us",
    "step_time_us",
    "gpu_busy_us",
    "gpu_busy_pct",
    "idle_launch_us",
    "idle_sync_us",
    "idle_other_us",
    "kernels",
    "memcpys",
    "host_syncs",
    "launch_calls",
    "launch_call_us",
    "kernels_shorter_than_launch",
    "median_queue_depth",
]


def _calls_matching(trace: Trace, pattern: str, harness: bool = False) -> pd.DataFrame:
    """The runtime calls matching ``pattern``: the step's (``harness`` False) or the profiling harness's
    (:mod:`gpuadvisor.analysis.harness` says which are)."""
    from gpuadvisor.analysis.harness import harness_calls

    rt = trace.runtime
    if not len(rt):
        return rt.assign(step_index=pd.Series(dtype=np.int64))
    calls = rt[match_names(rt["name"], pattern)].copy()
    calls["step_index"] = assign_steps(calls["ts_us"].to_numpy(), step_windows(trace))
    mask = harness_calls(trace, calls)
    return calls[mask if harness else ~mask]


def sync_calls(trace: Trace, harness: bool = False) -> pd.DataFrame:
    """Host calls that block on the GPU, issued in the step (``harness`` True: those the profiling harness
    issued, which the step figures leave out). Columns as ``trace.runtime`` plus step_index."""
    return _calls_matching(trace, SYNC_CALL_PATTERN, harness)


def launch_calls(trace: Trace) -> pd.DataFrame:
    """Host calls that launch GPU work, issued in the step. Columns as ``trace.runtime`` plus step_index."""
    return _calls_matching(trace, LAUNCH_CALL_PATTERN)


def long_host_calls(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The union (sorted starts, ends) of the host's CUDA calls of :data:`LONG_HOST_CALL_US` or more that neither
    synchronize nor launch a graph (module docstring); empty arrays when there are none."""
    rt = trace.runtime
    if not len(rt):
        return np.empty(0), np.empty(0)
    dur = rt["dur_us"].to_numpy(float)
    long = np.nan_to_num(dur, nan=0.0) >= LONG_HOST_CALL_US
    if not long.any():
        return np.empty(0), np.empty(0)
    long &= ~match_names(rt["name"], _NOT_LONG_CALLS)
    return union_intervals(rt["ts_us"].to_numpy(float)[long], rt["end_us"].to_numpy(float)[long])


def _covered(starts: np.ndarray, ends: np.ndarray, gap_s: np.ndarray, gap_e: np.ndarray) -> np.ndarray:
    """Per gap, how much of it the disjoint sorted intervals (starts, ends) cover."""
    if not len(starts) or not len(gap_s):
        return np.zeros(len(gap_s))
    before = np.concatenate(([0.0], np.cumsum(ends - starts)))

    def upto(t: np.ndarray) -> np.ndarray:
        # Covered length in (-inf, t]: the whole intervals that end before t, plus the part of the one holding t.
        i = np.searchsorted(starts, t, side="right")
        last = np.maximum(i - 1, 0)
        partial = np.where(i > 0, np.clip(t - starts[last], 0.0, ends[last] - starts[last]), 0.0)
        return before[last] + partial

    return np.clip(upto(gap_e) - upto(gap_s), 0.0, None)


def queue_depth_at_launch(acts: pd.DataFrame) -> np.ndarray:
    """For each activity, how many earlier-launched activities were still queued or running at its launch."""
    launch = acts["launch_ts_us"].to_numpy()
    known = ~np.isnan(launch)
    depth = np.full(len(acts), np.nan)
    if not known.any():
        return depth
    launched_sorted = np.sort(launch[known])
    ended_sorted = np.sort(acts["end_us"].to_numpy()[known])
    lk = launch[known]
    launched_before = np.searchsorted(launched_sorted, lk, side="left")
    ended_before = np.searchsorted(ended_sorted, lk, side="right")
    depth[known] = np.maximum(launched_before - ended_before, 0)
    return depth


def _busy_intervals(acts: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The union of the activities' intervals (starts, ends, sorted) and, for each busy interval, the end of
    the launch call of the activity that opens it (NaN unknown): it tells whether the GPU waited for it."""
    busy_s, busy_e = union_intervals(acts["ts_us"].to_numpy(float), acts["end_us"].to_numpy(float))
    if len(acts):
        order = np.argsort(acts["ts_us"].to_numpy(float), kind="stable")
        sorted_ts = acts["ts_us"].to_numpy(float)[order]
        sorted_launch_end = (acts["launch_ts_us"] + acts["launch_dur_us"]).to_numpy(float)[order]
        first_idx = np.searchsorted(sorted_ts, busy_s, side="left")
        opener_launch_end = sorted_launch_end[np.minimum(first_idx, len(sorted_ts) - 1)]
    else:
        opener_launch_end = np.empty(0)
    return busy_s, busy_e, opener_launch_end


def _window_gaps(
    w0: float,
    w1: float,
    busy_s: np.ndarray,
    busy_e: np.ndarray,
    opener_launch_end: np.ndarray,
    sync_ends: np.ndarray,
    long_calls: tuple[np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Inside the window [w0, w1]: the busy intervals clipped to it (bs, be), the idle gaps (gap_s, gap_e: one
    before each busy interval and the tail, possibly empty), and per gap whether a host sync returned in it
    (after_sync) or, if not, whether the GPU waited for the launch of the work that ended it and the host spent
    less than half of the gap in long CUDA calls (``long_calls``: :func:`long_host_calls`) (waited_for_launch);
    a gap that is neither is "other" (module docstring)."""
    lo = np.searchsorted(busy_e, w0, side="right")
    hi = np.searchsorted(busy_s, w1, side="left")
    bs = np.clip(busy_s[lo:hi], w0, w1)
    be = np.clip(busy_e[lo:hi], w0, w1)
    # Gaps: before each busy interval, and the tail (no opener: host time after the last launch).
    gap_s = np.concatenate(([w0], be))
    gap_e = np.concatenate((bs, [w1]))
    openers = np.concatenate((opener_launch_end[lo:hi], [np.nan]))
    j = np.searchsorted(sync_ends, gap_s - SYNC_SLACK_US, side="left")
    after_sync = np.zeros(len(gap_s), dtype=bool)
    ok = j < len(sync_ends)
    after_sync[ok] = sync_ends[j[ok]] <= gap_e[ok]
    waited_for_launch = ~after_sync & (np.isnan(openers) | (openers >= gap_s))
    if len(long_calls[0]) and waited_for_launch.any():
        in_calls = _covered(long_calls[0], long_calls[1], gap_s, gap_e)
        waited_for_launch &= ~(in_calls >= 0.5 * (gap_e - gap_s))
    return bs, be, gap_s, gap_e, after_sync, waited_for_launch


def step_breakdown(
    trace: Trace,
    acts: pd.DataFrame | None = None,
    syncs: pd.DataFrame | None = None,
    launches: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per step. Columns (µs unless named otherwise):

    step, start_us, end_us (the step's window), step_time_us, gpu_busy_us, gpu_busy_pct (%),
    idle_launch_us, idle_sync_us, idle_other_us (idle split; the three add up to step - busy),
    kernels, memcpys (counts launched in the step, memsets included in memcpys), host_syncs (count),
    launch_calls (count), launch_call_us (host time inside launch calls), kernels_shorter_than_launch
    (count of kernels that ran shorter than their own launch call), median_queue_depth (activities
    queued ahead of each launch, median).
    """
    if acts is None:
        acts = gpu_activities(trace)
    steps = step_windows(trace)
    if not len(steps):
        return pd.DataFrame({c: [] for c in STEP_COLUMNS})
    busy_s, busy_e, opener_launch_end = _busy_intervals(acts)
    if syncs is None:
        syncs = sync_calls(trace)
    sync_ends = np.sort(syncs["end_us"].to_numpy(float)) if len(syncs) else np.empty(0)
    long_calls = long_host_calls(trace)
    if launches is None:
        launches = launch_calls(trace)
    sync_step = syncs["step_index"].to_numpy() if len(syncs) else np.empty(0, dtype=np.int64)
    launch_step = launches["step_index"].to_numpy() if len(launches) else np.empty(0, dtype=np.int64)
    launch_dur = launches["dur_us"].to_numpy(float) if len(launches) else np.empty(0)
    act_ts = acts["ts_us"].to_numpy(float)
    act_end = acts["end_us"].to_numpy(float)
    depth = queue_depth_at_launch(acts)
    acts_step = acts["step_index"].to_numpy()
    is_kernel = (acts["kind"] == "kernel").to_numpy()
    shorter = is_kernel & (acts["dur_us"].to_numpy(float) < acts["launch_dur_us"].to_numpy(float))

    # Each step's rows as a slice of a stable sort by step (rows stay in table order inside a step, so sums
    # add the same numbers in the same order as boolean masks did, at O(n) in all instead of O(n) per step).
    acts_by_step = _rows_by_step(acts_step, len(steps))
    sync_by_step = _rows_by_step(sync_step, len(steps))
    launch_by_step = _rows_by_step(launch_step, len(steps))
    rows = []
    prev_gpu_end = prev_w1 = -np.inf
    for i, (step, s0, s1) in enumerate(zip(steps["step"], steps["ts_us"], steps["end_us"])):
        mine = acts_by_step[i]
        gpu_start = act_ts[mine].min() if len(mine) else np.inf
        gpu_end = act_end[mine].max() if len(mine) else -np.inf
        w1 = max(s1, gpu_end)
        # Windows tile the timeline: a step starts no earlier than the previous one ended. An activity of this
        # step on another stream can start while the previous step's work still runs; measured on two H200s
        # with the DDP example, that stretched a rank's steps to 50.2 and 70.7 ms where the ranks ran in
        # lockstep at about 32 ms a step.
        w0 = min(max(s0, min(prev_gpu_end, gpu_start), prev_w1), w1)
        prev_gpu_end = max(prev_gpu_end, gpu_end)
        prev_w1 = max(prev_w1, w1)
        bs, be, gap_s, gap_e, after_sync, waited_for_launch = _window_gaps(
            w0, w1, busy_s, busy_e, opener_launch_end, sync_ends, long_calls
        )
        busy = float((be - bs).sum())
        length = np.clip(gap_e - gap_s, 0, None)
        idle = {
            "sync": float(length[after_sync].sum()),
            "launch": float(length[waited_for_launch].sum()),
            "other": float(length[~after_sync & ~waited_for_launch].sum()),
        }
        step_time = w1 - w0
        in_launches = launch_by_step[i]
        step_depth = depth[mine] if len(depth) else np.empty(0)
        step_depth = step_depth[~np.isnan(step_depth)]
        rows.append(
            {
                "step": int(step),
                "start_us": w0,
                "end_us": w1,
                "step_time_us": step_time,
                "gpu_busy_us": busy,
                "gpu_busy_pct": 100.0 * busy / step_time if step_time > 0 else np.nan,
                "idle_launch_us": idle["launch"],
                "idle_sync_us": idle["sync"],
                "idle_other_us": idle["other"],
                "kernels": int(is_kernel[mine].sum()),
                "memcpys": int((~is_kernel[mine]).sum()),
                "host_syncs": len(sync_by_step[i]),
                "launch_calls": len(in_launches),
                "launch_call_us": float(launch_dur[in_launches].sum()),
                "kernels_shorter_than_launch": int(shorter[mine].sum()),
                "median_queue_depth": float(np.median(step_depth)) if len(step_depth) else np.nan,
            }
        )
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def median_step_time_us(steps: pd.DataFrame) -> float | None:
    """The step time of a trace: the median of :func:`step_breakdown`'s step_time_us (each step's window, from
    its start to the later of the ProfilerStep annotation's end and the end of the GPU work launched in it);
    None without steps. ``analyze`` reports it and ``diff`` compares it, so both say the same."""
    if not len(steps) or not steps["step_time_us"].notna().any():
        return None
    return float(np.nanmedian(steps["step_time_us"].to_numpy(float)))


# Intervals kept per lane of the timeline strip. A 30 ms step drawn 1,000 px wide gives 30 µs a pixel, so the
# longest 1,500 of the llama decode sample's 436 kernels and gaps a step lose nothing visible; the cap keeps a
# step of a training trace with tens of thousands of kernels to ~100 kB in report.json.
TIMELINE_MAX_INTERVALS = 1500
TIMELINE_LANES = ("kernels", "copies", "idle_launch", "idle_sync", "idle_other")


def _clip_union(starts: np.ndarray, ends: np.ndarray, w0: float, w1: float) -> tuple[np.ndarray, np.ndarray]:
    lo = np.searchsorted(ends, w0, side="right")
    hi = np.searchsorted(starts, w1, side="left")
    return np.clip(starts[lo:hi], w0, w1), np.clip(ends[lo:hi], w0, w1)


def step_timeline(
    steps: pd.DataFrame,
    acts: pd.DataFrame,
    syncs: pd.DataFrame,
    long_calls: tuple[np.ndarray, np.ndarray],
    step: int | None = None,
    max_intervals: int = TIMELINE_MAX_INTERVALS,
) -> dict | None:
    """What the GPU did during one step, as intervals from the step's start, for the report's timeline strip.

    ``steps`` is :func:`step_breakdown`'s table (its windows are reused), ``acts`` the GPU activities it was
    built from (:func:`~gpuadvisor.analysis.linking.gpu_activities`), ``syncs`` :func:`sync_calls`, ``long_calls``
    :func:`long_host_calls` of the same trace (so that the gaps are classified as the step's figures were). The step
    shown is ``step`` (a ProfilerStep number) or the one whose step time is nearest the median. None without
    steps. Returns (µs; each interval ``[start_us, duration_us]`` from the step's start, 2 decimals):

    step, step_time_us, kernels (union of the kernel intervals on all streams), copies (union of the memcpy and
    memset intervals), idle_launch, idle_sync, idle_other (the idle gaps, classified as :func:`step_breakdown`
    classifies them, so each lane adds up to that step's figure), copy_us_per_step ([float], the copies' busy
    time in every step, in table order), omitted ({lane: count} of the shortest intervals left out past
    ``max_intervals`` per lane; empty when none was).
    """
    if not len(steps):
        return None
    times = steps["step_time_us"].to_numpy(float)
    if step is not None and (steps["step"] == step).any():
        i = int(np.flatnonzero((steps["step"] == step).to_numpy())[0])
    else:
        i = int(np.nanargmin(np.abs(times - np.nanmedian(times)))) if np.isfinite(times).any() else 0
    w0, w1 = float(steps["start_us"].iloc[i]), float(steps["end_us"].iloc[i])
    busy_s, busy_e, opener_launch_end = _busy_intervals(acts)
    sync_ends = np.sort(syncs["end_us"].to_numpy(float)) if len(syncs) else np.empty(0)
    _, _, gap_s, gap_e, after_sync, waited_for_launch = _window_gaps(
        w0, w1, busy_s, busy_e, opener_launch_end, sync_ends, long_calls
    )
    is_kernel = (acts["kind"] == "kernel").to_numpy()
    ts, end = acts["ts_us"].to_numpy(float), acts["end_us"].to_numpy(float)
    kernel_s, kernel_e = union_intervals(ts[is_kernel], end[is_kernel])
    copy_s, copy_e = union_intervals(ts[~is_kernel], end[~is_kernel])
    copy_us_per_step = []
    for s0, s1 in zip(steps["start_us"].to_numpy(float), steps["end_us"].to_numpy(float)):
        cs, ce = _clip_union(copy_s, copy_e, s0, s1)
        copy_us_per_step.append(round(float((ce - cs).sum()), 2))
    lanes = {
        "kernels": _clip_union(kernel_s, kernel_e, w0, w1),
        "copies": _clip_union(copy_s, copy_e, w0, w1),
        "idle_launch": (gap_s[waited_for_launch], gap_e[waited_for_launch]),
        "idle_sync": (gap_s[after_sync], gap_e[after_sync]),
        "idle_other": (gap_s[~after_sync & ~waited_for_launch], gap_e[~after_sync & ~waited_for_launch]),
    }
    out: dict = {"step": int(steps["step"].iloc[i]), "step_time_us": round(w1 - w0, 2)}
    omitted = {}
    for lane in TIMELINE_LANES:
        starts, ends = lanes[lane]
        length = ends - starts
        keep = np.flatnonzero(length > 0)
        if len(keep) > max_intervals:
            omitted[lane] = int(len(keep) - max_intervals)
            keep = np.sort(keep[np.argsort(-length[keep], kind="stable")[:max_intervals]])
        out[lane] = [[round(float(starts[k] - w0), 2), round(float(length[k]), 2)] for k in keep]
    out["copy_us_per_step"] = copy_us_per_step
    out["omitted"] = omitted
    return out


def _rows_by_step(step_index: np.ndarray, n_steps: int) -> list[np.ndarray]:
    """For each step 0..n_steps-1, the indices of the rows with that step_index, in row order."""
    order = np.argsort(step_index, kind="stable")
    bounds = np.searchsorted(step_index[order], np.arange(n_steps + 1), side="left")
    return [order[bounds[i] : bounds[i + 1]] for i in range(n_steps)]


_FRAME_RE = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.*)$")
# A frame "file.py(line): function" from a file that is not library code (installed packages, the standard
# library, torch's and gpuadvisor's own sources).
_USER_FRAME_PATTERN = (
    r"^(?!.*(site-packages|dist-packages|/lib/python|<built-in|<frozen))(?!(.*/)?(torch|triton|gpuadvisor)/)"
    r".+\(\d+\): "
)


def user_frames(trace: Trace) -> pd.DataFrame:
    """Python frames from the user's own files (no library code). Columns: ts_us, end_us, tid, location."""
    frames = trace.python_frames
    if not len(frames):
        return pd.DataFrame({"ts_us": [], "end_us": [], "tid": [], "location": []})
    sel = frames[match_names(frames["name"], _USER_FRAME_PATTERN)]
    codes, names = factorize_names(sel["name"])
    locations = []
    for name in names:
        m = _FRAME_RE.match(name)
        locations.append(f"{m['file']}:{m['line']} ({m['func']})" if m else name)
    return pd.DataFrame(
        {
            "ts_us": sel["ts_us"].to_numpy(),
            "end_us": sel["end_us"].to_numpy(),
            "tid": sel["tid"].astype(str).to_numpy(),
            "location": np.asarray(locations, dtype=object)[codes] if len(sel) else np.empty(0, dtype=object),
        }
    )


def enclosing_frame(frames: pd.DataFrame, ts_us: float, tid) -> tuple[str, float] | None:
    """The innermost user frame on thread ``tid`` that encloses ``ts_us``: ("file:line (function)", frame start)."""
    if not len(frames):
        return None
    # Per-thread arrays sorted by start, built once per frames table (lookups run per sync and per copy).
    index = frames.attrs.get("_by_tid")
    if index is None:
        ordered = frames.sort_values("ts_us", kind="stable")
        index = {
            t: (g["ts_us"].to_numpy(float), g["end_us"].to_numpy(float), g["location"].to_numpy(object))
            for t, g in ordered.groupby("tid", sort=False)
        }
        frames.attrs["_by_tid"] = index
    arrays = index.get(str(tid))
    if arrays is None:
        return None
    starts, ends, locations = arrays
    # Frames nest: among those started by ts_us and still open, the latest-started is the innermost.
    open_frames = np.flatnonzero(ends[: np.searchsorted(starts, ts_us, side="right")] >= ts_us)
    if not len(open_frames):
        return None
    i = open_frames[-1]
    return str(locations[i]), float(starts[i])


def source_line(frames: pd.DataFrame, ts_us: float, tid) -> str | None:
    """The innermost user frame on thread ``tid`` that encloses ``ts_us``, as "file:line (function)".

    The line is the one the function starts on (the profiler records frames so); :func:`call_sources`
    names the line of the call inside it.
    """
    found = enclosing_frame(frames, ts_us, tid)
    return found[0] if found else None


def call_sources(frames: pd.DataFrame, ts_us, tids, kinds, max_lookups: int | None = None) -> list[str | None]:
    """For host events (a sync call, a memcpy launch) at ``ts_us`` on threads ``tids``, the user source line
    of the call that issued each: "file:LINE (call text)", e.g. "model.py:48 (loss.item())".

    ``kinds`` says per event what call to look for (:mod:`gpuadvisor.analysis.sources`: "item", "copy",
    "host_to_device", ...; None: only the frame). The enclosing user frame gives the function; its source
    gives the matching call sites. Events of one kind in one call of a function are numbered in time
    order, so that when their count equals the number of sites, the n-th event names the n-th site.
    Falls back to the function's def line ("file:DEF (function)") where the source cannot say more, and
    to None without an enclosing user frame. Only the first ``max_lookups`` events are looked up.
    """
    from gpuadvisor.analysis.sources import resolve_location

    ts_list = list(ts_us)
    tid_list = list(tids)
    kind_list = list(kinds)
    limit = len(ts_list) if max_lookups is None else min(len(ts_list), max_lookups)
    found = [enclosing_frame(frames, ts_list[i], tid_list[i]) for i in range(limit)]
    groups: dict[tuple, list[int]] = {}
    for i, frame in enumerate(found):
        if frame is not None and kind_list[i]:
            groups.setdefault((str(tid_list[i]), frame[1], frame[0], kind_list[i]), []).append(i)
    position: dict[int, tuple[int, int]] = {}
    for members in groups.values():
        members.sort(key=lambda i: ts_list[i])
        for ordinal, i in enumerate(members):
            position[i] = (ordinal, len(members))
    result: list[str | None] = []
    for i in range(len(ts_list)):
        if i >= limit or found[i] is None:
            result.append(None)
            continue
        ordinal, total = position.get(i, (None, None))
        result.append(resolve_location(found[i][0], kind_list[i], ordinal, total))
    return result


def host_sync_table(
    trace: Trace, frames: pd.DataFrame | None = None, max_lookups: int = 200, syncs: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Host synchronizations grouped by call, operator and source line (inside steps when there are steps).

    Columns: name (the blocking call), op (the operator that issued it, e.g. aten::_local_scalar_dense
    for ``.item()``; None when unknown), source (user "file:line (call)" of the call that synchronized,
    e.g. "model.py:48 (loss.item())", when the trace has Python stacks; see :func:`call_sources`),
    count, total_us (host time blocked), steps_seen (steps with at least one).
    """
    calls = sync_calls(trace) if syncs is None else syncs
    cols = ["name", "op", "source", "count", "total_us", "steps_seen"]
    if (calls["step_index"] >= 0).any():
        calls = calls[calls["step_index"] >= 0]  # the syncs of the steps, not of the harness around them
    if not len(calls):
        return pd.DataFrame({c: [] for c in cols})
    ops = trace.cpu_ops[["rank", "external_id", "name"]]
    ops = ops[ops["external_id"].isin(calls["external_id"].unique())]  # the rest never matches (500k rows)
    ops = ops.drop_duplicates(["rank", "external_id"]).rename(columns={"name": "op"})
    calls = calls.merge(ops, on=["rank", "external_id"], how="left")
    if frames is None:
        frames = user_frames(trace)
    from gpuadvisor.analysis.sources import kind_for_op

    kinds = [kind_for_op(op) if isinstance(op, str) else None for op in calls["op"]]
    calls["source"] = call_sources(frames, calls["ts_us"], calls["tid"], kinds, max_lookups)
    grouped = (
        calls.groupby(["name", calls["op"].fillna(""), calls["source"].fillna("")], sort=False)
        .agg(
            count=("ts_us", "size"),
            total_us=("dur_us", "sum"),
            steps_seen=("step_index", lambda s: int(s[s >= 0].nunique())),
        )
        .reset_index()
    )
    grouped.columns = cols
    for col in ("op", "source"):
        grouped[col] = pd.Series([v if isinstance(v, str) and v else None for v in grouped[col]], dtype=object)
    return grouped.sort_values("total_us", ascending=False).reset_index(drop=True)

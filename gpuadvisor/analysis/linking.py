"""Links between host and device: launch call -> kernel (correlation), operator -> kernel (External id),
and the step each GPU activity belongs to.

Pure functions; the DataFrames they return are documented per function (times in µs).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from gpuadvisor.trace.model import Trace

# Host calls that put work on the GPU (runtime and driver API, CUDA and HIP spellings).
LAUNCH_CALL_PATTERN = r"LaunchKernel|cuLaunch|GraphLaunch|hipLaunch|hipExtLaunch|hipModuleLaunch"
# Host calls that block until the GPU has drained a stream, an event or the device.
SYNC_CALL_PATTERN = r"Synchronize|^cudaMemcpy$|^cudaMemcpy2D$|^cuMemcpyDtoH|^cuMemcpyHtoD$|^hipMemcpy$"


def factorize_names(names) -> tuple[np.ndarray, np.ndarray]:
    """(codes, uniques) of a column of names, as ``pd.factorize`` gives them (uniques in first-seen order,
    code -1 for a missing value), but faster on long strings: pandas hashes the UTF-8 bytes of every row,
    a dict uses each string's cached hash (the reader keeps one string object per distinct name). On the
    118k kernel names of a 425 MB trace (~100 characters each): 0.016 s against 0.092 s for pd.factorize."""
    values = names.tolist() if isinstance(names, (pd.Series, pd.Index, np.ndarray)) else list(names)
    index = dict.fromkeys(values)
    if not all(type(v) is str for v in index):  # missing values and other types: pandas' rules
        codes, uniques = pd.factorize(np.asarray(values, dtype=object))
        return codes, np.asarray(uniques, dtype=object)
    uniques = np.empty(len(index), dtype=object)
    uniques[:] = list(index)
    for i, v in enumerate(uniques.tolist()):
        index[v] = i
    return np.fromiter(map(index.__getitem__, values), dtype=np.intp, count=len(values)), uniques


def match_names(names: pd.Series, pattern: str) -> np.ndarray:
    """Boolean mask of the names a regex finds a match in; each distinct name is tested once (traces repeat
    the same few hundred names millions of times)."""
    if not len(names):
        return np.zeros(0, dtype=bool)
    codes, uniques = factorize_names(names)
    regex = re.compile(pattern)
    hits = np.fromiter((bool(regex.search(str(u))) for u in uniques), dtype=bool, count=len(uniques))
    return np.where(codes >= 0, hits[np.maximum(codes, 0)], False)


def step_windows(trace: Trace) -> pd.DataFrame:
    """The host-side step intervals.

    Columns: step (int), ts_us, end_us (the ProfilerStep#N annotation), synthetic (bool: True when the
    trace has no ProfilerStep annotations and the whole trace stands for one step).
    """
    if len(trace.steps):
        steps = trace.steps[["step", "ts_us", "end_us"]].copy()
        steps["synthetic"] = False
        return steps.sort_values("ts_us").reset_index(drop=True)
    from gpuadvisor.analysis.harness import harness_runtime

    starts, ends = [], []
    # The profiling harness's own runtime calls (a final synchronize before export) are not the step's.
    runtime = trace.runtime[~harness_runtime(trace)] if len(trace.runtime) else trace.runtime
    for df in (trace.kernels, trace.memcpys, runtime):
        if len(df):
            starts.append(df["ts_us"].min())
            ends.append(df["end_us"].max())
    if not starts:
        return pd.DataFrame({"step": [], "ts_us": [], "end_us": [], "synthetic": []})
    return pd.DataFrame({"step": [0], "ts_us": [min(starts)], "end_us": [max(ends)], "synthetic": [True]})


def assign_steps(times_us: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """Index into ``steps`` of the step whose host window holds each time, or -1."""
    if not len(steps) or not len(times_us):
        return np.full(len(times_us), -1, dtype=np.int64)
    starts = steps["ts_us"].to_numpy()
    ends = steps["end_us"].to_numpy()
    idx = np.searchsorted(starts, times_us, side="right") - 1
    ok = idx >= 0
    inside = np.zeros(len(times_us), dtype=bool)
    inside[ok] = times_us[ok] <= ends[idx[ok]]
    return np.where(inside, idx, -1)


def gpu_activities(trace: Trace) -> pd.DataFrame:
    """Kernels, memcpys and memsets in one table, each with its launch call and its step.

    Columns: kind ("kernel" | "memcpy" | "memset"), name, ts_us, dur_us, end_us, stream, device,
    correlation, external_id, blocks (kernels; -1 otherwise), row (index in its source table),
    launch_name, launch_ts_us, launch_dur_us (NaN when the trace has no matching host call),
    step_index (index into :func:`step_windows`, -1 outside every step; assigned by the launch time,
    or the activity's own start when the launch is unknown).
    """
    k = trace.kernels
    m = trace.memcpys
    parts = []
    if len(k):
        parts.append(
            pd.DataFrame(
                {
                    "kind": "kernel",
                    "name": k["name"],
                    "ts_us": k["ts_us"],
                    "dur_us": k["dur_us"],
                    "end_us": k["end_us"],
                    "stream": k["stream"],
                    "device": k["device"],
                    "correlation": k["correlation"],
                    "external_id": k["external_id"],
                    "blocks": k["blocks"],
                    "row": np.arange(len(k)),
                    "rank": k["rank"],
                }
            )
        )
    if len(m):
        parts.append(
            pd.DataFrame(
                {
                    "kind": m["op"],
                    "name": m["name"],
                    "ts_us": m["ts_us"],
                    "dur_us": m["dur_us"],
                    "end_us": m["end_us"],
                    "stream": m["stream"],
                    "device": m["device"],
                    "correlation": m["correlation"],
                    "external_id": m["external_id"],
                    "blocks": -1,
                    "row": np.arange(len(m)),
                    "rank": m["rank"],
                }
            )
        )
    if not parts:
        cols = [
            "kind",
            "name",
            "ts_us",
            "dur_us",
            "end_us",
            "stream",
            "device",
            "correlation",
            "external_id",
            "blocks",
            "row",
            "rank",
            "launch_name",
            "launch_ts_us",
            "launch_dur_us",
            "step_index",
        ]
        return pd.DataFrame({c: [] for c in cols})
    acts = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    rt = trace.runtime
    if len(rt):
        calls = rt.loc[rt["correlation"] >= 0, ["rank", "correlation", "name", "ts_us", "dur_us"]]
        calls = calls.drop_duplicates(["rank", "correlation"])
        calls = calls.rename(columns={"name": "launch_name", "ts_us": "launch_ts_us", "dur_us": "launch_dur_us"})
        acts = acts.merge(calls, on=["rank", "correlation"], how="left")
    else:
        acts["launch_name"] = None
        acts["launch_ts_us"] = np.nan
        acts["launch_dur_us"] = np.nan
    acts = acts.sort_values("ts_us", kind="stable").reset_index(drop=True)
    steps = step_windows(trace)
    when = acts["launch_ts_us"].fillna(acts["ts_us"]).to_numpy()
    step_index = assign_steps(when, steps)
    _place_unlaunched(acts, step_index)
    acts["step_index"] = step_index
    return acts


def _place_unlaunched(acts: pd.DataFrame, step_index: np.ndarray) -> None:
    """Give activities whose launch is not in the trace the step whose GPU work they run among (in place).

    Placing them by their own start time in the host's step windows is wrong when the host runs ahead of the
    GPU: work launched before the profiler's active window (its warm-up step keeps no launch events) runs
    during the first recorded steps and landed in their host windows, stretching them. Measured on the H200
    with examples/ddp_train.py (GPU-bound, host 1-2 steps ahead): 91 of 580 activities had no launch, and the
    three profiled steps read 44, 64 and 30 ms where the GPU took 28-30 ms per step. Here each such activity
    goes to the last step whose first launched activity started before it, or to no step (-1) when it runs
    before the first one; a rank with no launch events at all keeps the start-time placement.
    """
    unknown = acts["launch_ts_us"].isna().to_numpy()
    if not unknown.any() or unknown.all():
        return
    ts = acts["ts_us"].to_numpy(float)
    ranks = acts["rank"].to_numpy() if "rank" in acts else np.zeros(len(acts), dtype=np.int64)
    for rank in np.unique(ranks[unknown]):
        mine = ranks == rank
        known = mine & ~unknown & (step_index >= 0)
        if not known.any():
            continue
        steps_known = step_index[known]
        firsts = pd.Series(ts[known]).groupby(steps_known).min()
        order = np.argsort(firsts.to_numpy(), kind="stable")
        first_ts = firsts.to_numpy()[order]
        first_step = firsts.index.to_numpy()[order]
        last_end = float(acts["end_us"].to_numpy(float)[known].max())
        targets = np.flatnonzero(mine & unknown & (ts <= last_end))
        pos = np.searchsorted(first_ts, ts[targets], side="right") - 1
        step_index[targets] = np.where(pos >= 0, first_step[np.maximum(pos, 0)], -1)


def union_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge possibly overlapping intervals into disjoint sorted ones."""
    if not len(starts):
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = np.maximum.accumulate(ends[order])
    # A new interval begins where the start is past every earlier end.
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > e[:-1]
    group = np.cumsum(new) - 1
    out_s = s[new]
    out_e = np.zeros(len(out_s))
    np.maximum.at(out_e, group, e)
    return out_s, out_e

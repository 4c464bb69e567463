"""Several ranks of one job side by side: communication, how much of it hides behind compute, and stragglers.

Pure functions on a multi-rank :class:`~gpuadvisor.trace.model.Trace` (a folder of per-rank traces) and on
each rank's step table (:func:`gpuadvisor.analysis.timeline.step_breakdown`). Times are µs.

Definitions, per rank and per step window (the window :func:`step_breakdown` gives the step: its
ProfilerStep annotation stretched to the end of the GPU work launched inside it):

- communication: time in which at least one communication kernel runs (family "communication" of
  :func:`gpuadvisor.analysis.roofline.kernel_family`: NCCL/RCCL kernels), i.e. the union of their intervals;
- compute: time in which at least one other GPU activity runs (any other kernel, memcpy or memset, any stream);
- exposed communication: communication during which no compute runs (union of the communication intervals
  minus the union of the compute intervals): the GPU does nothing but communicate, or wait inside a collective;
- overlapped communication = communication − exposed communication (hidden behind compute);
- GPU busy = compute + exposed communication.

Steps are matched across ranks by their ProfilerStep number: the per-rank figures are medians over the step
numbers every rank has. When the ranks share no step number (or some rank has no ProfilerStep annotations),
each rank's whole trace is one window, from its first GPU activity to its last.

Straggler. Start times of collectives cannot be compared across ranks (each host has its own clock), but
durations can: a collective kernel starts on each rank when that rank launches it and ends on all of them
together, so the ranks that arrive early wait inside it and the last one to arrive spends the least time in
it. The straggler is the rank with the lowest median communication time per step, provided its median step
time is among the longest (within :data:`STEP_TIME_TOLERANCE_PCT` of the longest rank's: a rank that spends
less time in collectives because its steps are shorter is not holding anyone up). Its excess wait, the time
the other ranks lose waiting for it per step, is the median over the other ranks of their communication time
minus the straggler's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpuadvisor.analysis.linking import factorize_names, gpu_activities, union_intervals
from gpuadvisor.analysis.roofline import kernel_family
from gpuadvisor.analysis.timeline import step_breakdown
from gpuadvisor.trace.model import Trace

COMMUNICATION_FAMILY = "communication"
# Ranks of a synchronous job end each step together (the step's last collective releases them all), so their
# step times differ by noise only: in shared/traces/public/two_ranks (two ranks of a 128-GPU NCCL job) the two
# ranks' step windows differ by 0.1% (step 551) and 1.2% (step 552), medians 0.7%. A rank whose median step is
# more than 2% shorter than the longest rank's is not the one the others wait for.
STEP_TIME_TOLERANCE_PCT = 2.0

STEP_COLUMNS = [
    "rank",
    "step",
    "start_us",
    "end_us",
    "step_time_us",
    "gpu_busy_us",
    "gpu_busy_pct",
    "compute_us",
    "communication_us",
    "exposed_communication_us",
    "overlapped_communication_us",
    "collectives",
]

RANK_COLUMNS = [
    "rank",
    "steps",
    "step_time_us",
    "gpu_busy_pct",
    "compute_us_per_step",
    "communication_us_per_step",
    "exposed_communication_us_per_step",
    "overlapped_communication_us_per_step",
    "collectives_per_step",
    "communication_us_total",
    "exposed_communication_us_total",
]


@dataclass
class DistributedAnalysis:
    """The multi-rank tables (see :func:`distributed_analysis`)."""

    ranks: list[int]
    steps: pd.DataFrame  # rank_step_figures of every rank, matched steps only (STEP_COLUMNS)
    rank_table: pd.DataFrame  # rank_table (RANK_COLUMNS)
    matched_steps: list[int]  # the ProfilerStep numbers every rank has; empty: whole-trace windows
    straggler: dict[str, Any] | None  # find_straggler
    notes: list[str] = field(default_factory=list)

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    @property
    def has_communication(self) -> bool:
        return bool(len(self.rank_table)) and bool((self.rank_table["communication_us_total"] > 0).any())

    def rank_row(self, rank: int) -> dict[str, Any] | None:
        rows = self.rank_table[self.rank_table["rank"] == rank]
        return rows.iloc[0].to_dict() if len(rows) else None


def communication_mask(acts: pd.DataFrame) -> np.ndarray:
    """True for the rows of :func:`gpu_activities` that are communication (NCCL/RCCL) kernels."""
    if not len(acts):
        return np.zeros(0, dtype=bool)
    codes, names = factorize_names(acts["name"])
    is_comm = np.fromiter((kernel_family(str(n)) == COMMUNICATION_FAMILY for n in names), bool, len(names))
    return (acts["kind"] == "kernel").to_numpy() & np.where(codes >= 0, is_comm[np.maximum(codes, 0)], False)


def covered_us(union_starts: np.ndarray, union_ends: np.ndarray, w0: float, w1: float) -> float:
    """Length of ``[w0, w1]`` covered by disjoint sorted intervals (as :func:`union_intervals` returns them)."""
    lo = np.searchsorted(union_ends, w0, side="right")
    hi = np.searchsorted(union_starts, w1, side="left")
    return float((np.clip(union_ends[lo:hi], w0, w1) - np.clip(union_starts[lo:hi], w0, w1)).sum())


def rank_step_figures(acts: pd.DataFrame, windows: pd.DataFrame, rank: int) -> pd.DataFrame:
    """Communication and compute of one rank in each window. ``acts``: the rank's :func:`gpu_activities`;
    ``windows``: columns step, start_us, end_us.

    Columns (µs unless named otherwise): rank, step (ProfilerStep number, -1 for a whole-trace window),
    start_us, end_us, step_time_us, gpu_busy_us, gpu_busy_pct (%), compute_us, communication_us,
    exposed_communication_us, overlapped_communication_us (as the module docstring defines them),
    collectives (count of communication kernels that start in the window).
    """
    comm = communication_mask(acts)
    ts = acts["ts_us"].to_numpy(float) if len(acts) else np.empty(0)
    end = acts["end_us"].to_numpy(float) if len(acts) else np.empty(0)
    comm_s, comm_e = union_intervals(ts[comm], end[comm])
    compute_s, compute_e = union_intervals(ts[~comm], end[~comm])
    busy_s, busy_e = union_intervals(ts, end)
    comm_starts = np.sort(ts[comm])
    rows = []
    for step, w0, w1 in zip(windows["step"], windows["start_us"], windows["end_us"]):
        step_time = float(w1 - w0)
        busy = covered_us(busy_s, busy_e, w0, w1)
        compute = covered_us(compute_s, compute_e, w0, w1)
        communication = covered_us(comm_s, comm_e, w0, w1)
        exposed = max(0.0, busy - compute)  # |comm ∪ compute| - |compute| = |comm \ compute|
        rows.append(
            {
                "rank": rank,
                "step": int(step),
                "start_us": float(w0),
                "end_us": float(w1),
                "step_time_us": step_time,
                "gpu_busy_us": busy,
                "gpu_busy_pct": 100.0 * busy / step_time if step_time > 0 else np.nan,
                "compute_us": compute,
                "communication_us": communication,
                "exposed_communication_us": exposed,
                "overlapped_communication_us": max(0.0, communication - exposed),
                "collectives": int(
                    np.searchsorted(comm_starts, w1, side="left") - np.searchsorted(comm_starts, w0, side="left")
                ),
            }
        )
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def whole_trace_window(acts: pd.DataFrame) -> pd.DataFrame:
    """One window from the first GPU activity's start to the last one's end (step -1); empty without activity."""
    if not len(acts):
        return pd.DataFrame({"step": [], "start_us": [], "end_us": []})
    return pd.DataFrame({"step": [-1], "start_us": [acts["ts_us"].min()], "end_us": [acts["end_us"].max()]})


def rank_table(steps: pd.DataFrame, totals: dict[int, tuple[float, float]], ranks: list[int]) -> pd.DataFrame:
    """One row per rank: medians over its matched steps of :func:`rank_step_figures`.

    Columns (µs unless named otherwise): rank, steps (count of windows), step_time_us, gpu_busy_pct (%),
    compute_us_per_step, communication_us_per_step, exposed_communication_us_per_step,
    overlapped_communication_us_per_step, collectives_per_step (count), communication_us_total and
    exposed_communication_us_total (over the rank's whole trace, steps or not; from ``totals``:
    rank -> (communication, exposed)). A rank without GPU activity has NaN figures.
    """
    per_step = {
        "step_time_us": "step_time_us",
        "gpu_busy_pct": "gpu_busy_pct",
        "compute_us_per_step": "compute_us",
        "communication_us_per_step": "communication_us",
        "exposed_communication_us_per_step": "exposed_communication_us",
        "overlapped_communication_us_per_step": "overlapped_communication_us",
        "collectives_per_step": "collectives",
    }
    rows = []
    for rank in ranks:
        mine = steps[steps["rank"] == rank]
        row: dict[str, Any] = {"rank": rank, "steps": len(mine)}
        for out, column in per_step.items():
            row[out] = float(mine[column].median()) if len(mine) else np.nan
        row["communication_us_total"], row["exposed_communication_us_total"] = totals.get(rank, (np.nan, np.nan))
        rows.append(row)
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


def find_straggler(ranks: pd.DataFrame) -> dict[str, Any] | None:
    """The rank the others wait for (module docstring), or None: fewer than two ranks with communication,
    or the rank with the least communication has clearly shorter steps than the longest rank, or no excess.

    Returns: rank, communication_us_per_step (the straggler's), others_communication_us_per_step (median over
    the other ranks), excess_wait_us_per_step (the difference), excess_wait_pct (of the straggler's median
    step), step_time_us (the straggler's), longest_step_time_us (over all ranks).
    """
    candidates = ranks[(ranks["communication_us_total"] > 0) & ranks["communication_us_per_step"].notna()]
    if len(candidates) < 2:
        return None
    order = candidates.sort_values(["communication_us_per_step", "rank"], kind="stable")
    lowest = order.iloc[0]
    others = order.iloc[1:]
    others_comm = float(others["communication_us_per_step"].median())
    excess = others_comm - float(lowest["communication_us_per_step"])
    longest = float(candidates["step_time_us"].max())
    step = float(lowest["step_time_us"])
    if excess <= 0 or not step > 0 or step < longest * (1 - STEP_TIME_TOLERANCE_PCT / 100):
        return None
    return {
        "rank": int(lowest["rank"]),
        "communication_us_per_step": float(lowest["communication_us_per_step"]),
        "others_communication_us_per_step": others_comm,
        "excess_wait_us_per_step": excess,
        "excess_wait_pct": 100.0 * excess / step,
        "step_time_us": step,
        "longest_step_time_us": longest,
    }


def distributed_analysis(trace: Trace, step_tables: dict[int, pd.DataFrame] | None = None) -> DistributedAnalysis:
    """Per-rank communication figures and the straggler of a multi-rank trace.

    ``step_tables`` (rank -> :func:`step_breakdown` of that rank) saves recomputing the ones the caller has.
    """
    step_tables = dict(step_tables or {})
    ranks = list(trace.ranks)
    acts: dict[int, pd.DataFrame] = {}
    annotated: dict[int, set[int]] = {}
    for rank in ranks:
        mine = trace.for_rank(rank) if len(ranks) > 1 else trace
        acts[rank] = gpu_activities(mine)
        if rank not in step_tables:
            step_tables[rank] = step_breakdown(mine, acts[rank])
        annotated[rank] = {int(s) for s in mine.steps["step"]} if len(mine.steps) else set()
    matched = sorted(set.intersection(*annotated.values())) if ranks and all(annotated.values()) else []
    notes = []
    if not matched:
        notes.append(
            "the ranks share no ProfilerStep number: per-rank figures cover each rank's whole trace "
            "(first to last GPU activity)"
        )
    parts, totals = [], {}
    for rank in ranks:
        if matched:
            table = step_tables[rank]
            windows = table[table["step"].isin(matched)][["step", "start_us", "end_us"]]
        else:
            windows = whole_trace_window(acts[rank])
        parts.append(rank_step_figures(acts[rank], windows, rank))
        whole = rank_step_figures(acts[rank], whole_trace_window(acts[rank]), rank)
        if len(whole):
            totals[rank] = (float(whole["communication_us"].iloc[0]), float(whole["exposed_communication_us"].iloc[0]))
    steps = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in STEP_COLUMNS})
    table = rank_table(steps, totals, ranks)
    return DistributedAnalysis(
        ranks=ranks,
        steps=steps,
        rank_table=table,
        matched_steps=matched,
        straggler=find_straggler(table),
        notes=notes,
    )

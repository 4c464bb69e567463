"""Detectors of the distributed rules (GA7xx). They read the multi-rank tables that the analyze pipeline
attaches to the report's :class:`~gpuadvisor.analysis.bundle.Analysis` as ``distributed`` (a
:class:`~gpuadvisor.analysis.distributed.DistributedAnalysis`) when a folder holds several ranks. A single-rank
analysis has none, and the rules are skipped with the reason."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuadvisor.analysis.distributed import DistributedAnalysis
from gpuadvisor.rules.engine import Finding, Rule, SkipRule, make_finding


def _r(x: Any, digits: int = 1) -> float | None:
    return None if x is None or x != x else round(float(x), digits)


def _us(values: Any) -> list[int | None]:
    """Per-rank durations as whole µs (evidence lists print as they are)."""
    return [None if x is None or x != x else int(round(float(x))) for x in values]


def multi_rank(a: Any) -> DistributedAnalysis:
    """The analysis's multi-rank tables; SkipRule when it covers one rank or no collective ran."""
    distributed = getattr(a, "distributed", None)
    if not isinstance(distributed, DistributedAnalysis) or distributed.n_ranks < 2:
        raise SkipRule("single-rank trace (analyze a folder of per-rank traces, without --rank, to compare ranks)")
    if not distributed.has_communication:
        raise SkipRule("no communication (NCCL/RCCL) kernels on any rank")
    return distributed


def _step_basis(d: DistributedAnalysis) -> str:
    if d.matched_steps:
        return f"median over {len(d.matched_steps)} step(s) every rank has"
    return "whole trace per rank (no common ProfilerStep numbers)"


def exposed_communication(a: Any, rule: Rule) -> Finding | None:
    d = multi_rank(a)
    t = d.rank_table
    t = t[(t["communication_us_total"] > 0) & (t["step_time_us"] > 0)]
    if not len(t):
        return None
    exposed = t["exposed_communication_us_per_step"].to_numpy(float)
    step = t["step_time_us"].to_numpy(float)
    communication = t["communication_us_per_step"].to_numpy(float)
    compute = t["compute_us_per_step"].to_numpy(float)
    overlapped = t["overlapped_communication_us_per_step"].to_numpy(float)
    exposed_pct = 100.0 * exposed / step
    typical_pct = float(np.median(exposed_pct))
    if typical_pct < rule.threshold("min_exposed_communication_pct"):
        return None
    # With perfect overlap a rank's GPU is busy max(compute, communication) instead of compute + exposed:
    # communication can hide only behind compute that does not already hide communication. The job's step
    # shrinks by at least the smallest of these over the ranks.
    bound = np.clip(np.minimum(exposed, compute - overlapped), 0, None)
    saving = float(bound.min())
    ranks = [int(r) for r in t["rank"]]
    comm_median = float(np.median(communication))
    overlapped_share = 100.0 * float(np.median(overlapped)) / comm_median if comm_median > 0 else 0.0
    worst = int(np.argmax(exposed_pct))
    message = (
        f"Communication runs with no compute beside it for {float(np.median(exposed)):,.0f} µs per step "
        f"({typical_pct:.1f}% of the step, median over {len(ranks)} ranks; rank {ranks[worst]}: "
        f"{exposed_pct[worst]:.1f}%). Of {comm_median:,.0f} µs per step inside NCCL/RCCL kernels, "
        f"{overlapped_share:.0f}% overlaps compute. Overlapping the rest with the compute that does not yet "
        f"hide communication would save at least {saving:,.0f} µs per step (the smallest such bound over the ranks)."
    )
    evidence = {
        "ranks": len(ranks),
        "step_basis": _step_basis(d),
        "exposed_communication_us_per_step": _r(np.median(exposed)),
        "exposed_communication_pct": _r(typical_pct),
        "communication_us_per_step": _r(comm_median),
        "overlapped_communication_pct": _r(overlapped_share),
        "compute_us_per_step": _r(np.median(compute)),
        "exposed_communication_us_per_step_by_rank": _us(exposed),
        "exposed_communication_pct_by_rank": [_r(x) for x in exposed_pct],
        "overlap_bound_us_per_step_by_rank": _us(bound),
    }
    return make_finding(rule, a, message, evidence, saving)


def straggler_rank(a: Any, rule: Rule) -> Finding | None:
    d = multi_rank(a)
    s = d.straggler
    if s is None or s["excess_wait_pct"] < rule.threshold("min_excess_wait_pct"):
        return None
    t = d.rank_table
    others = t[(t["rank"] != s["rank"]) & (t["communication_us_total"] > 0)]
    mine = d.rank_row(s["rank"]) or {}
    own_compute = float(mine.get("compute_us_per_step", np.nan))
    others_compute = float(others["compute_us_per_step"].median()) if len(others) else np.nan
    own_busy = float(mine.get("gpu_busy_pct", np.nan))
    others_busy = float(others["gpu_busy_pct"].median()) if len(others) else np.nan
    if own_compute > others_compute:
        cause = (
            f"Its GPU has more to do: {own_compute:,.0f} µs of non-communication GPU work per step against a median "
            f"of {others_compute:,.0f} µs on the others (uneven shards or batches, or a slower GPU)."
        )
    else:
        cause = (
            f"Its GPU does no more work than the others' ({own_compute:,.0f} µs of non-communication GPU work per "
            f"step, others {others_compute:,.0f} µs) and is busy {own_busy:.0f}% of the step (others "
            f"{others_busy:.0f}%): the delay is on its host (input pipeline, Python, CPU contention) or its launches."
        )
    message = (
        f"Rank {s['rank']} holds the others up: it spends {s['communication_us_per_step']:,.0f} µs per step inside "
        f"collectives, the other ranks a median of {s['others_communication_us_per_step']:,.0f} µs, so they wait "
        f"about {s['excess_wait_us_per_step']:,.0f} µs per step ({s['excess_wait_pct']:.1f}% of its step) for it "
        f"inside their NCCL kernels. {cause}"
    )
    evidence = {
        "straggler_rank": s["rank"],
        "ranks": d.n_ranks,
        "step_basis": _step_basis(d),
        "straggler_communication_us_per_step": _r(s["communication_us_per_step"]),
        "others_communication_us_per_step": _r(s["others_communication_us_per_step"]),
        "excess_wait_us_per_step": _r(s["excess_wait_us_per_step"]),
        "excess_wait_pct": _r(s["excess_wait_pct"]),
        "straggler_step_time_us": _r(s["step_time_us"]),
        "longest_step_time_us": _r(s["longest_step_time_us"]),
        "straggler_compute_us_per_step": _r(own_compute),
        "others_compute_us_per_step": _r(others_compute),
        "communication_us_per_step_by_rank": _us(t["communication_us_per_step"]),
    }
    return make_finding(rule, a, message, evidence, s["excess_wait_us_per_step"])

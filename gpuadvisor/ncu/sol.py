"""Nsight Compute's verdict per kernel, read off an ``ncu --csv`` export of the Speed-of-Light and launch metrics.

Nsight Compute's SpeedOfLight section reports each unit's throughput as a percentage of its sustained peak:
"Compute (SM) Throughput" (``sm__throughput``) and, for the memory side of the roofline gpuadvisor draws,
DRAM throughput (``dram__throughput``). Its bottleneck rule reads them with one threshold, 60% of peak; its
LaunchStats rule calls a grid of less than one full wave (``launch__waves_per_multiprocessor`` < 1: fewer
blocks than the SMs can hold at once) too small to fill the GPU. The verdict used here:

1. a unit at >= 60% of its peak: the kernel is bound by it (``memory`` for DRAM, ``compute`` for SM; the
   larger of the two when both are);
2. otherwise, a grid under one wave: ``latency`` (ncu's small-grid verdict);
3. otherwise ``memory`` or ``compute``, whichever unit is nearer its peak (the bottleneck ncu's throughput
   breakdown points at).

gpuadvisor's classes map onto these verdicts one to one, except ``launch`` (a kernel shorter than its own
launch call), which agrees with ``latency``: ncu times one launch at a time, so it has no launch-wait class.
``tests/test_ncu_classes.py`` checks the classes of the four sample traces against the H200 exports in
``benchmarks/results/ncu_classes`` (recorded by ``benchmarks/ncu_classes.py``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

SOL_METRICS = {
    "duration": "gpu__time_duration.sum",
    "compute_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "waves": "launch__waves_per_multiprocessor",
}

BOUND_PCT = 60.0  # ncu's SpeedOfLight bottleneck rule

# gpuadvisor class -> the ncu verdict it agrees with
AGREES_WITH = {"memory": "memory", "compute": "compute", "latency": "latency", "launch": "latency"}


def verdict(compute_pct: float | None, dram_pct: float | None, waves: float | None = None) -> str | None:
    """The verdict (module docstring) from SM and DRAM throughput (percent of peak) and the grid's waves; None
    when a throughput is missing."""
    if compute_pct is None or dram_pct is None:
        return None
    nearer = "memory" if dram_pct >= compute_pct else "compute"
    if max(compute_pct, dram_pct) >= BOUND_PCT:
        return nearer
    if waves is not None and waves < 1.0:
        return "latency"
    return nearer


def launch_verdicts(launches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per profiled launch (from :func:`gpuadvisor.ncu.counters.parse_csv`): kernel, duration µs, the two SOL
    figures and the verdict."""
    out = []
    for launch in launches:
        metrics = launch["metrics"]
        compute = metrics.get(SOL_METRICS["compute_pct"])
        dram = metrics.get(SOL_METRICS["dram_pct"])
        waves = metrics.get(SOL_METRICS["waves"])
        out.append(
            {
                "kernel": launch["kernel"],
                "duration_us": metrics.get(SOL_METRICS["duration"]),
                "compute_pct": compute,
                "dram_pct": dram,
                "memory_pct": metrics.get(SOL_METRICS["memory_pct"]),
                "grid": metrics.get(SOL_METRICS["grid"]),
                "waves": waves,
                "verdict": verdict(compute, dram, waves),
            }
        )
    return out


def comparable_name(name: str) -> str:
    """A kernel name as both the profiler (full namespaces) and Nsight Compute (shortened ones) spell it: no
    namespace qualifiers, no ``void``, no whitespace."""
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::|unnamed>::", "", name)
    name = re.sub(r"\b\w+::", "", name)
    name = re.sub(r"\bvoid\b", "", name)
    return re.sub(r"\s+", "", name)


def agreement(kernels: list[dict[str, Any]], launches: list[dict[str, Any]]) -> dict[str, Any]:
    """How much of the trace's GPU time has a class that agrees with ncu's verdict for the same kernel.

    ``kernels``: a report's kernel rows (name, bound, us_per_step); ``launches``: :func:`launch_verdicts`.
    A kernel is matched by :func:`comparable_name` (the first 60 characters when the full names differ);
    its ncu verdict is the most common over its launches. Unmatched kernels count as disagreeing.
    Returns {agree_pct, matched_pct, total_us, rows: [{kernel, us_per_step, ours, ncu, agrees}]}."""
    by_name: dict[str, list[str]] = {}
    for launch in launches:
        if launch["verdict"] is not None:
            by_name.setdefault(comparable_name(launch["kernel"]), []).append(launch["verdict"])
    prefixes: dict[str, list[str]] = {}
    for key, verdicts in by_name.items():
        prefixes.setdefault(key[:60], []).extend(verdicts)
    rows, total, agreed, matched = [], 0.0, 0.0, 0.0
    for row in kernels:
        us = float(row.get("us_per_step") or 0.0)
        key = comparable_name(row["name"])
        verdicts = by_name.get(key) or prefixes.get(key[:60])
        ncu = Counter(verdicts).most_common(1)[0][0] if verdicts else None
        agrees = ncu is not None and AGREES_WITH.get(row.get("bound")) == ncu
        total += us
        matched += us if ncu is not None else 0.0
        agreed += us if agrees else 0.0
        rows.append({"kernel": row["name"], "us_per_step": us, "ours": row.get("bound"), "ncu": ncu, "agrees": agrees})
    return {
        "agree_pct": 100.0 * agreed / total if total else None,
        "matched_pct": 100.0 * matched / total if total else None,
        "total_us": total,
        "rows": rows,
    }

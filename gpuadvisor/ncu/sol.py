"""Nsight Compute's verdict per kernel, read off an ``ncu --csv`` export of the Speed-of-Light and launch metrics.

Nsight Compute's SpeedOfLight section reports each unit's throughput as a percentage of its sustained peak:
"Compute (SM) Throughput" (``sm__throughput``) and, for the memory side of the roofline gpuadvisor draws,
DRAM throughput (``dram__throughput``). Its bottleneck rule (``SOLBottleneck``, shipped with Nsight Compute in
``sections/``) reads them with three numbers: both units under 60% of peak point to latency (reported as a
small grid when ``launch__waves_per_multiprocessor`` is under 1); one unit at 80% or more bounds the kernel;
in between, a unit 10 points or more ahead of the other bounds it, and two units within 10 points of each other
are reported as balanced, both to be reduced. The verdict used here follows that rule:

1. either unit at >= 80% of its peak: the larger (``memory`` for DRAM, ``compute`` for the SM);
2. either at >= 60%: the larger when it leads by >= 10 points, else ``balanced``;
3. otherwise ``latency`` (small grid or not), with ``nearer``: the unit nearer its peak.

The rule itself reads memory as ``gpu__compute_memory_throughput``, the busiest of DRAM, L2 and L1/shared
memory; here it is DRAM alone, the roof gpuadvisor's ``memory`` class is under: a tensor-core GEMM streams its
tiles through shared memory at SM speed (the bf16 GEMM sample's nvjet kernel: 93% SM, 20% DRAM, 95% on the
rule's memory figure), which that figure would call memory-bound.

gpuadvisor's classes agree with a verdict as follows: ``memory`` / ``compute`` with the same bound verdict,
either of them with ``balanced``, or with a latency verdict whose nearer unit is theirs (a kernel under both
roofs, leaning to that side); ``latency`` (grid under one wave) and ``launch`` (a kernel shorter than its own
launch call; ncu times one launch at a time, so it has no launch-wait message) with a latency verdict.
``tests/test_ncu_classes.py`` joins each workload's trace to its export launch by launch (:func:`agreement`)
and checks the share of GPU time that agrees; the exports are in ``benchmarks/results/ncu_classes``
(recorded by ``benchmarks/ncu_classes.py``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from gpuadvisor.report.formatting import mangled_leaf

SOL_METRICS = {
    "duration": "gpu__time_duration.sum",
    "compute_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "waves": "launch__waves_per_multiprocessor",
}

# ncu's SOLBottleneck rule: under LATENCY_PCT on both units, latency; at HIGH_THROUGHPUT_PCT on one, bound by it;
# in between, bound by the unit that leads by BALANCED_PCT points, else balanced.
LATENCY_PCT = 60.0
HIGH_THROUGHPUT_PCT = 80.0
BALANCED_PCT = 10.0


def verdict(compute_pct: float | None, dram_pct: float | None) -> str | None:
    """The verdict (module docstring) from SM and DRAM throughput (percent of peak); None when one is missing."""
    if compute_pct is None or dram_pct is None:
        return None
    top = max(compute_pct, dram_pct)
    if top < LATENCY_PCT:
        return "latency"
    if top < HIGH_THROUGHPUT_PCT and abs(compute_pct - dram_pct) < BALANCED_PCT:
        return "balanced"
    return nearer_unit(compute_pct, dram_pct)


def nearer_unit(compute_pct: float, dram_pct: float) -> str:
    """``memory`` or ``compute``: the unit nearer its peak."""
    return "memory" if dram_pct >= compute_pct else "compute"


def agrees(ours: str | None, launch: dict[str, Any]) -> bool:
    """Whether gpuadvisor's class for a launch agrees with ncu's verdict for it (module docstring)."""
    ncu = launch.get("verdict")
    if ncu is None or ours is None:
        return False
    if ncu == "balanced":
        return ours in ("compute", "memory")
    if ncu != "latency":
        return ours == ncu
    return ours in ("latency", "launch") or ours == launch.get("nearer")


def launch_verdicts(launches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per profiled launch (from :func:`gpuadvisor.ncu.counters.parse_csv`): kernel, duration µs, the two SOL
    figures, the grid's waves, the verdict and the nearer unit."""
    out = []
    for launch in launches:
        metrics = launch["metrics"]
        compute = metrics.get(SOL_METRICS["compute_pct"])
        dram = metrics.get(SOL_METRICS["dram_pct"])
        out.append(
            {
                "kernel": launch["kernel"],
                "duration_us": metrics.get(SOL_METRICS["duration"]),
                "compute_pct": compute,
                "dram_pct": dram,
                "memory_pct": metrics.get(SOL_METRICS["memory_pct"]),
                "grid": metrics.get(SOL_METRICS["grid"]),
                "waves": metrics.get(SOL_METRICS["waves"]),
                "verdict": verdict(compute, dram),
                "nearer": nearer_unit(compute, dram) if compute is not None and dram is not None else None,
            }
        )
    return out


def base_name(name: str) -> str:
    """A kernel's function name without namespaces, template arguments or parameters, as both the profiler
    (``void at::native::(anonymous namespace)::softmax_warp_forward<c10::Half, ..., false>(c10::Half*, ...)``)
    and Nsight Compute (``void <unnamed>::softmax_warp_forward<c10::Half, ..., 0>(T2 *, ...)``) spell it; a
    name the profiler left mangled (``_ZN17cutlass__5x_cudnn6KernelI...``) by its mangled nested name's last
    component (``Kernel``), as ncu prints it demangled."""
    mangled = mangled_leaf(name.strip())  # the profiler keeps some names mangled; ncu demangles them all
    if mangled is not None:
        return mangled
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::", "", name)
    name = re.sub(r"^\s*void\s+", "", name)
    head = re.split(r"[<(]", name, maxsplit=1)[0]
    return head.rsplit("::", 1)[-1].strip()


def trace_launches(path) -> list[dict[str, Any]]:
    """Every kernel launch inside a profiled step of a trace, in time order: name, step, duration µs and the
    class gpuadvisor gives that launch."""
    from gpuadvisor.analysis.bundle import analyze_trace
    from gpuadvisor.device.peaks import lookup_peaks
    from gpuadvisor.trace.kineto import load_trace

    trace = load_trace(path)
    kernels = analyze_trace(trace, lookup_peaks(trace.device, None)).kernels
    kernels = kernels[kernels["step_index"] >= 0].sort_values("ts_us", kind="stable")
    return [
        {"kernel": name, "step": int(step), "dur_us": float(dur), "bound": bound}
        for name, step, dur, bound in zip(kernels["name"], kernels["step_index"], kernels["dur_us"], kernels["bound"])
    ]


def agreement(launches: list[dict[str, Any]], verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """How much of a trace's in-step GPU time has a class that agrees with Nsight Compute's verdict for the same
    launch.

    ``launches``: :func:`trace_launches` (several steps); ``verdicts``: :func:`launch_verdicts` of one step of
    the same workload. Each trace step is joined to ncu's launches by order and name: the longest common
    subsequence of the two lists of :func:`base_name` (difflib), so a kernel one side has and the other lacks
    shifts nothing. A launch with no partner counts as disagreeing. Returns {agree_pct, matched_pct, total_us,
    rows: [{kernel, us_per_step, ours, ncu, agrees, agree_pct}]}, a row per kernel name (most common class and
    verdict over its launches; ``agrees`` when at least half its time agrees)."""
    from difflib import SequenceMatcher

    ncu_names = [base_name(v["kernel"]) for v in verdicts]
    steps: dict[int, list[dict[str, Any]]] = {}
    for launch in launches:
        steps.setdefault(launch["step"], []).append(launch)
    per_kernel: dict[str, dict[str, Any]] = {}
    total = agreed = matched = 0.0
    for step in steps.values():
        partner: dict[int, dict[str, Any]] = {}
        blocks = SequenceMatcher(None, [base_name(x["kernel"]) for x in step], ncu_names, autojunk=False)
        for block in blocks.get_matching_blocks():
            for k in range(block.size):
                partner[block.a + k] = verdicts[block.b + k]
        for i, launch in enumerate(step):
            ncu_launch = partner.get(i)
            ncu = ncu_launch["verdict"] if ncu_launch else None
            agreed_here = ncu_launch is not None and agrees(launch["bound"], ncu_launch)
            us = launch["dur_us"]
            total += us
            matched += us if ncu is not None else 0.0
            agreed += us if agreed_here else 0.0
            row = per_kernel.setdefault(
                launch["kernel"], {"us": 0.0, "agreed": 0.0, "ours": Counter(), "ncu": Counter()}
            )
            row["us"] += us
            row["agreed"] += us if agreed_here else 0.0
            row["ours"][launch["bound"]] += us
            if ncu is not None:
                row["ncu"][ncu] += us
    n_steps = max(len(steps), 1)
    rows = [
        {
            "kernel": name,
            "us_per_step": row["us"] / n_steps,
            "ours": row["ours"].most_common(1)[0][0],
            "ncu": row["ncu"].most_common(1)[0][0] if row["ncu"] else None,
            "agree_pct": 100.0 * row["agreed"] / row["us"] if row["us"] else None,
            "agrees": row["agreed"] >= 0.5 * row["us"],
        }
        for name, row in per_kernel.items()
    ]
    return {
        "agree_pct": 100.0 * agreed / total if total else None,
        "matched_pct": 100.0 * matched / total if total else None,
        "total_us": total / n_steps,
        "rows": rows,
    }

"""The ``apply`` report (``command: "apply"``; its sections are described in :mod:`gpuadvisor.apply`): built
from both sides' timed blocks, their profiled reports and the fix outcomes, in one place."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuadvisor.fixes.coverage import ALSO_ADDRESSES, PREDICTED_BASIS, combined_saving, fix_covers
from gpuadvisor.report.profiled import spread_note
from gpuadvisor.stats import MIN_PAIRED_ROUNDS, finite_round, paired_speedup, speedup_interval

if TYPE_CHECKING:
    from gpuadvisor.apply import SideMeasurement

BEFORE_TRACE = "before_trace.json.gz"
AFTER_TRACE = "after_trace.json.gz"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
SIDES = ("before", "after")
# The options of `apply` that time longer, as its notes advise them (the profile notes it reuses name profile's).
TIME_LONGER_OPTIONS = "--steps, --rounds"
TOP_KERNEL_CHANGES = 10
# report/build.py lists this many kernels; a diff of two full lists shorter than it is complete.
REPORT_TOP_KERNELS = 50

_SIDE_SUMMARY_KEYS = (
    "step_time_us",
    "step_time_p10_us",
    "step_time_p90_us",
    "samples_us",
    "step_time_source",
    "timed_steps",
    "tokens_per_s",
    "kernels_per_step",
    "launch_calls_per_step",
    "gpu_busy_us",
    "gpu_busy_pct",
    "host_enqueue_us",
    "tf32_step_delta_us",
    "tf32_step_delta_rounds",
    "optimizer_step_host_us",
    "energy_j_per_step",
    "energy_source",
)


def _side_section(side: SideMeasurement, report: dict[str, Any] | None, trace_name: str | None) -> dict[str, Any]:
    summary = side.summary or {}
    section: dict[str, Any] = {key: summary.get(key) for key in _SIDE_SUMMARY_KEYS}
    section["round_medians_us"] = [finite_round(x) for x in side.round_medians_us]
    section["peak_memory_bytes"] = summary.get("memory_allocated_peak_bytes")
    section["peak_memory_reserved_bytes"] = summary.get("memory_reserved_peak_bytes")
    section["profiled"] = report is not None
    section["trace"] = trace_name if report is not None else None
    section["kernel_classes"] = (report or {}).get("kernel_classes") or {}
    section["findings"] = (report or {}).get("findings") or []
    section["notes"] = (report or {}).get("notes") or []
    return section


def predicted_savings(findings: list[dict[str, Any]], step_us: float | None) -> dict[str, float]:
    """Per fix id: the summed (rescaled) savings of the findings that recommend it, at most the step."""
    totals: dict[str, float] = {}
    for finding in findings:
        fix_id = finding.get("fix_id")
        saving = finding.get("estimated_saving_us_per_step")
        if fix_id and isinstance(saving, (int, float)):
            totals[fix_id] = totals.get(fix_id, 0.0) + float(saving)
    if step_us:
        totals = {k: min(v, float(step_us)) for k, v in totals.items()}
    return {k: round(v, 1) for k, v in totals.items()}


def search_section(search: Any) -> dict[str, Any] | None:
    if search is None:
        return None
    return {
        "candidates": search.rows,
        "winner": search.winner,
        "original_us": search.original_us,
        "wall_s": search.wall_s,
        "method": "each candidate applied to the original with the numerics guard, then the survivors and the"
        " original timed together: 3 rounds x 10 steps each, rotating order, CUDA events; the lowest median wins"
        " when it beats the original's by more than 2%",
    }


def kernel_diff(before: dict[str, Any], after: dict[str, Any], graph_replay: dict[str, Any] | None) -> dict[str, Any]:
    b_summary, a_summary = before.get("summary") or {}, after.get("summary") or {}

    def pair(key: str) -> dict[str, Any]:
        return {"before": b_summary.get(key), "after": a_summary.get(key)}

    b_classes = before.get("kernel_classes") or {}
    a_classes = (graph_replay or {}).get("classes_us_per_step") or after.get("kernel_classes") or {}
    classes = {
        cls: {"before": finite_round(b_classes.get(cls, 0.0)), "after": finite_round(a_classes.get(cls, 0.0))}
        for cls in sorted(set(b_classes) | set(a_classes), key=lambda c: -(b_classes.get(c, 0) + a_classes.get(c, 0)))
    }
    b_kernels = {k["name"]: k for k in before.get("kernels") or [] if k.get("name")}
    a_kernels = {k["name"]: k for k in after.get("kernels") or [] if k.get("name")}

    def rows(names, table):
        picked = sorted(names, key=lambda n: -(table[n].get("us_per_step") or table[n].get("total_us") or 0))
        return [
            {
                "name": name,
                "us_per_step": table[name].get("us_per_step"),
                "count_per_step": table[name].get("count_per_step"),
            }
            for name in picked[:TOP_KERNEL_CHANGES]
        ]

    complete = len(b_kernels) < REPORT_TOP_KERNELS and len(a_kernels) < REPORT_TOP_KERNELS
    notes = []
    if not complete:
        notes.append(
            f"each report lists its top {REPORT_TOP_KERNELS} kernels by time: a kernel shown as disappeared or "
            "appeared may only have left the other side's list"
        )
    if graph_replay:
        notes.append(
            f"{graph_replay['kernels_per_step']:g} kernels per step of the after run were replayed from a CUDA graph "
            "(all launched by one cudaGraphLaunch): they still count as kernels per step; the profiler links them "
            "to no operator, so their class is estimated from the grid size and name family, and "
            f"{graph_replay['relabelled_launch_us_per_step']:g} µs/step of them ran shorter than the whole graph "
            "launch call; a replayed kernel has no launch call of its own, so the analysis counts none of them "
            "launch-bound (they are memory, compute or latency)"
        )
    return {
        "kernels_per_step": pair("kernels_per_step"),
        "launch_calls_per_step": pair("launch_calls_per_step"),
        "gpu_busy_us": pair("gpu_busy_us"),
        "classes_us_per_step": classes,
        "disappeared": rows(set(b_kernels) - set(a_kernels), b_kernels),
        "appeared": rows(set(a_kernels) - set(b_kernels), a_kernels),
        "complete": complete,
        "graph_replay": graph_replay,
        "notes": notes,
    }


def build_apply_report(
    *,
    model_path: Path,
    out_dir: Path,
    fix_text: str,
    fix_ids: list[str],
    outcomes: list,
    applied_ids: list[str],
    measured: dict[str, SideMeasurement],
    side_reports: dict[str, dict[str, Any] | None],
    env: dict[str, Any],
    cuda: bool,
    nvml_reason: str,
    graph_replay: dict[str, Any] | None,
    steps: int,
    rounds: int,
    auto: bool,
    with_step: bool = False,
    search: Any = None,
) -> dict[str, Any]:
    """The apply report (module docstring) from the measurements, both sides' reports and the fix outcomes."""
    from gpuadvisor.report.schema import assemble_report

    before_report, after_report = side_reports["before"], side_reports["after"]
    before = _side_section(measured["before"], before_report, BEFORE_TRACE)
    after = _side_section(measured["after"], after_report, AFTER_TRACE)
    speedup = speedup_interval(measured["before"].samples_us, measured["after"].samples_us)
    speedup["round_ratios"] = [
        finite_round(b / a, 3) if b and a else None
        for b, a in zip(measured["before"].round_medians_us, measured["after"].round_medians_us)
    ]
    speedup["samples_before"] = len(measured["before"].samples_us)
    speedup["samples_after"] = len(measured["after"].samples_us)
    for key in ("median", "ci_low", "ci_high"):
        speedup[key] = finite_round(speedup[key], 3)
    paired = paired_speedup(measured["before"].round_medians_us, measured["after"].round_medians_us)
    if paired is not None:
        for key in ("median", "ci_low", "ci_high"):
            paired[key] = finite_round(paired[key], 3)
    speedup["paired"] = paired

    before_us, after_us = before.get("step_time_us"), after.get("step_time_us")
    measured_us = finite_round(before_us - after_us, 1) if before_us is not None and after_us is not None else None
    predicted = predicted_savings(before["findings"], before_us)
    fixes = []
    for outcome in outcomes:
        # 0 when the rules ran on GPU kernels and none recommends this fix; None when they could not run (CPU).
        rules_ran = bool(before_report and before_report.get("kernels"))
        outcome.predicted_saving_us = predicted.get(outcome.fix_id, 0.0 if rules_ran else None)
        covered = fix_covers(outcome.fix_id, outcome.facts)
        if rules_ran and (len(covered) > 1 or outcome.fix_id in ALSO_ADDRESSES):
            outcome.predicted_saving_us = combined_saving(before["findings"], covered, before_us)
        row = outcome.to_dict()
        applied = outcome.status == "applied"
        row["measured_saving_us"] = measured_us if applied else None
        row["measured_together_with"] = [f for f in applied_ids if f != outcome.fix_id] if applied else []
        fixes.append(row)
    facts = {o.fix_id: o.facts for o in outcomes if o.status == "applied"}
    covered_ids = set().union(*(fix_covers(f, facts.get(f)) for f in applied_ids)) if applied_ids else set()
    saving = {
        "predicted_us": combined_saving(before["findings"], covered_ids, before_us)
        if applied_ids and before_report and before_report.get("kernels")
        else None,
        "predicted_basis": PREDICTED_BASIS,
        "measured_us": measured_us if applied_ids else None,
        "measured_pct": finite_round(100.0 * measured_us / before_us, 1)
        if applied_ids and measured_us is not None and before_us
        else None,
    }

    keep: list[str] = []
    notes: list[str] = []
    if applied_ids:
        try:
            from gpuadvisor.optimizer import keep_lines
        except ImportError:
            notes.append("the lines that keep the fixes are unavailable: gpuadvisor.optimizer cannot be imported")
        else:
            keep = list(keep_lines(applied_ids, with_step=with_step))

    notes.append(
        f"before and after were timed in the same process: {rounds} interleaved rounds of {steps} steps a side "
        "(the first side alternating), "
        + ("CUDA events per step, no profiler" if cuda else "time.perf_counter per step on the CPU (no CUDA GPU)")
        + f"; speedup = median(before) / median(after); {speedup['method']}"
    )
    ratios = [r for r in speedup["round_ratios"] if r]
    if len(ratios) > 1:
        notes.append(f"per-round speedups ranged from {min(ratios):.3g}x to {max(ratios):.3g}x")
    if paired is not None:
        line = (
            f"paired over the rounds: {paired['median']:.3g}x (95% CI {paired['ci_low']:.3g}–{paired['ci_high']:.3g})"
            ", the median of the per-round ratios, which cancels drift slower than a round"
        )
        pooled = speedup["median"]
        if pooled is not None and not paired["ci_low"] <= pooled <= paired["ci_high"]:
            line += (
                f"; the pooled {pooled:.3g}x lies outside it: the step's speed drifted between rounds (a host-bound "
                "step on a host whose speed varies), so prefer the paired figure"
            )
        notes.append(line)
    elif len(ratios) > 1 and max(ratios) > 1.1 * min(ratios):
        notes.append(
            "the rounds disagree by more than 10%: time more, shorter rounds (e.g. --rounds 60 --steps 2) for a "
            f"paired speedup (from {MIN_PAIRED_ROUNDS} rounds), which pairs before and after closely in time"
        )
    for side in (before, after):
        spread = spread_note(side.get("step_time_p10_us"), side.get("step_time_p90_us"), TIME_LONGER_OPTIONS)
        if spread:
            notes.append(f"{'before' if side is before else 'after'}: {spread}")
    if not cuda:
        notes.append(
            "no CUDA GPU: the model ran on the CPU, so there is no NVML energy, no GPU memory figure and no kernel "
            "diff; fixes that need a GPU were refused"
        )
    elif measured["before"].energy_mj is None:
        notes.append(f"no energy figures: NVML not available ({nvml_reason})")
    else:
        from gpuadvisor.capture.nvml import MIN_COUNTER_SPAN_S

        unmeasured = [(name, measured[name].energy_not_measured()) for name in SIDES]
        unmeasured = [(name, reason) for name, reason in unmeasured if reason]
        for name, reason in unmeasured:
            advice = (
                "; time more steps or rounds (--steps, --rounds) to measure it"
                if measured[name].wall_s < 4 * MIN_COUNTER_SPAN_S
                else ""
            )
            notes.append(f"{name}: energy per step {reason}{advice}")
        if not unmeasured and min(measured["before"].wall_s, measured["after"].wall_s) < 4 * MIN_COUNTER_SPAN_S:
            notes.append(
                "energy per step is rough: NVML's energy counter advances about every 100 ms and a side's timed "
                "blocks lasted under 2 s in all; time more steps or rounds (--steps, --rounds) for a better figure"
            )
    if not applied_ids:
        notes.append(
            "no fix was applied: the after side runs the same code as the before side, so the speedup shows "
            "only the measurement's own noise"
            + (" (auto: the findings recommend no fix the registry has)" if auto and not fix_ids else "")
        )
    elif len(applied_ids) > 1:
        notes.append(
            f"the measured saving is for the applied fixes together ({', '.join(applied_ids)}); each fix's predicted "
            "saving comes from the findings that recommend it"
        )
    if after_report is None:
        notes.append(
            "the after run was not profiled (--no-profile-after): no kernel diff; summary, kernels and findings "
            "hold the after run's timing only"
        )

    diff = None
    if before_report and after_report and (before_report.get("kernels") or after_report.get("kernels")):
        diff = kernel_diff(before_report, after_report, graph_replay)

    base = after_report or {}
    summary = dict(base.get("summary") or measured["after"].summary or {})
    summary["speedup"] = speedup["median"]
    summary["before_step_time_us"] = before_us
    env_out = base.get("env") or (before_report or {}).get("env") or env
    peaks = (
        base.get("peaks")
        or (before_report or {}).get("peaks")
        or {
            "gpu": None,
            "known": False,
            "source": None,
            "hbm_bytes_per_s": None,
            "flops_per_s": {},
        }
    )
    sections = {
        "source": {
            "path": str(out_dir / REPORT_JSON),
            "model": str(model_path),
            "fixes_requested": fix_text,
            "fix_ids": list(fix_ids),
            "before_trace": str(out_dir / BEFORE_TRACE) if before_report else None,
            "after_trace": str(out_dir / AFTER_TRACE) if after_report else None,
        },
        "env": env_out,
        "peaks": peaks,
        "summary": summary,
        "kernels": base.get("kernels") or [],
        "kernel_classes": base.get("kernel_classes") or {},
        "cpu_ops": base.get("cpu_ops") or [],
        "findings": base.get("findings") or [],
        "skipped_rules": base.get("skipped_rules") or [],
        "before": before,
        "after": after,
        "fixes": fixes,
        "speedup": speedup,
        "saving": saving,
        "kernel_diff": diff,
        "search": search_section(search),
        "keep": keep,
        "notes": notes,
    }
    return assemble_report("apply", sections)

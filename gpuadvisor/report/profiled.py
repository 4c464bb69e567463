"""The report of a profiled run (``profile``, and each side of ``apply``): the trace's analysis, with the step
figures of the runs timed without the profiler in place of the profiled ones.

:func:`analyze_run` reads the trace the profiled steps left and runs the same analysis as ``gpuadvisor analyze``
(:func:`gpuadvisor.pipeline.analyze_trace_object`); then the summary's step-time figures are replaced by the timed
ones (:func:`use_timed_steps`) and every finding's saving is re-derived against the timed step
(:func:`rescale_savings`: the profiler stretches an eager step several times, mostly as idle time between
kernels). A trace with no GPU work gives the CPU-only report (timed steps and the CPU operators; the GPU analyses
are skipped and a note says which). Torch is not imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuadvisor.stats import finite_round

if TYPE_CHECKING:
    from gpuadvisor.capture.timing import StepTimes

TRACE_FILE = "trace.json.gz"
# The options of `profile` that time longer, as the notes advise them (`apply` passes its own).
TIME_LONGER_OPTIONS = "--min-time, --steps"
# CPU operators listed in a CPU-only report, by self time.
TOP_CPU_OPS = 25
SKIPPED_ON_CPU = "roofline, GPU busy/idle, transfers, NVML (clocks, power, energy)"

# The summary keys of report/build.py (schema v1), for the CPU-only report that does not go through it.
_SUMMARY_KEYS = (
    "steps",
    "step_time_us",
    "samples_us",
    "step_time_source",
    "gpu_busy_us",
    "gpu_busy_pct",
    "kernels_per_step",
    "idle_launch_us",
    "idle_sync_us",
    "idle_other_us",
    "host_syncs_per_step",
    "launch_calls_per_step",
    "launch_call_us_per_step",
    "median_queue_depth",
    "kernels_shorter_than_launch_pct",
    "memcpy_us_per_step",
    "kernel_us_per_step",
    "top_finding",
    "combined_saving_us",
    "combined_saving_pct",
    "combined_upper_bound_us",
    "combined_upper_bound_pct",
    "combined_saving_basis",
)


@dataclass
class RunFacts:
    """What the run measured outside the trace, for the report."""

    model_path: Path
    out_dir: Path
    times: StepTimes
    tokens_per_step: int | None
    nvml_summary: dict[str, Any] | None
    nvml_reason: str
    memory: dict[str, int]
    profiled_steps: int


def analyze_run(
    trace_path: Path,
    facts: RunFacts,
    env: dict[str, Any],
    *,
    rules,
    peaks_file,
    cuda: bool,
    time_longer: str = TIME_LONGER_OPTIONS,
) -> dict:
    """The report of one profiled run. ``time_longer``: the options the notes advise for timing longer (``apply``
    passes its own: it has no --min-time)."""
    from gpuadvisor.trace.kineto import load_trace

    trace = load_trace(trace_path)
    if not trace.has_gpu_activity:
        why = (
            "CUDA is available, but the profiled steps ran no GPU work: the model runs on the CPU"
            if cuda
            else "no CUDA GPU: the model ran on the CPU"
        )
        return _cpu_report(trace, facts, env, rules, why)

    from gpuadvisor.pipeline import analyze_trace_object

    report = analyze_trace_object(trace, peaks_file=peaks_file, rules=rules, command="profile", env=env)
    use_timed_steps(report, facts)
    rescale_savings(report, rules)
    report["source"]["path"] = str(facts.out_dir / TRACE_FILE)
    report["source"]["model"] = str(facts.model_path)
    notes = [
        f"step times: {facts.times.source} (median of {len(facts.times.samples_us)}); the figures per step from the "
        f"trace (GPU busy, idle, kernels) come from {facts.profiled_steps} profiled step(s), "
        f"{_ratio_text(report['summary'].get('profiler_slowdown'))}",
    ]
    spread = spread_note(facts.times.p10_us, facts.times.p90_us, time_longer)
    if spread:
        notes.append(spread)
    if facts.nvml_summary is None:
        notes.append(f"NVML not sampled ({facts.nvml_reason}): no clocks, power or energy; nvml.csv not written")
    else:
        from gpuadvisor.capture.nvml import MIN_COUNTER_SPAN_S

        duration = facts.nvml_summary.get("duration_s")
        energy = f"energy per step = average power ({facts.nvml_summary.get('energy_source')}) x mean step time"
        if facts.nvml_summary.get("energy_j_per_step") is None:
            energy = f"energy per step {facts.nvml_summary.get('energy_source') or 'not measured'}"
            if duration is not None and duration < 2 * MIN_COUNTER_SPAN_S:
                energy += f"; time longer ({time_longer}) to measure it"
        elif duration is not None and duration < 2 * MIN_COUNTER_SPAN_S:
            energy += (
                f"; the timed phase lasted only {duration:.2f} s and NVML's power and energy readings advance about "
                f"every 100 ms, so they are rough: time longer ({time_longer}) for better ones"
            )
        notes.append(energy)
    report["notes"] = notes + report["notes"]
    return report


def _ratio_text(slowdown: float | None) -> str:
    if slowdown is None:
        return "whose step time is not comparable"
    return f"each {slowdown:.1f}x as long as a timed step"


# Above this p90/p10 ratio the step times are too unsteady to compare one run with another at a 5%
# threshold: an eager decode step on a shared H200 host moved between 5.5 and 12.5 ms within one run.
UNSTEADY_SPREAD = 1.2


def spread_note(p10: float | None, p90: float | None, time_longer: str = TIME_LONGER_OPTIONS) -> str | None:
    """A warning when the timed steps vary widely (host contention, clock changes, a launch-bound step);
    ``time_longer`` names the options that time longer in the command that prints it."""
    if not p10 or not p90 or p90 / p10 <= UNSTEADY_SPREAD:
        return None
    return (
        f"step times vary widely (p10 {p10:,.0f} µs, p90 {p90:,.0f} µs, {100 * (p90 / p10 - 1):.0f}% apart): "
        "something else competes for the host or the GPU, or the step is bound by the host's launch rate; time "
        f"longer ({time_longer}) and compare several runs with `gpuadvisor compare`, which tests every sample"
    )


def timed_summary(facts: RunFacts) -> dict[str, Any]:
    times = facts.times
    median = times.median_us
    summary: dict[str, Any] = {
        "step_time_us": finite_round(median),
        "step_time_p10_us": finite_round(times.p10_us),
        "step_time_p90_us": finite_round(times.p90_us),
        "samples_us": [finite_round(x) for x in times.samples_us],
        "step_time_source": times.source,
        "timed_steps": len(times.samples_us),
        "timing_wall_s": finite_round(times.wall_s, 3),
        "optimizer_step_host_us": finite_round(times.optimizer_step_median_us),
        "host_enqueue_us": finite_round(times.host_median_us),
        "tf32_step_delta_us": finite_round(times.tf32_step_delta_median_us),
        "tf32_step_delta_rounds": len(times.tf32_step_delta_us) or None,
        "tokens_per_s": finite_round(facts.tokens_per_step * 1e6 / median, 1)
        if facts.tokens_per_step and median
        else None,
    }
    summary.update(facts.memory)
    if facts.nvml_summary is not None:
        nvml = facts.nvml_summary
        summary.update(
            energy_j_per_step=finite_round(nvml["energy_j_per_step"], 4),
            energy_source=nvml["energy_source"],
            power_w_average=finite_round(nvml["power_w_average"], 1),
            power_w_median=finite_round(nvml["power_w_median"], 1),
            temperature_c_max=nvml["temperature_c_max"],
            throttle_reasons=nvml["throttle_reasons"],
            nvml_samples=nvml["samples"],
        )
    return summary


def use_timed_steps(report: dict, facts: RunFacts) -> None:
    summary = report["summary"]
    trace_step = summary.get("step_time_us")
    summary["trace_step_time_us"] = trace_step
    summary.update(timed_summary(facts))
    median = summary["step_time_us"]
    summary["profiler_slowdown"] = finite_round(trace_step / median, 2) if trace_step and median else None


def rescale_savings(report: dict, rules) -> None:
    """Express every finding's saving against the timed median step instead of the profiled one.

    Each rule's detector owns how its saving re-derives (:func:`gpuadvisor.rules.engine.retime_saving`):
    savings in kernel or copy time stay as they are (the profiler does not change a kernel's duration);
    the idle time after host syncs scales by timed / profiled step; the launch-bound saving is recomputed as
    timed step - (GPU busy + kernels x the per-kernel cost left inside a CUDA graph); the kernel savings of
    channels_last (GA203) and bf16 autocast (GA302) are capped by the host's time to enqueue the step plus
    what the fix adds to it (:func:`gpuadvisor.rules.detectors_model.host_capped_saving`), and TF32's (GA301)
    too, unless the profile timed the step with TF32 on and off (``tf32_step_delta_us``). All are clipped to
    0 ... timed step, the findings re-ranked and the combined estimate recomputed.
    """
    summary = report["summary"]
    timed = summary.get("step_time_us")
    profiled = summary.get("trace_step_time_us")
    findings = report.get("findings") or []
    if not timed or not findings:
        return
    by_id = {rule.id: rule for rule in rules}
    from gpuadvisor.rules.engine import combined_estimate, rank_key, retime_saving

    for finding in findings:
        saving = retime_saving(finding, by_id.get(finding["rule_id"]), float(timed), profiled, summary)
        finding["estimated_saving_us_per_step"] = round(saving, 1)
        finding["estimated_saving_pct"] = round(100.0 * saving / timed, 1)
    timed_alone = [f["rule_id"] for f in findings if "tf32_step_delta_us" in (f.get("evidence") or {})]
    capped = [
        f["rule_id"]
        for f in findings
        if "expected_alone_us" in (f.get("evidence") or {}) and f["rule_id"] not in timed_alone
    ]
    findings.sort(key=rank_key)
    summary["top_finding"] = findings[0]["rule_id"]
    summary.update(combined_estimate(findings, summary))
    report["notes"].append(
        f"savings were rescaled to the timed step ({timed:,.0f} µs): kernel and copy time as measured, idle time "
        f"after host syncs scaled by timed / profiled step ({profiled or 0:,.0f} µs), the launch-bound saving "
        "recomputed as timed step - (GPU busy + kernels x per-kernel graph cost)"
        + (
            f", {' and '.join(capped)}'s kernel saving capped by the host's {summary['host_enqueue_us']:,.0f} µs "
            "to enqueue the step (plus what the fix adds to it)"
            if capped
            else ""
        )
        + (
            f", {' and '.join(timed_alone)}'s saving timed with TF32 on and off in a loop of the step"
            if timed_alone
            else ""
        )
    )


# --- CPU-only report ----------------------------------------------------------------------------


def cpu_op_table(trace, top: int = TOP_CPU_OPS) -> tuple[list[dict[str, Any]], int, list[float]]:
    """The CPU operators of the profiled steps, by self time: (rows, steps, each step's duration in µs).

    Rows: {name, count, count_per_step, self_us, total_us, per_step_us (self time per step),
    total_per_step_us}. Self time is an operator's time minus that of the operators it called, on its
    own thread. Operators outside the ProfilerStep annotations (the harness) are left out.
    """
    windows = sorted(zip(trace.steps["ts_us"], trace.steps["end_us"]))
    ops = trace.cpu_ops
    if windows:
        from gpuadvisor.analysis.linking import assign_steps

        ops = ops[assign_steps(ops["ts_us"].to_numpy(float), trace.steps.sort_values("ts_us")) >= 0]
    steps = len(windows) or 1
    totals: dict[str, list[float]] = {}  # name -> [count, self_us, total_us]
    for _, thread_ops in ops.groupby("tid", sort=False):
        stack: list[list] = []  # [end_us, name, dur_us, children_us]
        ordered = thread_ops.assign(neg_dur=-thread_ops["dur_us"]).sort_values(["ts_us", "neg_dur"], kind="stable")
        for name, start, duration in zip(ordered["name"], ordered["ts_us"], ordered["dur_us"]):
            while stack and stack[-1][0] <= start:
                _close(stack.pop(), totals)
            if stack:
                stack[-1][3] += duration
            stack.append([start + duration, name, duration, 0.0])
        while stack:
            _close(stack.pop(), totals)
    rows = [
        {
            "name": name,
            "count": int(count),
            "count_per_step": finite_round(count / steps),
            "self_us": finite_round(self_us),
            "total_us": finite_round(total_us),
            "per_step_us": finite_round(self_us / steps),
            "total_per_step_us": finite_round(total_us / steps),
        }
        for name, (count, self_us, total_us) in totals.items()
    ]
    rows.sort(key=lambda row: -row["self_us"])
    return rows[:top], steps, [float(t1 - t0) for t0, t1 in windows]


def _close(entry: list, totals: dict[str, list[float]]) -> None:
    _, name, duration, children = entry
    row = totals.setdefault(str(name), [0, 0.0, 0.0])
    row[0] += 1
    row[1] += max(0.0, duration - children)
    row[2] += duration


def _cpu_report(trace, facts: RunFacts, env: dict, rules, why: str) -> dict[str, Any]:
    """The report of a run without GPU work: timed steps and CPU operators; schema keys as build_report's."""
    from gpuadvisor.report.schema import assemble_report
    from gpuadvisor.stats import percentile

    cpu_ops, steps, step_durations = cpu_op_table(trace)
    summary: dict[str, Any] = {key: None for key in _SUMMARY_KEYS}
    summary.update(timed_summary(facts))
    summary["steps"] = steps
    summary["trace_step_time_us"] = finite_round(percentile(step_durations, 50))
    if summary["trace_step_time_us"] and summary["step_time_us"]:
        summary["profiler_slowdown"] = finite_round(summary["trace_step_time_us"] / summary["step_time_us"], 2)
    summary["cpu_op_self_us_per_step"] = (
        finite_round(sum(row["self_us"] for row in cpu_ops) / steps) if cpu_ops else None
    )
    env = {
        "gpu_name": None,
        "sm_count": None,
        "compute_capability": None,
        "driver": None,
        "cuda": None,
        "torch": None,
        "triton": None,
        "clocks": None,
        **env,
    }
    env["device"] = "cpu"
    skipped_reason = "no GPU kernels: the model ran on the CPU"
    sections = {
        "source": {
            "path": str(facts.out_dir / TRACE_FILE),
            "model": str(facts.model_path),
            "ranks": list(trace.ranks),
            "events": trace.event_count,
            "size_bytes": trace.size_bytes,
        },
        "env": env,
        "peaks": {"gpu": None, "known": False, "source": None, "hbm_bytes_per_s": None, "flops_per_s": {}},
        "summary": summary,
        "steps": [],
        "timeline": None,  # no GPU activity to draw
        "kernels": [],
        "kernel_classes": {},
        "transfers": [],
        "host_syncs": [],
        "cpu_ops": cpu_ops,
        "findings": [],
        "skipped_rules": [{"rule_id": rule.id, "reason": skipped_reason} for rule in rules],
        "notes": [
            f"{why}. Step times: {facts.times.source}. The profiler recorded CPU activity only, so these GPU "
            f"analyses were skipped: {SKIPPED_ON_CPU}. cpu_ops lists the {len(cpu_ops)} CPU operators with the "
            f"most self time in the {steps} profiled step(s)."
        ],
    }
    return assemble_report("profile", sections)

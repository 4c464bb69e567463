"""``gpuadvisor apply model.py --fix graphs,fusion,fp8|auto``: apply fixes, check numerics, re-measure, report.

Phases (a rich progress display on stderr when ``progress`` is on):

1. build and warm-up, as ``profile`` does (:mod:`gpuadvisor.profile`);
2. before-profile: ``torch.profiler`` over a few steps of the original workload (``before_trace.json.gz``).
   With ``--fix auto`` its findings name the fixes to try (each finding's ``fix_id``);
3. fixes: :func:`gpuadvisor.fixes.registry.apply_fixes` checks, applies in order, runs the numerics guard
   against the original and rolls back a fix that fails it; the original workload is never modified.
   With ``--fix auto`` on a GPU, :func:`gpuadvisor.search.run_search` does this for each candidate stack and
   keeps the fastest that passes (the report's ``search`` section lists them all; ``budget_s`` bounds it).
   Then the patched workload is warmed up (graph capture, compilation, autotuning happen here);
4. timing: before and after in the same process, in ``rounds`` interleaved blocks of ``steps`` steps each
   (round 1 before then after, round 2 after then before, ...), so drift in clocks, temperature or host
   load falls on both sides alike. Each step is timed with CUDA events and no profiler
   (:func:`gpuadvisor.capture.timing.time_steps`; on the CPU ``time.perf_counter``). Around each block the
   allocator's peak is reset and read, and NVML's total-energy counter is read (energy per step = the
   counter's rise over a side's blocks / its steps);
5. after-profile (``profile_after``): the patched workload under the profiler (``after_trace.json.gz``), for
   the per-kernel diff;
6. analysis: both traces through the same analysis as ``profile`` (savings rescaled to each side's timed
   median), then the before/after report.

The speedup is median(before) / median(after) over all timed steps of each side, with a 95% confidence
interval from a percentile bootstrap (:func:`gpuadvisor.stats.speedup_interval`: ``scipy.stats.bootstrap``,
each side's per-step samples resampled on their own; a NumPy bootstrap of the same kind when SciPy is missing).
The per-round ratios are kept too, as a check that the rounds agree, and from 6 rounds on their median with a
bootstrap interval over the rounds (``speedup.paired``, :func:`gpuadvisor.stats.paired_speedup`): each ratio
compares two blocks timed back to back, so a host whose speed drifts over seconds (a shared vCPU) moves both
alike. On a host-bound step, many short rounds (``--rounds 60 --steps 2``) make that pairing tight.

Outputs, in ``out_dir`` (default ``gpuadvisor-out/<model file stem>-apply``): ``report.json``,
``report.md``, ``report.html``, ``before_trace.json.gz`` and ``after_trace.json.gz`` (without ``profile_after`` only the
first). They are written into a temporary folder beside ``out_dir`` and renamed into place at the end:
an error, a ``--strict`` refusal or Ctrl-C leaves no output folder and no temporary one.

report.json (schema v1, ``command: "apply"``): the top-level ``summary``, ``kernels``, ``kernel_classes``,
``findings`` and ``skipped_rules`` describe the AFTER run (so ``gpuadvisor compare before/report.json
apply/report.json`` gates on the patched model), ``peaks`` and ``env`` the machine; on top of those:

``before`` / ``after``  {step_time_us (median), step_time_p10_us, step_time_p90_us, samples_us [every timed
                        step], round_medians_us, step_time_source, timed_steps, tokens_per_s, kernels_per_step,
                        launch_calls_per_step, gpu_busy_us, gpu_busy_pct, energy_j_per_step, energy_source,
                        peak_memory_bytes (allocated), peak_memory_reserved_bytes, kernel_classes, findings,
                        trace (file name or null), profiled (bool), notes}
``fixes``               [FixOutcome.to_dict() + measured_saving_us, measured_together_with [fix ids]]
``speedup``             {median, ci_low, ci_high, confidence, method, round_ratios [per round], samples_before,
                        samples_after, paired (null below 6 rounds; else {median, ci_low, ci_high, rounds,
                        method}: the median of the per-round ratios, bootstrapped over rounds)}
``saving``              {predicted_us (the findings the applied fixes address, combined as shares of the step:
                        ``combined_saving``), predicted_basis, measured_us (before median -
                        after median, all applied fixes together), measured_pct (of the before median)}
``kernel_diff``         null on the CPU or without the after-profile; else {kernels_per_step, launch_calls_per_step,
                        gpu_busy_us (each {before, after}), classes_us_per_step {class: {before, after}},
                        disappeared, appeared [{name, us_per_step, count_per_step}], complete (bool), graph_replay
                        (null, or {kernels_per_step, us_per_step, relabelled_launch_us_per_step}), notes}
``search``              null unless ``--fix auto`` ran on a GPU; else {candidates [{fixes, applied, step_us, status
                        (kept | slower | nothing applied | duplicate | skipped), why, apply_s, outcomes}], winner (index
                        or null), original_us, wall_s, method}
``keep``                the two lines that keep the applied fixes in the user's code ([] when none applied)
``source``              {model, fixes_requested, fix_ids, before_trace, after_trace}

Torch is imported inside the functions.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuadvisor.environment import run_environment
from gpuadvisor.errors import BadInputError
from gpuadvisor.outputs import check_out_dir, staged_output
from gpuadvisor.profile import DEFAULT_OUT_ROOT
from gpuadvisor.progress import ProgressDisplay
from gpuadvisor.report.apply_report import (
    AFTER_TRACE,
    BEFORE_TRACE,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MD,
    SIDES,
    TIME_LONGER_OPTIONS,
    build_apply_report,
)
from gpuadvisor.report.profiled import RunFacts, analyze_run, timed_summary
from gpuadvisor.steps import (
    StepRunner,
    build_workload,
    record_profile,
    sampling_while_timing,
    step_runner,
    user_stdout_to_stderr,
    warm_up,
)
from gpuadvisor.workload import user_defined_step

if TYPE_CHECKING:
    from gpuadvisor.capture.nvml import NvmlSampler
    from gpuadvisor.capture.timing import StepTimes

__all__ = ["TIME_LONGER_OPTIONS", "SideMeasurement", "StrictRefusalError", "build_apply_report", "run_apply"]

APPLY_FILES = frozenset({BEFORE_TRACE, AFTER_TRACE, REPORT_JSON, REPORT_MD, REPORT_HTML})

DEFAULT_WARMUP = 5
DEFAULT_STEPS = 20  # per side and round: 5 rounds x 20 = 100 timed steps a side (DESIGN.md: at least 20)
DEFAULT_ROUNDS = 5
DEFAULT_PROFILED_STEPS = 3
# Steps per timed block, after it, timed on the host clock from an idle GPU (capture.timing.probe_host): the
# host's time per step, which bounds what a fix that only shortens kernels can save (rules GA203, GA302).
HOST_PROBES_PER_BLOCK = 2
# With many short rounds (--rounds 60 --steps 2, the paired timing of a host-bound step) probing after every
# block would double the timing's length for no better figure: the probes run after every k-th block only, so
# that at most this many blocks a side are probed.
MAX_PROBED_BLOCKS = 20


class StrictRefusalError(BadInputError):
    """``--strict`` and a requested fix was refused, rolled back or failed. Exit code 2."""


def default_out_dir(model_path: str | os.PathLike[str]) -> Path:
    """``gpuadvisor-out/<model file stem>-apply`` in the current folder (beside profile's ``<stem>``)."""
    return DEFAULT_OUT_ROOT / f"{Path(model_path).stem}-apply"


# --- the run ------------------------------------------------------------------------------------


def run_apply(
    model_path: str | os.PathLike[str],
    fix_text: str,
    *,
    entry: str | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    warmup: int = DEFAULT_WARMUP,
    steps: int = DEFAULT_STEPS,
    rounds: int = DEFAULT_ROUNDS,
    profiled_steps: int = DEFAULT_PROFILED_STEPS,
    strict: bool = False,
    rules: str | os.PathLike[str] | None = None,
    peaks_file: str | os.PathLike[str] | None = None,
    progress: bool = True,
    profile_after: bool = True,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """Apply the fixes ``fix_text`` names ("graphs,fusion", or "auto": on a GPU a measured search over the stacks
    the findings suggest and torch.compile, gpuadvisor.search; on the CPU the findings' fixes, none) to the
    workload in ``model_path``, re-measure before and after, and return the report dict (module docstring),
    written to ``out_dir`` as well.

    Raises :class:`BadInputError` (exit 2) for a bad file, flag, fix id or output folder, and
    :class:`StrictRefusalError` (exit 2) with ``strict`` when a requested fix did not apply;
    :class:`UserCodeError` (exit 3) when the user's code fails. KeyboardInterrupt propagates after cleaning
    up; nothing is left behind.
    """
    from gpuadvisor.device.peaks import lookup_peaks
    from gpuadvisor.rules.engine import load_rules

    for name, value, least in (
        ("warmup", warmup, 0),
        ("steps", steps, 1),
        ("rounds", rounds, 1),
        ("profiled_steps", profiled_steps, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise BadInputError(f"{name} must be an int >= {least}, got {value!r}")
    from gpuadvisor.search import DEFAULT_BUDGET_S

    if budget_s is None:
        budget_s = DEFAULT_BUDGET_S
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s >= 0:
        raise BadInputError(f"budget must be a number of seconds >= 0, got {budget_s!r}")
    from gpuadvisor.dependencies import require_torch

    require_torch("apply")  # gpuadvisor's own dependency (exit 2), before the model's imports could miss it (3)
    registry = _fix_core()
    text = fix_text if isinstance(fix_text, str) else ""
    auto = "auto" in (item.strip().lower() for item in text.split(","))
    fix_ids = list(registry.resolve_fix_ids(text, []))  # a typo fails before the model runs
    model_path = Path(model_path)
    rule_set = load_rules(rules)
    if peaks_file is not None:
        lookup_peaks(None, peaks_file)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(model_path)
    check_apply_out_dir(out_dir)

    with user_stdout_to_stderr(), ProgressDisplay(progress) as display:
        workload, label = build_workload(model_path, entry, display)

        import torch

        cuda = torch.cuda.is_available()
        run_before = step_runner(workload.step_fn)
        warm_up(run_before, "warm-up", warmup, display, cuda, label)

        with staged_output(out_dir, check_apply_out_dir) as staged:
            staging = staged.path
            before_trace = record_profile(workload, run_before, staging / BEFORE_TRACE, profiled_steps, display)
            search = None
            if auto:
                display.phase("findings (before)")
                recommended = _recommended(before_trace, rule_set, peaks_file)
                fix_ids = list(registry.resolve_fix_ids(text, recommended))
            if auto and cuda:
                from gpuadvisor.search import candidate_stacks, run_search

                explicit = list(registry.resolve_fix_ids(text, []))
                stacks = candidate_stacks(recommended, explicit, registry.fix_order())
                search = run_search(
                    workload,
                    stacks,
                    budget_s=float(budget_s),
                    cuda=cuda,
                    phase=display.phase,
                    make_runner=lambda w: step_runner(w.step_fn),
                )
                patched, outcomes = search.patched, search.outcomes
                if search.winner is not None:
                    fix_ids = list(stacks[search.winner])
            else:
                display.phase("applying fixes")
                patched, outcomes = registry.apply_fixes(
                    workload, fix_ids, guard=True, progress=lambda *parts: display.phase(" ".join(map(str, parts)))
                )
            not_applied = [o for o in outcomes if o.status != "applied"]
            if search is not None:
                # The search tries stacks that overlap; a fix refused in one candidate while another candidate
                # won is an answer, not a failure. --strict with auto: fail only when the search kept nothing.
                not_applied = not_applied if search.winner is None else []
            if strict and search is not None and search.winner is None and not not_applied:
                raise StrictRefusalError("--strict: --fix auto kept nothing: no candidate beat the original step")
            if strict and not_applied:
                raise StrictRefusalError(
                    "--strict: "
                    + "; ".join(
                        f"{o.fix_id} {o.status.replace('_', ' ')}: {o.reason or 'no reason given'}" for o in not_applied
                    )
                )
            applied_ids = [o.fix_id for o in outcomes if o.status == "applied"]
            run_after = step_runner(patched.step_fn)
            warm_up(run_after, "warm-up (after fixes)", warmup, display, cuda, label)

            sampler, nvml_reason = None, "no CUDA GPU"
            if cuda:
                from gpuadvisor.capture.nvml import open_sampler

                sampler, nvml_reason = open_sampler(torch.cuda.current_device())
            measured = measure_sides(
                {"before": run_before, "after": run_after}, steps, rounds, cuda, sampler, display, label
            )
            if cuda:  # GA301's estimate on the before side: TF32 timed on and off where the host may bound it
                from gpuadvisor.profile import tf32_step_delta

                before = measured["before"]
                before.tf32_step_delta_us = tf32_step_delta(
                    workload, run_before, rounds * steps, display, before.step_times()
                )

            after_trace = None
            if profile_after:
                after_trace = record_profile(patched, run_after, staging / AFTER_TRACE, profiled_steps, display)

            display.phase("analysis")
            nvml_phase = None
            if sampler is not None:
                from gpuadvisor.capture.nvml import summarize

                nvml_phase = summarize(sampler, measured["before"].samples_us + measured["after"].samples_us)
            env = run_environment(cuda, sampler.driver if sampler is not None else None, nvml_phase)
            side_reports: dict[str, dict[str, Any] | None] = {}
            for side, trace_path, side_workload in (
                ("before", before_trace, workload),
                ("after", after_trace, patched),
            ):
                facts = RunFacts(
                    model_path=model_path,
                    out_dir=out_dir,
                    times=measured[side].step_times(),
                    tokens_per_step=side_workload.tokens_per_step,
                    nvml_summary=measured[side].nvml_summary(sampler, nvml_phase),
                    nvml_reason=nvml_reason,
                    memory=measured[side].memory(cuda),
                    profiled_steps=profiled_steps,
                )
                if trace_path is None:
                    side_reports[side] = None
                    measured[side].summary = timed_summary(facts)
                    continue
                side_report = analyze_run(
                    trace_path,
                    facts,
                    env,
                    rules=rule_set,
                    peaks_file=peaks_file,
                    cuda=cuda,
                    time_longer=TIME_LONGER_OPTIONS,
                )
                side_report["source"]["path"] = str(out_dir / trace_path.name)
                side_reports[side] = side_report
                measured[side].summary = side_report["summary"]

            graph_replay = None
            if after_trace is not None and cuda and side_reports["after"] and side_reports["after"].get("kernels"):
                from gpuadvisor.analysis.graph_replay import graph_replay_facts

                graph_replay = graph_replay_facts(after_trace, peaks_file)
            report = build_apply_report(
                with_step=user_defined_step(workload.step),
                model_path=model_path,
                out_dir=out_dir,
                fix_text=text,
                fix_ids=fix_ids,
                outcomes=outcomes,
                applied_ids=applied_ids,
                measured=measured,
                side_reports=side_reports,
                env=env,
                cuda=cuda,
                nvml_reason=nvml_reason,
                graph_replay=graph_replay,
                steps=steps,
                rounds=rounds,
                auto=auto,
                search=search,
            )
            from gpuadvisor.outputs import write_files
            from gpuadvisor.report.apply_sections import render_apply_markdown
            from gpuadvisor.report.json import to_json
            from gpuadvisor.report.write import render_html

            written = sorted([p.name for p in staging.iterdir()] + [REPORT_JSON, REPORT_MD, REPORT_HTML])
            report["notes"].append(f"wrote {out_dir}: {', '.join(written)}")
            files = {
                REPORT_JSON: to_json(report),
                REPORT_MD: render_apply_markdown(report),
                REPORT_HTML: render_html(report),
            }
            write_files(staging, files)
            staged.publish()
    return report


def check_apply_out_dir(out_dir: Path) -> None:
    """Refuse an ``out_dir`` holding anything but an earlier apply's outputs."""
    check_out_dir(out_dir, APPLY_FILES, "apply")


def _fix_core():
    """The fix registry module (imported here: it imports torch-side code of the fixes)."""
    try:
        from gpuadvisor.fixes import registry
    except ImportError as error:
        raise BadInputError(f"the fix registry (gpuadvisor.fixes.registry) cannot be imported: {error}") from error
    return registry


def _recommended(trace_path: Path, rules, peaks_file) -> list[str]:
    """The fix ids the findings of the before trace recommend, largest saving first (none on the CPU)."""
    from gpuadvisor.trace.kineto import load_trace

    trace = load_trace(trace_path)
    if not trace.has_gpu_activity:
        return []
    from gpuadvisor.pipeline import analyze_trace_object

    report = analyze_trace_object(trace, peaks_file=peaks_file, rules=rules, command="apply")
    recommended = list(dict.fromkeys(f["fix_id"] for f in report.get("findings") or [] if f.get("fix_id")))
    busy_pct = (report.get("summary") or {}).get("gpu_busy_pct")
    if "graphs" in recommended and busy_pct and busy_pct < 100:
        # Under a CUDA graph the launch gaps go and the step shrinks to the GPU's busy time: a kernel-level
        # finding too small against today's launch-bound step (an unfused chain at 2% of a 10 ms decode step)
        # is its share of what remains (18% of 1.1 ms). Judge those rules against the step after the graph.
        from gpuadvisor.rules.engine import load_rules

        after_graph = _rules_after_graph(rules or load_rules(), busy_pct)
        report = analyze_trace_object(trace, peaks_file=peaks_file, rules=after_graph, command="apply")
        recommended += [
            f["fix_id"] for f in report.get("findings") or [] if f.get("fix_id") and f["fix_id"] not in recommended
        ]
    return recommended


# Rules whose threshold is a share of the step: scaled to the step a graph leaves when `auto` plans one.
STEP_SHARE_THRESHOLD = "min_share_of_step_pct"


def _rules_after_graph(rules, gpu_busy_pct: float):
    """``rules`` with each fixable rule's share-of-step threshold scaled by the GPU's busy share of the step."""
    import dataclasses

    scaled = []
    for rule in rules:
        if rule.fix_id not in (None, "graphs") and STEP_SHARE_THRESHOLD in rule.thresholds:
            thresholds = dict(rule.thresholds)
            thresholds[STEP_SHARE_THRESHOLD] = thresholds[STEP_SHARE_THRESHOLD] * gpu_busy_pct / 100.0
            rule = dataclasses.replace(rule, thresholds=thresholds)
        scaled.append(rule)
    return scaled


# --- measuring ----------------------------------------------------------------------------------


@dataclass
class SideMeasurement:
    """One side's timed blocks: every step sample, each round's median, energy and peak memory."""

    name: str
    samples_us: list[float] = field(default_factory=list)
    round_medians_us: list[float] = field(default_factory=list)
    source: str = ""
    wall_s: float = 0.0
    energy_mj: float | None = 0.0  # None once a block could not read the counter
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    summary: dict[str, Any] | None = None  # the side's report summary, filled after the analysis
    optimizer_step_us: list[float] = field(default_factory=list)  # host time in optimizer.step() per step
    host_us: list[float] = field(default_factory=list)  # host time of a step started with the GPU idle
    tf32_step_delta_us: list[float] = field(default_factory=list)  # TF32 on minus off (profile.tf32_step_delta)

    def add_block(self, times: StepTimes, energy_mj: float | None, allocated: int | None, reserved: int | None):
        from gpuadvisor.stats import percentile

        self.samples_us.extend(times.samples_us)
        self.optimizer_step_us.extend(times.optimizer_step_us)
        self.host_us.extend(times.host_us)
        self.round_medians_us.append(percentile(times.samples_us, 50))
        self.wall_s += times.wall_s
        self.source = times.source
        self.energy_mj = None if energy_mj is None or self.energy_mj is None else self.energy_mj + energy_mj
        if allocated is not None:
            self.peak_allocated_bytes = max(allocated, self.peak_allocated_bytes or 0)
        if reserved is not None:
            self.peak_reserved_bytes = max(reserved, self.peak_reserved_bytes or 0)

    def step_times(self) -> StepTimes:
        from gpuadvisor.capture.timing import StepTimes

        rounds = len(self.round_medians_us)
        per_block = len(self.samples_us) // max(1, rounds)
        source = self.source.split(",")[0] if self.source else "timed"
        if "CPU" in source:
            source = "CPU wall clock (time.perf_counter)"
        text = (
            f"{source}, {rounds} interleaved rounds x {per_block} steps ({len(self.samples_us)} steps), "
            "no profiler" + ("" if "CPU" not in source else ", no CUDA")
        )
        return StepTimes(
            list(self.samples_us),
            text,
            self.wall_s,
            list(self.optimizer_step_us),
            list(self.host_us),
            tf32_step_delta_us=list(self.tf32_step_delta_us),
        )

    def energy_not_measured(self) -> str | None:
        """Why this side has no energy figure (its blocks span less than one update of NVML's energy counter,
        the counter did not advance, or it could not be read), or None when it has one."""
        from gpuadvisor.capture.nvml import NOT_MEASURED, energy_not_measured

        if self.energy_mj is None:
            return f"{NOT_MEASURED}: NVML's energy counter could not be read"
        if not self.samples_us:
            return f"{NOT_MEASURED}: no timed steps"
        reason = energy_not_measured(self.wall_s, self.energy_mj)
        if reason is None:
            return None
        return reason.replace("the timed span", f"this side's {len(self.round_medians_us)} timed blocks", 1)

    def energy_j_per_step(self) -> float | None:
        """The counter's rise over this side's blocks / its steps; None when not measured (never a 0 read off
        a counter that did not tick)."""
        if self.energy_not_measured() is not None:
            return None
        return self.energy_mj / 1000.0 / len(self.samples_us)

    def nvml_summary(self, sampler: NvmlSampler | None, phase: dict[str, Any] | None) -> dict[str, Any] | None:
        """The phase's NVML summary (clocks, temperature, throttling over both sides) with this side's energy:
        the counter's rise over this side's blocks only. When that is not measured, energy_j_per_step and
        power_w_average are None and energy_source says why."""
        if sampler is None or phase is None:
            return None
        summary = dict(phase)
        energy = self.energy_j_per_step()
        summary["energy_j_per_step"] = energy
        summary["energy_source"] = (
            f"NVML energy counter: its rise over this side's {len(self.round_medians_us)} timed blocks "
            f"({self.wall_s:.2f} s) / {len(self.samples_us)} steps"
            if energy is not None
            else self.energy_not_measured()
        )
        summary["power_w_average"] = (
            self.energy_mj / 1000.0 / self.wall_s if energy is not None and self.wall_s else None
        )
        summary["duration_s"] = self.wall_s
        return summary

    def memory(self, cuda: bool) -> dict[str, int]:
        if not cuda or self.peak_allocated_bytes is None:
            return {}
        return {
            "memory_allocated_peak_bytes": self.peak_allocated_bytes,
            "memory_reserved_peak_bytes": self.peak_reserved_bytes,
        }


def _energy_mj(sampler: NvmlSampler | None) -> float | None:
    if sampler is None:
        return None
    value = sampler.sample().energy_mj
    return float(value) if value is not None else None


def measure_sides(
    runners: dict[str, StepRunner],
    steps: int,
    rounds: int,
    cuda: bool,
    sampler: NvmlSampler | None,
    display: ProgressDisplay,
    label: str,
) -> dict[str, SideMeasurement]:
    """Time ``rounds`` rounds of one block of ``steps`` steps per side, alternating which side goes first."""
    import torch

    from gpuadvisor.capture.timing import probe_host, time_steps

    sides = {name: SideMeasurement(name) for name in SIDES}
    gc.collect()  # the garbage of build, fixes and warm-up: no full collection inside the timed blocks
    display.phase("timing before/after", 2 * rounds * steps)
    probe_every = -(-rounds // MAX_PROBED_BLOCKS)  # ceil: at most MAX_PROBED_BLOCKS probed blocks a side
    with sampling_while_timing(sampler, label, cuda):
        for round_index in range(rounds):
            for name in SIDES if round_index % 2 == 0 else SIDES[::-1]:
                run = runners[name]
                phase = f"timing ({name} fixes)"
                offset = round_index * steps
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                energy_start = _energy_mj(sampler)
                times = time_steps(
                    lambda i, run=run, phase=phase, offset=offset: run(phase, offset + i, rounds * steps),
                    steps,
                    cuda=cuda,
                    on_step=display.advance,
                )
                energy_end = _energy_mj(sampler)
                if cuda and round_index % probe_every == 0:
                    times.host_us = probe_host(
                        lambda i, run=run, phase=phase: run(phase, i, rounds * steps), offset, HOST_PROBES_PER_BLOCK
                    )
                energy = energy_end - energy_start if energy_start is not None and energy_end is not None else None
                sides[name].add_block(
                    times,
                    energy,
                    torch.cuda.max_memory_allocated() if cuda else None,
                    torch.cuda.max_memory_reserved() if cuda else None,
                )
    if sampler is None:
        for side in sides.values():
            side.energy_mj = None
    return sides

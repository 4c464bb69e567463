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
interval from a percentile bootstrap (``scipy.stats.bootstrap``, each side's per-step samples resampled on
their own; a NumPy bootstrap of the same kind when SciPy is missing). The per-round ratios are kept too,
as a check that the rounds agree.

Outputs, in ``out_dir`` (default ``gpuadvisor-out/<model file stem>-apply``): ``report.json``,
``report.md``, ``before_trace.json.gz`` and ``after_trace.json.gz`` (without ``profile_after`` only the
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
                        samples_after}
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
import inspect
import os
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuadvisor import __version__
from gpuadvisor.errors import BadInputError, UserCodeError
from gpuadvisor.fixes.coverage import ALSO_ADDRESSES, combined_saving, fix_covers
from gpuadvisor.profile import (
    DEFAULT_OUT_ROOT,
    _analyze,
    _check_out_dir,
    _Display,
    _environment,
    _make_staging,
    _oom_error,
    _publish,
    _record_profile,
    _remove_dirs,
    _round,
    _RunFacts,
    _sampling_while_timing,
    _spread_note,
    _step_runner,
    _synchronize,
    _timed_summary,
)
from gpuadvisor.workload import default_step, load_workload

if TYPE_CHECKING:
    from gpuadvisor.capture.nvml import NvmlSampler
    from gpuadvisor.capture.timing import StepTimes

BEFORE_TRACE = "before_trace.json.gz"
AFTER_TRACE = "after_trace.json.gz"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"
APPLY_FILES = frozenset({BEFORE_TRACE, AFTER_TRACE, REPORT_JSON, REPORT_MD})
SIDES = ("before", "after")

DEFAULT_WARMUP = 5
DEFAULT_STEPS = 20  # per side and round: 5 rounds x 20 = 100 timed steps a side (DESIGN.md: at least 20)
DEFAULT_ROUNDS = 5
DEFAULT_PROFILED_STEPS = 3
CONFIDENCE = 0.95
# 2000 resamples: the interval's ends move by well under 1% between seeds for 100 samples a side.
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # the same samples give the same interval
# The options of `apply` that time longer, as its notes advise them (the profile notes it reuses name profile's).
TIME_LONGER_OPTIONS = "--steps, --rounds"
TOP_KERNEL_CHANGES = 10
# report/build.py lists this many kernels; a diff of two full lists shorter than it is complete.
REPORT_TOP_KERNELS = 50


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
    _check_out_dir(out_dir, APPLY_FILES, "apply")

    with _Display(progress) as display:
        workload = _load(model_path, entry, display)
        label = str(model_path) if entry is None or ":" not in entry else entry.rpartition(":")[0]

        import torch

        cuda = torch.cuda.is_available()
        run_before = _step_runner(workload.step_fn)
        _warm_up(run_before, "warm-up", warmup, display, cuda, label)

        staging, created = None, []
        try:
            staging, created = _make_staging(out_dir)
            before_trace = _record_profile(workload, run_before, staging / BEFORE_TRACE, profiled_steps, display)
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
                    make_runner=lambda w: _step_runner(w.step_fn),
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
            run_after = _step_runner(patched.step_fn)
            _warm_up(run_after, "warm-up (after fixes)", warmup, display, cuda, label)

            sampler, nvml_reason = None, "no CUDA GPU"
            if cuda:
                from gpuadvisor.capture.nvml import open_sampler

                sampler, nvml_reason = open_sampler(torch.cuda.current_device())
            measured = _measure(
                {"before": run_before, "after": run_after}, steps, rounds, cuda, sampler, display, label
            )

            after_trace = None
            if profile_after:
                after_trace = _record_profile(patched, run_after, staging / AFTER_TRACE, profiled_steps, display)

            display.phase("analysis")
            nvml_phase = None
            if sampler is not None:
                from gpuadvisor.capture.nvml import summarize

                nvml_phase = summarize(sampler, measured["before"].samples_us + measured["after"].samples_us)
            env = _environment(cuda, sampler.driver if sampler is not None else None, nvml_phase)
            side_reports: dict[str, dict[str, Any] | None] = {}
            for side, trace_path, side_workload in (
                ("before", before_trace, workload),
                ("after", after_trace, patched),
            ):
                facts = _RunFacts(
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
                    measured[side].summary = _timed_summary(facts)
                    continue
                side_report = _analyze(
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
                graph_replay = graph_replay_facts(after_trace, peaks_file)
            report = build_apply_report(
                with_step=workload.step is not default_step,
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
            from gpuadvisor.report.apply_sections import render_apply_markdown
            from gpuadvisor.report.json import to_json
            from gpuadvisor.report.write import write_atomic

            written = sorted([p.name for p in staging.iterdir()] + [REPORT_JSON, REPORT_MD])
            report["notes"].append(f"wrote {out_dir}: {', '.join(written)}")
            write_atomic(staging / REPORT_JSON, to_json(report))
            write_atomic(staging / REPORT_MD, render_apply_markdown(report))
            _publish(staging, out_dir, APPLY_FILES, "apply")
            staging = None
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
                _remove_dirs(created)
    return report


def _fix_core():
    """The fix registry module (imported here: it imports torch-side code of the fixes)."""
    try:
        from gpuadvisor.fixes import registry
    except ImportError as error:
        raise BadInputError(f"the fix registry (gpuadvisor.fixes.registry) cannot be imported: {error}") from error
    return registry


def _load(model_path: Path, entry: str | None, display: _Display):
    display.phase(f"build {model_path.name}")
    try:
        return load_workload(str(model_path), entry)
    except UserCodeError as error:
        oom = _oom_error(error, "build()")
        if oom is None:
            raise
        raise oom from error.__cause__


def _warm_up(run_step, phase: str, steps: int, display: _Display, cuda: bool, label: str) -> None:
    display.phase(phase, steps)
    for i in range(steps):
        run_step(phase, i, steps)
        display.advance()
    _synchronize(cuda, label, phase)


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

    def add_block(self, times: StepTimes, energy_mj: float | None, allocated: int | None, reserved: int | None):
        from gpuadvisor.stats import percentile

        self.samples_us.extend(times.samples_us)
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
        return StepTimes(list(self.samples_us), text, self.wall_s)

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


def _measure(
    runners: dict[str, Callable[[str, int, int], Any]],
    steps: int,
    rounds: int,
    cuda: bool,
    sampler: NvmlSampler | None,
    display: _Display,
    label: str,
) -> dict[str, SideMeasurement]:
    """Time ``rounds`` rounds of one block of ``steps`` steps per side, alternating which side goes first."""
    import torch

    from gpuadvisor.capture.timing import time_steps

    sides = {name: SideMeasurement(name) for name in SIDES}
    gc.collect()  # the garbage of build, fixes and warm-up: no full collection inside the timed blocks
    display.phase("timing before/after", 2 * rounds * steps)
    with _sampling_while_timing(sampler, label, cuda):
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


# --- statistics ---------------------------------------------------------------------------------


def _ratio_of_medians(before, after, axis=-1):
    import numpy as np

    return np.median(before, axis=axis) / np.median(after, axis=axis)


def speedup_interval(
    before_us: list[float],
    after_us: list[float],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """median(before) / median(after) and its percentile-bootstrap confidence interval.

    Each side's per-step samples are resampled on their own (they are two samples, not pairs), ``resamples``
    times, with a fixed seed. Returns {median, ci_low, ci_high, confidence, method}; the interval is None with
    fewer than 2 samples a side.
    """
    import numpy as np

    before = np.asarray([x for x in before_us if x is not None], dtype=float)
    after = np.asarray([x for x in after_us if x is not None], dtype=float)
    result: dict[str, Any] = {"median": None, "ci_low": None, "ci_high": None, "confidence": confidence}
    if not len(before) or not len(after) or np.median(after) <= 0:
        result["method"] = "no samples"
        return result
    result["median"] = float(_ratio_of_medians(before, after))
    if len(before) < 2 or len(after) < 2:
        result["method"] = "no interval: fewer than 2 samples a side"
        return result
    what = (
        f"{100 * confidence:g}% percentile bootstrap of median(before)/median(after) over the per-step samples "
        f"({len(before)} before, {len(after)} after; each side resampled on its own, "
        f"{resamples} resamples, seed {seed})"
    )
    try:
        from scipy import stats
    except ImportError:
        rng = np.random.default_rng(seed)
        ratios = _ratio_of_medians(
            rng.choice(before, (resamples, len(before))), rng.choice(after, (resamples, len(after))), axis=1
        )
        low, high = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
        result.update(
            ci_low=float(low), ci_high=float(high), method=what.replace("95%", "95% NumPy") + "; SciPy missing"
        )
        return result
    seed_kw = "rng" if "rng" in inspect.signature(stats.bootstrap).parameters else "random_state"
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # a degenerate resample distribution (identical samples) is fine here
        res = stats.bootstrap(
            (before, after),
            _ratio_of_medians,
            vectorized=True,
            paired=False,
            confidence_level=confidence,
            n_resamples=resamples,
            method="percentile",
            **{seed_kw: np.random.default_rng(seed)},
        )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (np.isfinite(low) and np.isfinite(high)):
        low = high = result["median"]
    result.update(ci_low=low, ci_high=high, method=what + " (scipy.stats.bootstrap)")
    return result


# --- CUDA graph replay in the after trace -------------------------------------------------------


def graph_replay_facts(trace_path: Path, peaks_file=None) -> dict[str, Any] | None:
    """Kernels of the trace's steps that a CUDA graph replay launched, or None when there are none.

    A graph replay shows in the trace as the graph's kernels, all linked to the one ``cudaGraphLaunch``
    call: kernels per step stay what they were (the graph runs them all), launch calls drop to about one.
    The analysis itself (:func:`gpuadvisor.analysis.roofline.graph_replayed`) never calls a replayed kernel
    launch-bound, so analyze, profile and apply give it the same class; this only counts them.

    Returns {kernels_per_step, us_per_step, relabelled_launch_us_per_step (replayed kernels shorter than the
    graph launch call, which a per-kernel launch test would have called launch-bound), classes_us_per_step}.
    """
    import numpy as np
    import pandas as pd

    from gpuadvisor.analysis.linking import gpu_activities, step_windows
    from gpuadvisor.analysis.roofline import kernel_table
    from gpuadvisor.device.calibrate import load_calibration
    from gpuadvisor.device.peaks import lookup_peaks
    from gpuadvisor.trace.kineto import load_trace

    trace = load_trace(trace_path)
    device = trace.device
    calibration = load_calibration(device.name) if device is not None else None
    peaks = lookup_peaks(device, peaks_file, calibration=calibration)
    kernels = kernel_table(trace, peaks, gpu_activities(trace))
    graph = kernels["graph_replay"].to_numpy(bool)
    if not graph.any():
        return None
    n_steps = len(step_windows(trace)) or 1
    inside = kernels["step_index"].to_numpy() >= 0
    duration = kernels["dur_us"].to_numpy(float)
    shorter = graph & (duration < kernels["launch_dur_us"].to_numpy(float))
    classes = pd.Series(duration[inside]).groupby(kernels["bound"].to_numpy(object)[inside]).sum() / n_steps
    return {
        "kernels_per_step": _round(float((graph & inside).sum()) / n_steps),
        "us_per_step": _round(float(duration[graph & inside].sum()) / n_steps),
        "relabelled_launch_us_per_step": _round(float(np.sum(duration[shorter & inside])) / n_steps),
        "classes_us_per_step": {str(k): _round(float(v)) for k, v in classes.items()},
    }


# --- the report ---------------------------------------------------------------------------------

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
    "energy_j_per_step",
    "energy_source",
)


def _side_section(side: SideMeasurement, report: dict[str, Any] | None, trace_name: str | None) -> dict[str, Any]:
    summary = side.summary or {}
    section: dict[str, Any] = {key: summary.get(key) for key in _SIDE_SUMMARY_KEYS}
    section["round_medians_us"] = [_round(x) for x in side.round_medians_us]
    section["peak_memory_bytes"] = summary.get("memory_allocated_peak_bytes")
    section["peak_memory_reserved_bytes"] = summary.get("memory_reserved_peak_bytes")
    section["profiled"] = report is not None
    section["trace"] = trace_name if report is not None else None
    section["kernel_classes"] = (report or {}).get("kernel_classes") or {}
    section["findings"] = (report or {}).get("findings") or []
    section["notes"] = (report or {}).get("notes") or []
    return section


def _predicted_savings(findings: list[dict[str, Any]], step_us: float | None) -> dict[str, float]:
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


def _search_section(search: Any) -> dict[str, Any] | None:
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


def _kernel_diff(before: dict[str, Any], after: dict[str, Any], graph_replay: dict[str, Any] | None) -> dict[str, Any]:
    b_summary, a_summary = before.get("summary") or {}, after.get("summary") or {}

    def pair(key: str) -> dict[str, Any]:
        return {"before": b_summary.get(key), "after": a_summary.get(key)}

    b_classes = before.get("kernel_classes") or {}
    a_classes = (graph_replay or {}).get("classes_us_per_step") or after.get("kernel_classes") or {}
    classes = {
        cls: {"before": _round(b_classes.get(cls, 0.0)), "after": _round(a_classes.get(cls, 0.0))}
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
    from gpuadvisor.report.json import SCHEMA_VERSION, to_plain

    before_report, after_report = side_reports["before"], side_reports["after"]
    before = _side_section(measured["before"], before_report, BEFORE_TRACE)
    after = _side_section(measured["after"], after_report, AFTER_TRACE)
    speedup = speedup_interval(measured["before"].samples_us, measured["after"].samples_us)
    speedup["round_ratios"] = [
        _round(b / a, 3) if b and a else None
        for b, a in zip(measured["before"].round_medians_us, measured["after"].round_medians_us)
    ]
    speedup["samples_before"] = len(measured["before"].samples_us)
    speedup["samples_after"] = len(measured["after"].samples_us)
    for key in ("median", "ci_low", "ci_high"):
        speedup[key] = _round(speedup[key], 3)

    before_us, after_us = before.get("step_time_us"), after.get("step_time_us")
    measured_us = _round(before_us - after_us, 1) if before_us is not None and after_us is not None else None
    predicted = _predicted_savings(before["findings"], before_us)
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
        "predicted_basis": "the savings of the findings the applied fixes address, combined as independent"
        " shares of the step: step x (1 - product of (1 - saving / step))",
        "measured_us": measured_us if applied_ids else None,
        "measured_pct": _round(100.0 * measured_us / before_us, 1)
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
    for side in (before, after):
        spread = _spread_note(side.get("step_time_p10_us"), side.get("step_time_p90_us"), TIME_LONGER_OPTIONS)
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

    kernel_diff = None
    if before_report and after_report and (before_report.get("kernels") or after_report.get("kernels")):
        kernel_diff = _kernel_diff(before_report, after_report, graph_replay)

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
    report = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "gpuadvisor", "version": __version__},
        "command": "apply",
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
        "kernel_diff": kernel_diff,
        "search": _search_section(search),
        "keep": keep,
        "notes": notes,
    }
    return to_plain(report)

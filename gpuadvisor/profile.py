"""``gpuadvisor profile model.py``: run a workload, time it honestly, profile a few steps, analyze, write a folder.

Phases (a rich progress display on stderr when ``progress`` is on):

1. build: :func:`~gpuadvisor.workload.load_workload` imports the file and calls ``build()``;
2. warm-up: ``warmup`` untimed steps (allocator, cuBLAS handles, compilation, autotuning), and on a GPU more
   until ``MIN_WARMUP_S`` have passed, so clocks and power have settled before timing;
3. timing: ``timed_steps`` steps without the profiler, CUDA events around each step
   (:mod:`gpuadvisor.capture.timing` says how), while an NVML thread samples clocks, power, the energy
   counter, temperature, throttle reasons and memory (:mod:`gpuadvisor.capture.nvml`); peak memory from
   the caching allocator, reset before the phase;
4. profiling: ``torch.profiler`` over 1 wait + 1 warm-up + ``profiled_steps`` recorded steps, with
   shapes, FLOPs and Python stacks, saved as ``trace.json.gz``;
5. analysis: the trace goes through the same analysis as ``gpuadvisor analyze``; then the step-time
   figures of the summary are replaced by the timed ones and every finding's saving is rescaled to the
   timed step (the profiler stretches an eager step several times, mostly as idle time between kernels).

Outputs, in ``out_dir`` (default ``gpuadvisor-out/<model file stem>``): ``trace.json.gz``, ``report.json``,
``report.md``, ``report.html`` (:mod:`gpuadvisor.report.html`) and ``nvml.csv`` (every NVML sample; written
only when NVML sampled, i.e. on a GPU with pynvml and without ``--no-nvml``). They are written into a
temporary folder beside ``out_dir`` and renamed into place at the end, replacing an older output folder of the
same name only then: an error or Ctrl-C leaves no output folder and no temporary one. An existing ``out_dir``
is replaced only when it holds nothing but these files (an earlier run's output); anything else is refused,
never deleted.

Without CUDA the model runs on the CPU: ``time.perf_counter`` per step, a CPU-only trace, and a report
whose ``cpu_ops`` list the operators that took the CPU time; the GPU analyses are skipped and a note says
which. Torch is imported inside the functions.
"""

from __future__ import annotations

import gc
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuadvisor.environment import run_environment
from gpuadvisor.errors import BadInputError
from gpuadvisor.outputs import check_out_dir, staged_output
from gpuadvisor.progress import ProgressDisplay
from gpuadvisor.report.profiled import TIME_LONGER_OPTIONS, TRACE_FILE, RunFacts, analyze_run
from gpuadvisor.steps import (
    StepRunner,
    build_workload,
    record_profile,
    sampling_while_timing,
    step_runner,
    synchronize,
    user_stdout_to_stderr,
)

if TYPE_CHECKING:
    from gpuadvisor.capture.timing import StepTimes

__all__ = ["TIME_LONGER_OPTIONS", "default_out_dir", "run_profile"]

NVML_FILE = "nvml.csv"
REPORT_FILES = ("report.json", "report.md", "report.html")
OUTPUT_FILES = frozenset({TRACE_FILE, NVML_FILE, *REPORT_FILES})
DEFAULT_OUT_ROOT = Path("gpuadvisor-out")
# On a GPU, warm-up runs for at least this long before timing. Measured on two H200s with the DDP example
# (about 28 ms per step): power rose from 210 to 640 W and the SM clock fell from 1965 to 1665 MHz over the
# first 0.8 s of steps (power cap), so 5 warm-up steps timed the ramp and the profiled steps, later, ran
# 15% slower than the timed ones. Short steps are unaffected: the decode example's 5 ms steps draw little.
MIN_WARMUP_S = 3.0
MAX_EXTRA_WARMUP_STEPS = 2000
# On a GPU, timing lasts at least this long (more steps than --steps when they are short). Measured on the
# H200 machine (benchmarks/results/host_noise*.json): a fixed pure-Python loop, and with it the launch-bound
# eager decode step, ran at half speed for stretches from under a second to over 15 s, each vCPU on its own
# schedule, with no steal time shown in the guest; 30 steps of 6 ms (0.2 s) could land wholly inside one.
# Longer timing lets the median see past the short stretches (not the long ones; README, "Timing a launch-bound step").
MIN_TIMING_S = 5.0
# Steps after the timed ones, each timed on the host clock from an idle GPU (capture.timing.probe_host): the
# summary's host_enqueue_us, what the host needs per step whatever the kernels take.
HOST_PROBES = 5
# GA301 on a step whose host takes at least this share of it (the host probes against the timed steps): TF32
# timed on and off in a loop of the step (tf32_step_delta), TF32_BLOCK_STEPS steps a block, two blocks a round,
# as many rounds as fit in TF32_TIMING_S within TF32_ROUNDS. On the H100 the single-image ViT step (6-8 ms) then
# times 120 rounds, 8-12 s. Why that many: its rounds spread so widely (p10-p90 of the differences -628
# to +1,641 µs around a median of 314) that 40 rounds put the median within 30% of the 240-round one in 78% of
# resamples, 120 rounds in 97% (benchmarks/results/tf32_h100/vit_b1_tf32_timed_4_r240.report.json).
TF32_TIMED_HOST_SHARE = 0.5
TF32_BLOCK_STEPS = 5
TF32_TIMING_S = 12.0
TF32_ROUNDS = (8, 120)
MAX_TIMED_STEPS = 10_000


def check_profile_out_dir(out_dir: Path) -> None:
    """Refuse an ``out_dir`` holding anything but an earlier single-process profile's outputs."""
    check_out_dir(out_dir, OUTPUT_FILES, "profile")


def default_out_dir(model_path: str | os.PathLike[str]) -> Path:
    """``gpuadvisor-out/<model file stem>`` in the current folder."""
    return DEFAULT_OUT_ROOT / Path(model_path).stem


def run_profile(
    model_path: str | os.PathLike[str],
    *,
    entry: str | None = None,
    warmup: int = 5,
    timed_steps: int = 30,
    profiled_steps: int = 3,
    min_time_s: float = MIN_TIMING_S,
    out_dir: str | os.PathLike[str] | None = None,
    peaks_file: str | os.PathLike[str] | None = None,
    rules_dir: str | os.PathLike[str] | None = None,
    nvml: bool = True,
    progress: bool = False,
    nproc: int | None = None,
    show_rank_output: bool = False,
    memory: bool = False,
) -> dict[str, Any] | None:
    """Profile the workload in ``model_path`` (see the module docstring) and return the report dict
    (schema of :mod:`gpuadvisor.report.json`, ``command: "profile"``), written to ``out_dir`` as well.

    ``memory``: on CUDA, also record a memory snapshot over a few extra untimed steps after the timed ones
    (:mod:`gpuadvisor.capture.memory_run`); without CUDA the report notes that it was skipped. The allocator's
    figures over the timed steps are in the report's ``memory`` section on CUDA either way.

    ``nproc``: run that many ranks under torchrun and merge them (:func:`launch_ranks`, docs/distributed.md);
    ``show_rank_output`` lets torchrun's and the ranks' output through to this terminal instead of a log.
    Run by torchrun itself (WORLD_SIZE > 1 in the environment), this process is one rank: rank 0 returns the
    merged report, the other ranks None.

    Raises :class:`BadInputError` (exit 2) for a bad file, flag or output folder, :class:`UserCodeError`
    (exit 3) when the user's code fails (on import, in ``build()``, in a step, out of GPU memory).
    KeyboardInterrupt propagates after cleaning up; nothing is left behind.
    """
    from gpuadvisor.device.peaks import lookup_peaks
    from gpuadvisor.rules.engine import load_rules

    for name, value, least in (
        ("warmup", warmup, 0),
        ("timed_steps", timed_steps, 1),
        ("profiled_steps", profiled_steps, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise BadInputError(f"{name} must be an int >= {least}, got {value!r}")
    if isinstance(min_time_s, bool) or not isinstance(min_time_s, (int, float)) or not 0 <= min_time_s <= 600:
        raise BadInputError(f"--min-time must be a number of seconds from 0 to 600, got {min_time_s!r}")
    if nproc is not None and (isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1):
        raise BadInputError(f"--nproc must be an int >= 1, got {nproc!r}")
    from gpuadvisor.dependencies import require_torch

    require_torch("profile")  # gpuadvisor's own dependency (exit 2), before the model's imports could miss it (3)
    model_path = Path(model_path)
    rules = load_rules(rules_dir)  # a bad --rules folder or --peaks file fails before the model runs
    if peaks_file is not None:
        lookup_peaks(None, peaks_file)
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(model_path)

    from gpuadvisor.capture.distributed import rank_environment

    world = rank_environment()
    if nproc is not None or (world is not None and world.world_size > 1):
        from gpuadvisor.profile_ranks import RankOptions, launch_ranks, profile_under_torchrun

        options = RankOptions(
            model_path=model_path,
            entry=entry,
            warmup=warmup,
            timed_steps=timed_steps,
            profiled_steps=profiled_steps,
            min_time_s=float(min_time_s),
            out_dir=out_dir,
            peaks_file=None if peaks_file is None else Path(peaks_file),
            rules_dir=None if rules_dir is None else Path(rules_dir),
            nvml=nvml,
        )
        if memory:
            raise BadInputError("--memory profiles one process: run it without --nproc or torchrun")
        if nproc is not None:
            if world is not None and world.world_size > 1:
                raise BadInputError(
                    "--nproc inside torchrun: run `gpuadvisor profile --nproc N model.py`, or "
                    "`torchrun --nproc-per-node N -m gpuadvisor profile model.py`, not both"
                )
            with user_stdout_to_stderr():
                return launch_ranks(options, nproc, rules, progress=progress, show_rank_output=show_rank_output)
        with user_stdout_to_stderr():
            return profile_under_torchrun(options, world, rules, progress=progress)

    check_profile_out_dir(out_dir)
    with user_stdout_to_stderr(), ProgressDisplay(progress) as display:
        workload, label = build_workload(model_path, entry, display)

        import torch

        cuda = torch.cuda.is_available()
        run_step = step_runner(workload.step_fn)
        measured = measure(run_step, label, cuda, warmup, timed_steps, nvml, display, min_time_s=min_time_s)
        if cuda:
            measured.times.tf32_step_delta_us = tf32_step_delta(
                workload, run_step, timed_steps + HOST_PROBES, display, measured.times
            )
        if memory and cuda:
            from gpuadvisor.capture.memory_run import snapshot_steps

            measured.snapshot = snapshot_steps(workload, run_step, label, display)
        elif memory:
            from gpuadvisor.capture.memory_run import SKIPPED_NO_CUDA

            measured.notes.append(SKIPPED_NO_CUDA)

        with staged_output(out_dir, check_profile_out_dir) as staged:
            report = profile_and_report(
                workload,
                run_step,
                staged.path,
                measured,
                model_path,
                out_dir,
                profiled_steps,
                rules,
                peaks_file,
                cuda,
                display,
            )
            staged.publish()
    return report


# --- phases (one process; a rank runs the same ones) --------------------------------------------


@dataclass
class Measured:
    """What the timing phase measured."""

    times: StepTimes
    sampler: Any  # the NVML sampler, stopped; None without one
    nvml_summary: dict[str, Any] | None
    nvml_reason: str
    memory: dict[str, int]
    allocator: dict[str, Any] | None = None  # capture/memory.py, allocator_summary, after the timed steps (CUDA)
    snapshot: dict[str, Any] | None = None  # profile --memory: capture/memory.py, snapshot_summary
    notes: list[str] = field(default_factory=list)  # for the report's notes


def measure(
    run_step: StepRunner,
    label: str,
    cuda: bool,
    warmup: int,
    timed_steps: int,
    nvml: bool,
    display: ProgressDisplay,
    before_timing: Callable[[], None] | None = None,
    agree_steps: Callable[[int], int] | None = None,
    min_time_s: float = MIN_TIMING_S,
) -> Measured:
    """Warm-up, then the timed steps (no profiler) with NVML sampling. ``before_timing`` runs between the two
    (the ranks' barrier).

    On a GPU the warm-up lasts at least ``MIN_WARMUP_S``: after the ``warmup`` steps, more steps run until
    that long has passed, so clocks and power settle before timing (see the constant). Timing then runs
    ``timed_steps`` steps, or as many as the warm-up's pace says fill ``min_time_s`` when that is more (up to
    ``MAX_TIMED_STEPS``). ``agree_steps`` turns one rank's count of steps into the count every rank runs (the
    maximum), since steps of a distributed job are collectives."""
    import torch

    display.phase("warm-up", warmup)
    started = time.perf_counter()
    for i in range(warmup):
        run_step("warm-up", i, warmup)
        display.advance()
    synchronize(cuda, label, "warm-up")
    if cuda:
        elapsed = time.perf_counter() - started
        per_step = elapsed / warmup if warmup else None
        extra = 0
        if per_step and elapsed < MIN_WARMUP_S:
            extra = min(MAX_EXTRA_WARMUP_STEPS, math.ceil((MIN_WARMUP_S - elapsed) / per_step))
        if agree_steps is not None:
            extra = agree_steps(extra)
        if extra:
            display.phase("warm-up (clocks settling)", extra)
            extra_started = time.perf_counter()
            for i in range(extra):
                run_step("warm-up", warmup + i, warmup + extra)
                display.advance()
            synchronize(cuda, label, "warm-up")
            per_step = (time.perf_counter() - extra_started) / extra  # the settled pace
        timed_steps = timed_step_count(timed_steps, per_step, min_time_s)
        if agree_steps is not None:
            timed_steps = agree_steps(timed_steps)

    from gpuadvisor.capture.nvml import open_sampler, summarize
    from gpuadvisor.capture.timing import probe_host, time_steps

    if before_timing is not None:
        before_timing()
    gc.collect()  # the garbage of imports, build and warm-up: no full collection inside the timed steps
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    display.phase("timing", timed_steps)
    sampler, nvml_reason = None, "sampling off (--no-nvml)" if cuda else "no CUDA GPU"
    if cuda and nvml:
        sampler, nvml_reason = open_sampler(torch.cuda.current_device())
    with sampling_while_timing(sampler, label, cuda):
        times = time_steps(
            lambda i: run_step("timing", i, timed_steps), timed_steps, cuda=cuda, on_step=display.advance
        )
    nvml_summary = summarize(sampler, times.samples_us) if sampler is not None else None
    if cuda:
        times.host_us = probe_host(
            lambda i: run_step("timing (host)", i, timed_steps + HOST_PROBES), timed_steps, HOST_PROBES
        )
    from gpuadvisor.capture.memory_run import allocator_figures

    allocator = allocator_figures(cuda)
    memory = (
        {
            "memory_allocated_peak_bytes": torch.cuda.max_memory_allocated(),
            "memory_reserved_peak_bytes": torch.cuda.max_memory_reserved(),
        }
        if cuda
        else {}
    )
    return Measured(times, sampler, nvml_summary, nvml_reason, memory, allocator=allocator)


def tf32_step_delta(
    workload, run_step: StepRunner, first_index: int, display: ProgressDisplay, times: StepTimes
) -> list[float]:
    """What TF32 does to the step's time per step, timed in a loop of steps with it on and off (µs per round:
    the round's ratio of on to off, :func:`gpuadvisor.capture.timing.time_paired_blocks`, less 1, times the
    median of ``times``, the step time the report gives; negative: faster), where GA301's estimate needs it:
    the tf32 fix would apply (its own check: a CUDA GPU with TF32 tensor cores, float32 matmuls not yet in TF32,
    float32 Linear or attention weights) and the host takes at least ``TF32_TIMED_HOST_SHARE`` of the step
    (``times``: the timed steps and the host probes), where the host's time, not the kernels', may bound what
    TF32 saves. Empty elsewhere. Rounds of two blocks of ``TF32_BLOCK_STEPS`` steps, as many as fit in
    ``TF32_TIMING_S`` (``TF32_ROUNDS`` bounds them). Why: on the H100 the suite's single-image float32 ViT step
    (GPU busy 18%) got 3.5% slower with TF32 while its kernels took 2.5 ms less; its host took about 370 µs more
    per step with TF32 on (benchmarks/results/tf32_h100/rvf_vit_tf32.json), and a probe of single steps from an
    idle GPU read that extra as anything from 128 to 1,433 µs over eight runs (benchmarks/results/tf32_h100/).
    Scaled from a ratio because the host's speed drifts: timed in µs after apply's 240 rounds (median step 8.3 ms
    over them, 11.3 ms over the last quarter), TF32's cost read 631 µs against the 320 µs apply measured."""
    from gpuadvisor.capture import timing
    from gpuadvisor.fixes.tf32 import Tf32Fix, tf32_allowed

    step, host = times.median_us, times.host_median_us
    if not step or not host or host < TF32_TIMED_HOST_SHARE * step:
        return []
    try:
        refusal = Tf32Fix().check(workload)
    except Exception:  # the check reads the user's modules; a model it cannot read gets no timing
        return []
    if refusal is not None:
        return []
    per_round_s = 2 * (TF32_BLOCK_STEPS + 1) * step * 1e-6
    rounds = max(TF32_ROUNDS[0], min(TF32_ROUNDS[1], int(TF32_TIMING_S / per_round_s)))
    calls = rounds * 2 * (TF32_BLOCK_STEPS + 1)
    total = first_index + calls
    display.phase("timing (TF32 on and off)", calls)

    def run(index: int) -> None:
        run_step("timing (TF32 on and off)", index, total)
        display.advance()

    ratios = timing.time_paired_blocks(run, tf32_allowed, first_index, rounds, TF32_BLOCK_STEPS)
    return [(ratio - 1.0) * step for ratio in ratios]


def timed_step_count(timed_steps: int, per_step_s: float | None, min_time_s: float) -> int:
    """``timed_steps``, or more when steps of ``per_step_s`` seconds would not fill ``min_time_s`` (at most
    ``MAX_TIMED_STEPS``, never fewer than asked)."""
    if not per_step_s or per_step_s <= 0 or per_step_s * timed_steps >= min_time_s:
        return timed_steps
    return max(timed_steps, min(MAX_TIMED_STEPS, math.ceil(min_time_s / per_step_s)))


def profile_and_report(
    workload,
    run_step: StepRunner,
    folder: Path,
    measured: Measured,
    model_path: Path,
    out_dir: Path,
    profiled_steps: int,
    rules,
    peaks_file,
    cuda: bool,
    display: ProgressDisplay,
    annotate: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Profile a few steps into ``folder``, analyze, write nvml.csv and the reports there; returns the report.
    ``out_dir`` is where ``folder`` will be published (the report names it); ``annotate(report)`` runs before
    the report is written."""
    trace_path = record_profile(workload, run_step, folder / TRACE_FILE, profiled_steps, display)

    display.phase("analysis")
    sampler = measured.sampler
    env = run_environment(cuda, sampler.driver if sampler is not None else None, measured.nvml_summary)
    context = RunFacts(
        model_path=model_path,
        out_dir=out_dir,
        times=measured.times,
        tokens_per_step=workload.tokens_per_step,
        nvml_summary=measured.nvml_summary,
        nvml_reason=measured.nvml_reason,
        memory=measured.memory,
        profiled_steps=profiled_steps,
    )
    report = analyze_run(trace_path, context, env, rules=rules, peaks_file=peaks_file, cuda=cuda)
    from gpuadvisor.capture.memory_run import memory_section

    section = memory_section(workload, measured.allocator, measured.snapshot)
    if section is not None:
        from gpuadvisor.rules.detectors_memory import run_memory_rules

        report["memory"] = section
        run_memory_rules(report, rules)  # GA601-603 read the memory section, which exists only now
    report["notes"].extend(measured.notes)
    if sampler is not None and sampler.samples:
        from gpuadvisor.capture.nvml import write_csv

        write_csv(sampler.samples, folder / NVML_FILE)
    written = sorted(p.name for p in folder.iterdir()) + list(REPORT_FILES)
    report["notes"].append(f"wrote {out_dir}: {', '.join(sorted(set(written)))}")
    if annotate is not None:
        annotate(report)

    from gpuadvisor.report.write import write_reports

    write_reports(report, folder)
    return report

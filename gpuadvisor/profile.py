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
``report.md`` and ``nvml.csv`` (every NVML sample; written only when NVML sampled, i.e. on a GPU with
pynvml and without ``--no-nvml``). They are written into a temporary folder beside ``out_dir`` and renamed
into place at the end, replacing an older output folder of the same name only then: an error or Ctrl-C
leaves no output folder and no temporary one. An existing ``out_dir`` is replaced only when it holds
nothing but these files (an earlier run's output); anything else is refused, never deleted.

Without CUDA the model runs on the CPU: ``time.perf_counter`` per step, a CPU-only trace, and a report
whose ``cpu_ops`` list the operators that took the CPU time; the GPU analyses are skipped and a note says
which. Torch is imported inside the functions.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuadvisor import __version__
from gpuadvisor.errors import BadInputError, UserCodeError

if TYPE_CHECKING:
    from gpuadvisor.capture.timing import StepTimes

TRACE_FILE = "trace.json.gz"
NVML_FILE = "nvml.csv"
REPORT_FILES = ("report.json", "report.md")
OUTPUT_FILES = frozenset({TRACE_FILE, NVML_FILE, *REPORT_FILES})
DEFAULT_OUT_ROOT = Path("gpuadvisor-out")
# Profiler schedule around the recorded steps: one step skipped, one recorded and dropped (the profiler's
# own start-up cost lands there), then the active ones.
PROFILE_WAIT = 1
PROFILE_WARMUP = 1
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
MAX_TIMED_STEPS = 10_000
# The options of `profile` that time longer, as its notes advise them (`apply` names its own).
TIME_LONGER_OPTIONS = "--min-time, --steps"
# CPU operators listed in a CPU-only report, by self time.
TOP_CPU_OPS = 25
SKIPPED_ON_CPU = "roofline, GPU busy/idle, transfers, NVML (clocks, power, energy)"
_MAX_ERROR_CHARS = 300

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
) -> dict[str, Any] | None:
    """Profile the workload in ``model_path`` (see the module docstring) and return the report dict
    (schema of :mod:`gpuadvisor.report.json`, ``command: "profile"``), written to ``out_dir`` as well.

    ``nproc``: run that many ranks under torchrun and merge them (:func:`_launch_ranks`, docs/distributed.md);
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
        options = _RankOptions(
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
        if nproc is not None:
            if world is not None and world.world_size > 1:
                raise BadInputError(
                    "--nproc inside torchrun: run `gpuadvisor profile --nproc N model.py`, or "
                    "`torchrun --nproc-per-node N -m gpuadvisor profile model.py`, not both"
                )
            return _launch_ranks(options, nproc, rules, progress=progress, show_rank_output=show_rank_output)
        return _profile_under_torchrun(options, world, rules, progress=progress)

    _check_out_dir(out_dir)
    with _Display(progress) as display:
        workload, label = _build(model_path, entry, display)

        import torch

        cuda = torch.cuda.is_available()
        run_step = _step_runner(workload.step_fn)
        measured = _measure(run_step, label, cuda, warmup, timed_steps, nvml, display, min_time_s=min_time_s)

        staging, created = None, []
        try:
            staging, created = _make_staging(out_dir)
            report = _profile_and_report(
                workload,
                run_step,
                staging,
                measured,
                model_path,
                out_dir,
                profiled_steps,
                rules,
                peaks_file,
                cuda,
                display,
            )
            _publish(staging, out_dir)
            staging = None
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
                _remove_dirs(created)
    return report


# --- phases (one process; a rank runs the same ones) --------------------------------------------


@dataclass
class _Measured:
    """What the timing phase measured."""

    times: StepTimes
    sampler: Any  # the NVML sampler, stopped; None without one
    nvml_summary: dict[str, Any] | None
    nvml_reason: str
    memory: dict[str, int]


def _build(model_path: Path, entry: str | None, display: _Display):
    """Load the workload and call its build; returns (workload, the label errors name)."""
    from gpuadvisor.workload import load_workload

    display.phase(f"build {model_path.name}")
    try:
        workload = load_workload(str(model_path), entry)
    except UserCodeError as error:
        oom = _oom_error(error, "build()")
        if oom is None:
            raise
        raise oom from error.__cause__
    label = str(model_path) if entry is None or ":" not in entry else entry.rpartition(":")[0]
    return workload, label


def _measure(
    run_step: Callable[[str, int, int], Any],
    label: str,
    cuda: bool,
    warmup: int,
    timed_steps: int,
    nvml: bool,
    display: _Display,
    before_timing: Callable[[], None] | None = None,
    agree_steps: Callable[[int], int] | None = None,
    min_time_s: float = MIN_TIMING_S,
) -> _Measured:
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
    _synchronize(cuda, label, "warm-up")
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
            _synchronize(cuda, label, "warm-up")
            per_step = (time.perf_counter() - extra_started) / extra  # the settled pace
        timed_steps = _timed_step_count(timed_steps, per_step, min_time_s)
        if agree_steps is not None:
            timed_steps = agree_steps(timed_steps)

    from gpuadvisor.capture.nvml import open_sampler, summarize
    from gpuadvisor.capture.timing import time_steps

    if before_timing is not None:
        before_timing()
    gc.collect()  # the garbage of imports, build and warm-up: no full collection inside the timed steps
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    display.phase("timing", timed_steps)
    sampler, nvml_reason = None, "sampling off (--no-nvml)" if cuda else "no CUDA GPU"
    if cuda and nvml:
        sampler, nvml_reason = open_sampler(torch.cuda.current_device())
    with _sampling_while_timing(sampler, label, cuda):
        times = time_steps(
            lambda i: run_step("timing", i, timed_steps), timed_steps, cuda=cuda, on_step=display.advance
        )
    nvml_summary = summarize(sampler, times.samples_us) if sampler is not None else None
    memory = (
        {
            "memory_allocated_peak_bytes": torch.cuda.max_memory_allocated(),
            "memory_reserved_peak_bytes": torch.cuda.max_memory_reserved(),
        }
        if cuda
        else {}
    )
    return _Measured(times, sampler, nvml_summary, nvml_reason, memory)


@contextmanager
def _sampling_while_timing(sampler, label: str, cuda: bool):
    """Run the NVML ``sampler`` (if any) around the timed steps, stopping it however they end; a CUDA error
    of the user's kernels, surfacing at a synchronize, becomes a UserCodeError."""
    try:
        if sampler is not None:
            sampler.start()
        yield
    except RuntimeError as error:
        if not cuda or "CUDA" not in str(error):
            raise
        raise UserCodeError(f"{label}: the GPU reported an error during timing: {_one_line(error)}") from error
    finally:
        if sampler is not None:
            sampler.stop()


def _timed_step_count(timed_steps: int, per_step_s: float | None, min_time_s: float) -> int:
    """``timed_steps``, or more when steps of ``per_step_s`` seconds would not fill ``min_time_s`` (at most
    ``MAX_TIMED_STEPS``, never fewer than asked)."""
    if not per_step_s or per_step_s <= 0 or per_step_s * timed_steps >= min_time_s:
        return timed_steps
    return max(timed_steps, min(MAX_TIMED_STEPS, math.ceil(min_time_s / per_step_s)))


def _profile_and_report(
    workload,
    run_step: Callable[[str, int, int], Any],
    folder: Path,
    measured: _Measured,
    model_path: Path,
    out_dir: Path,
    profiled_steps: int,
    rules,
    peaks_file,
    cuda: bool,
    display: _Display,
    annotate: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Profile a few steps into ``folder``, analyze, write nvml.csv and the reports there; returns the report.
    ``out_dir`` is where ``folder`` will be published (the report names it); ``annotate(report)`` runs before
    the report is written."""
    trace_path = _record_profile(workload, run_step, folder / TRACE_FILE, profiled_steps, display)

    display.phase("analysis")
    sampler = measured.sampler
    env = _environment(cuda, sampler.driver if sampler is not None else None, measured.nvml_summary)
    context = _RunFacts(
        model_path=model_path,
        out_dir=out_dir,
        times=measured.times,
        tokens_per_step=workload.tokens_per_step,
        nvml_summary=measured.nvml_summary,
        nvml_reason=measured.nvml_reason,
        memory=measured.memory,
        profiled_steps=profiled_steps,
    )
    report = _analyze(trace_path, context, env, rules=rules, peaks_file=peaks_file, cuda=cuda)
    if sampler is not None and sampler.samples:
        from gpuadvisor.capture.nvml import write_csv

        write_csv(sampler.samples, folder / NVML_FILE)
    written = sorted(p.name for p in folder.iterdir()) + list(REPORT_FILES)
    report["notes"].append(f"wrote {out_dir}: {', '.join(sorted(set(written)))}")
    if annotate is not None:
        annotate(report)

    from gpuadvisor.report.write import write_reports

    write_reports(report, folder, ["json", "markdown"])
    return report


# --- steps and errors ---------------------------------------------------------------------------


def _record_profile(
    workload, run_step: Callable[[str, int, int], Any], trace_path: Path, profiled_steps: int, display: _Display
) -> Path:
    """Record ``profiled_steps`` steps (after PROFILE_WAIT + PROFILE_WARMUP) under the profiler into ``trace_path``."""
    from gpuadvisor.capture.profiler import record_trace

    total = PROFILE_WAIT + PROFILE_WARMUP + profiled_steps
    display.phase("profiling", total)
    counter = iter(range(total))

    def profiled_step() -> Any:
        i = next(counter, 0)
        result = run_step("profiling", i, total)
        display.advance()
        return result

    import dataclasses

    profiled = dataclasses.replace(workload, step_fn=profiled_step)
    return record_trace(
        profiled, trace_path, wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=profiled_steps, with_stack=True
    )


def _step_runner(step_fn: Callable[[], Any]) -> Callable[[str, int, int], Any]:
    """``run(phase, index, total)``: one step; a failure names the phase and the step (1-based)."""

    def run(phase: str, index: int, total: int) -> Any:
        try:
            return step_fn()
        except UserCodeError as error:
            where = f"the step ({phase}, step {index + 1} of {total})"
            oom = _oom_error(error, where)
            if oom is not None:
                raise oom from error.__cause__
            raise UserCodeError(f"{error} during {phase}, step {index + 1} of {total}") from error.__cause__

    return run


def _synchronize(cuda: bool, label: str, phase: str) -> None:
    """Wait for the GPU; an asynchronous CUDA error of the user's kernels becomes a UserCodeError."""
    if not cuda:
        return
    import torch

    try:
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - e.g. a device-side assert raised by the user's kernels
        oom = _oom_error(UserCodeError(f"{label}: {_one_line(error)}"), f"the {phase} steps", error)
        if oom is not None:
            raise oom from error
        raise UserCodeError(
            f"{label}: the GPU reported an error after the {phase} steps: {_one_line(error)}"
        ) from error


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if len(text) > _MAX_ERROR_CHARS:
        text = text[: _MAX_ERROR_CHARS - 1] + "…"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _is_oom(error: BaseException | None) -> bool:
    if error is None:
        return False
    try:
        import torch
    except ImportError:  # pragma: no cover - profile needs torch
        return False
    oom_types = tuple(
        t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t
    )
    return isinstance(error, oom_types) or (isinstance(error, RuntimeError) and "CUDA out of memory" in str(error))


_SIZE = r"[\d.]+ ?[KMGTP]?i?B"


def _oom_error(error: UserCodeError, where: str, cause: BaseException | None = None) -> UserCodeError | None:
    """``model.py: CUDA out of memory in build(): tried to allocate 20.00 GiB; 1.20 GiB free of 139.80 GiB``
    when ``error`` (a user-code error) was caused by running out of GPU memory, else None."""
    cause = cause if cause is not None else error.__cause__
    if not _is_oom(cause):
        return None
    text = " ".join(str(cause).split())
    label = str(error).split(": ", 1)[0]
    tried = re.search(rf"[Tt]ried to allocate ({_SIZE})", text)
    capacity = re.search(rf"total capacity of ({_SIZE}) of which ({_SIZE}) is free", text)
    if capacity:
        free = f"{capacity.group(2)} free of {capacity.group(1)}"
    else:
        free = _free_memory()
    where_in_code = re.search(r"\(at ([^()]+:\d+)\)$", str(error))
    message = (
        f"{label}: CUDA out of memory in {where}: tried to allocate "
        f"{tried.group(1) if tried else 'an unknown amount'}; {free}"
    )
    if where_in_code:
        message += f" (at {where_in_code.group(1)})"
    return UserCodeError(message)


def _free_memory() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            return f"{free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB"
    except Exception:  # noqa: BLE001 - the device may be in no state to answer
        pass
    return "free GPU memory unknown"


# --- output folder ------------------------------------------------------------------------------


def _check_out_dir(
    out_dir: Path,
    allowed: frozenset[str] = OUTPUT_FILES,
    command: str = "profile",
    ours: Callable[[Path], bool] | None = None,
) -> None:
    """Refuse an ``out_dir`` that is a file, or a folder holding anything but an earlier run's outputs
    (the file names in ``allowed``, or what ``ours`` accepts; ``command`` names that run in the message)."""
    if ours is None:

        def ours(path: Path) -> bool:
            return path.name in allowed and path.is_file()

    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise BadInputError(f"--out {out_dir} exists and is not a folder")
    if out_dir.is_dir():
        try:
            foreign = sorted(p.name for p in out_dir.iterdir() if not ours(p))
        except OSError as error:
            raise BadInputError(f"--out {out_dir}: cannot read it: {error.strerror or error}") from error
        if foreign:
            shown = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
            raise BadInputError(
                f"--out {out_dir} exists and holds other files ({shown}); it would be replaced, so give a new "
                f"or an earlier {command}'s folder"
            )


def _make_staging(out_dir: Path) -> tuple[Path, list[Path]]:
    """A new temporary folder beside ``out_dir`` (creating missing parents); returns it and the parents made."""
    parent = out_dir.absolute().parent
    created = []
    missing = []
    current = parent
    while not current.exists():
        missing.append(current)
        current = current.parent
    try:
        for folder in reversed(missing):
            try:
                folder.mkdir()
            except FileExistsError:
                continue
            created.append(folder)
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.absolute().name}.", suffix=".tmp", dir=parent))
    except OSError as error:
        _remove_dirs(created)
        raise BadInputError(f"cannot write to {out_dir}: {error.strerror or error}") from error
    except BaseException:
        _remove_dirs(created)
        raise
    return staging, created


def _remove_dirs(created: list[Path]) -> None:
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            return


def _publish(
    staging: Path,
    out_dir: Path,
    allowed: frozenset[str] = OUTPUT_FILES,
    command: str = "profile",
    check: Callable[[Path], None] | None = None,
) -> None:
    """Rename ``staging`` to ``out_dir``; an existing ``out_dir`` (an earlier run's outputs) goes only now.
    ``check`` replaces the check of ``out_dir`` (a multi-rank folder has rank subfolders)."""
    from gpuadvisor.interrupt import raise_if_interrupted

    raise_if_interrupted()  # a Ctrl-C whose KeyboardInterrupt something swallowed: publish nothing
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes private folders; an output folder is meant to be shared
    if check is not None:
        check(out_dir)
    else:
        _check_out_dir(out_dir, allowed, command)
    target = out_dir.absolute()
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
    try:
        os.rename(staging, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --- progress -----------------------------------------------------------------------------------


class _Display(AbstractContextManager):
    """One progress line per phase on stderr (rich), or nothing when disabled."""

    def __init__(self, enabled: bool, on_phase: Callable[[str], None] | None = None):
        self._progress = None
        self._task = None
        self._total: int | None = None
        self._on_phase = on_phase  # told each phase's description (a rank tells the launching process)
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description:<24}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
            )

    def __enter__(self) -> _Display:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, exc_type, *rest) -> None:
        if self._progress is not None:
            if exc_type is None:
                self._finish()
            self._progress.stop()

    def phase(self, description: str, total: int | None = None) -> None:
        from gpuadvisor.interrupt import raise_if_interrupted

        raise_if_interrupted()  # a Ctrl-C whose KeyboardInterrupt something swallowed stops at the next phase
        if self._on_phase is not None:
            self._on_phase(description)
        if self._progress is None:
            return
        self._finish()
        self._task = self._progress.add_task(description, total=total)
        self._total = total

    def advance(self) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task)

    def describe(self, description: str) -> None:
        """A new description for the current phase's line."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=description)

    def _finish(self) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=self._total or 1, completed=self._total or 1)


# --- analysis -----------------------------------------------------------------------------------


@dataclass
class _RunFacts:
    """What the run measured outside the trace, for the report."""

    model_path: Path
    out_dir: Path
    times: StepTimes
    tokens_per_step: int | None
    nvml_summary: dict[str, Any] | None
    nvml_reason: str
    memory: dict[str, int]
    profiled_steps: int


def _environment(cuda: bool, driver: str | None, nvml_summary: dict[str, Any] | None) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "torch": str(torch.__version__),
        "triton": _triton_version(),
        "python": platform.python_version(),
    }
    if cuda:
        env["gpu_name"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        if driver:
            env["driver"] = driver
        if nvml_summary and nvml_summary.get("clocks"):
            env["clocks"] = nvml_summary["clocks"]
    else:
        env["device"] = "cpu"
        env["cpu_name"] = _cpu_name()
        env["cpu_threads"] = torch.get_num_threads()
    return {k: v for k, v in env.items() if v is not None}


def _triton_version() -> str | None:
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return None
    for distribution in ("triton", "pytorch-triton", "triton-nightly"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _analyze(
    trace_path: Path,
    facts: _RunFacts,
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
    _use_timed_steps(report, facts)
    _rescale_savings(report, rules)
    report["source"]["path"] = str(facts.out_dir / TRACE_FILE)
    report["source"]["model"] = str(facts.model_path)
    notes = [
        f"step times: {facts.times.source} (median of {len(facts.times.samples_us)}); the figures per step from the "
        f"trace (GPU busy, idle, kernels) come from {facts.profiled_steps} profiled step(s), "
        f"{_ratio_text(report['summary'].get('profiler_slowdown'))}",
    ]
    spread = _spread_note(facts.times.p10_us, facts.times.p90_us, time_longer)
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


def _spread_note(p10: float | None, p90: float | None, time_longer: str = TIME_LONGER_OPTIONS) -> str | None:
    """A warning when the timed steps vary widely (host contention, clock changes, a launch-bound step);
    ``time_longer`` names the options that time longer in the command that prints it."""
    if not p10 or not p90 or p90 / p10 <= UNSTEADY_SPREAD:
        return None
    return (
        f"step times vary widely (p10 {p10:,.0f} µs, p90 {p90:,.0f} µs, {100 * (p90 / p10 - 1):.0f}% apart): "
        "something else competes for the host or the GPU, or the step is bound by the host's launch rate; time "
        f"longer ({time_longer}) and compare several runs with `gpuadvisor compare`, which tests every sample"
    )


def _timed_summary(facts: _RunFacts) -> dict[str, Any]:
    times = facts.times
    median = times.median_us
    summary: dict[str, Any] = {
        "step_time_us": _round(median),
        "step_time_p10_us": _round(times.p10_us),
        "step_time_p90_us": _round(times.p90_us),
        "samples_us": [_round(x) for x in times.samples_us],
        "step_time_source": times.source,
        "timed_steps": len(times.samples_us),
        "timing_wall_s": _round(times.wall_s, 3),
        "tokens_per_s": _round(facts.tokens_per_step * 1e6 / median, 1) if facts.tokens_per_step and median else None,
    }
    summary.update(facts.memory)
    if facts.nvml_summary is not None:
        nvml = facts.nvml_summary
        summary.update(
            energy_j_per_step=_round(nvml["energy_j_per_step"], 4),
            energy_source=nvml["energy_source"],
            power_w_average=_round(nvml["power_w_average"], 1),
            power_w_median=_round(nvml["power_w_median"], 1),
            temperature_c_max=nvml["temperature_c_max"],
            throttle_reasons=nvml["throttle_reasons"],
            nvml_samples=nvml["samples"],
        )
    return summary


def _use_timed_steps(report: dict, facts: _RunFacts) -> None:
    summary = report["summary"]
    trace_step = summary.get("step_time_us")
    summary["trace_step_time_us"] = trace_step
    summary.update(_timed_summary(facts))
    median = summary["step_time_us"]
    summary["profiler_slowdown"] = _round(trace_step / median, 2) if trace_step and median else None


def _rescale_savings(report: dict, rules) -> None:
    """Express every finding's saving against the timed median step instead of the profiled one.

    Each rule's detector owns how its saving re-derives (:func:`gpuadvisor.rules.engine.retime_saving`):
    savings in kernel or copy time stay as they are (the profiler does not change a kernel's duration);
    the idle time after host syncs scales by timed / profiled step; the launch-bound saving is recomputed as
    timed step - (GPU busy + kernels x the per-kernel cost left inside a CUDA graph). All are clipped to
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
        saving = retime_saving(finding, by_id.get(finding["rule_id"]), float(timed), profiled)
        finding["estimated_saving_us_per_step"] = round(saving, 1)
        finding["estimated_saving_pct"] = round(100.0 * saving / timed, 1)
    findings.sort(key=rank_key)
    summary["top_finding"] = findings[0]["rule_id"]
    summary.update(combined_estimate(findings, summary))
    report["notes"].append(
        f"savings were rescaled to the timed step ({timed:,.0f} µs): kernel and copy time as measured, idle time "
        f"after host syncs scaled by timed / profiled step ({profiled or 0:,.0f} µs), the launch-bound saving "
        "recomputed as timed step - (GPU busy + kernels x per-kernel graph cost)"
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
            "count_per_step": _round(count / steps),
            "self_us": _round(self_us),
            "total_us": _round(total_us),
            "per_step_us": _round(self_us / steps),
            "total_per_step_us": _round(total_us / steps),
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


def _cpu_report(trace, facts: _RunFacts, env: dict, rules, why: str) -> dict[str, Any]:
    """The report of a run without GPU work: timed steps and CPU operators; schema keys as build_report's."""
    from gpuadvisor.report.json import SCHEMA_VERSION, to_plain
    from gpuadvisor.stats import percentile

    cpu_ops, steps, step_durations = cpu_op_table(trace)
    summary: dict[str, Any] = {key: None for key in _SUMMARY_KEYS}
    summary.update(_timed_summary(facts))
    summary["steps"] = steps
    summary["trace_step_time_us"] = _round(percentile(step_durations, 50))
    if summary["trace_step_time_us"] and summary["step_time_us"]:
        summary["profiler_slowdown"] = _round(summary["trace_step_time_us"] / summary["step_time_us"], 2)
    summary["cpu_op_self_us_per_step"] = _round(sum(row["self_us"] for row in cpu_ops) / steps) if cpu_ops else None
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
    report = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "gpuadvisor", "version": __version__},
        "command": "profile",
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
    return to_plain(report)


def _round(value: Any, digits: int = 2) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return round(float(value), digits)
    return None


# --- several ranks (--nproc N, or run by torchrun) ----------------------------------------------
#
# Output folder of N ranks: report.json and report.md (merged: rank 0's report plus the `ranks` table of every
# rank and the distributed rules' findings) and rank0/ … rank{N-1}/, each one rank's own single-rank output
# (trace.json.gz, report.json, report.md, nvml.csv). docs/distributed.md describes both ways to run.

RANK_DIR_PATTERN = re.compile(r"rank\d+")
# How close the trace's per-rank step times must come to the CUDA-event medians for the report to call them
# in agreement. It is the acceptance line, not a measured bound: benchmarks/ddp_profile_check.py
# measures the difference for examples/ddp_train.py on two H200s.
STEP_AGREEMENT_PCT = 5.0
DISTRIBUTED_CATEGORY = "distributed"
_MERGE_DIR = ".merge"


@dataclass(frozen=True)
class _RankOptions:
    """What every rank needs to run the profile (the parent hands them to the ranks as arguments)."""

    model_path: Path
    entry: str | None
    warmup: int
    timed_steps: int
    profiled_steps: int
    out_dir: Path
    peaks_file: Path | None
    rules_dir: Path | None
    nvml: bool
    min_time_s: float = MIN_TIMING_S

    def child_args(self) -> list[str]:
        """The arguments of ``python -m gpuadvisor.distributed_child`` (paths absolute: ranks may run elsewhere)."""
        args = [
            str(self.model_path.absolute()),
            f"--warmup={self.warmup}",
            f"--steps={self.timed_steps}",
            f"--profile-steps={self.profiled_steps}",
            f"--min-time={self.min_time_s}",
            f"--out={self.out_dir.absolute()}",
        ]
        if self.entry is not None:
            args.append(f"--entry={self.entry}")
        if self.peaks_file is not None:
            args.append(f"--peaks={self.peaks_file.absolute()}")
        if self.rules_dir is not None:
            args.append(f"--rules={self.rules_dir.absolute()}")
        if not self.nvml:
            args.append("--no-nvml")
        return args


def _check_ranks_out_dir(out_dir: Path) -> None:
    """Refuse an ``out_dir`` that is a file, or a folder holding anything but an earlier multi-rank profile's
    outputs (report.json, report.md and rank<N>/ folders of the single-rank output files)."""

    def ours(path: Path) -> bool:
        if path.is_symlink():
            return False
        if path.is_file():
            return path.name in REPORT_FILES
        if path.is_dir() and RANK_DIR_PATTERN.fullmatch(path.name):
            return all(p.is_file() and not p.is_symlink() and p.name in OUTPUT_FILES for p in path.iterdir())
        return False

    _check_out_dir(out_dir, command="multi-rank profile", ours=ours)


def _launch_ranks(
    options: _RankOptions, nproc: int, rules, *, progress: bool, show_rank_output: bool
) -> dict[str, Any]:
    """``profile --nproc N``: run N ranks under torchrun (:mod:`gpuadvisor.capture.distributed`), wait for all
    of them, merge. A rank that fails: the error names it (exit 3, or 2 for bad input); Ctrl-C: every rank is
    stopped; either way nothing is left behind."""
    from gpuadvisor.capture import distributed as launcher
    from gpuadvisor.report.write import write_reports

    if not options.model_path.exists():
        raise BadInputError(f"{options.model_path}: no such file")
    _check_ranks_out_dir(options.out_dir)
    import torch

    cuda = torch.cuda.is_available()
    launcher.check_nproc(nproc, cuda, torch.cuda.device_count() if cuda else 0)

    staging, created = _make_staging(options.out_dir)
    try:
        control = staging / launcher.CONTROL_DIR
        control.mkdir()
        log_path = None if show_rank_output else control / "torchrun.log"
        child_args = [*options.child_args(), f"--staging={staging}"]
        with _Display(progress) as display:
            display.phase(f"{nproc} rank(s): starting")

            def poll() -> None:
                phase = launcher.current_phase(control)
                if phase:
                    display.describe(f"{nproc} rank(s): {phase}")

            code = launcher.run_ranks(nproc, child_args, control, log_path=log_path, on_poll=poll)
            if code != 0:
                raise launcher.first_failure(control, code, log_path)
            display.phase("merging ranks")
            report = _merge_ranks(staging, nproc, options, rules, how=f"gpuadvisor profile --nproc {nproc}")
        shutil.rmtree(control)
        write_reports(report, staging, ["json", "markdown"])
        _publish(staging, options.out_dir, check=_check_ranks_out_dir)
        staging = None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
            _remove_dirs(created)
    return report


def profile_rank(
    options: _RankOptions,
    info,
    rules,
    staging_for: Callable[[Any], Path],
    *,
    control_dir: Path | None = None,
    progress: bool = False,
) -> tuple[dict[str, Any], Any]:
    """One rank's profile: the single-GPU phases in lockstep with the other ranks, written to
    ``<staging>/rank{r}/``. ``staging_for(group)`` gives the staging folder (called on every rank after the
    process group exists). Returns (this rank's report, the coordination group)."""
    from gpuadvisor.capture import distributed as ranks

    ranks.turn_off_nvlink_multicast()  # before NCCL starts, i.e. before the user's build()
    cuda = ranks.select_device(info)  # before build(): device="cuda" is this rank's GPU

    def tell(phase: str) -> None:
        ranks.write_control(control_dir, info.rank, "phase", phase)

    with _Display(progress, on_phase=tell) as display:
        workload, label = _build(options.model_path, options.entry, display)
        backend = ranks.ensure_process_group(cuda)
        group = ranks.coordination_group()
        staging = Path(staging_for(group))
        ranks.barrier(group)  # every rank has built its model
        run_step = _step_runner(workload.step_fn)
        measured = _measure(
            run_step,
            label,
            cuda,
            options.warmup,
            options.timed_steps,
            options.nvml,
            display,
            before_timing=lambda: ranks.barrier(group),  # the ranks start timing together
            agree_steps=lambda count: ranks.max_over_ranks(count, group),
            min_time_s=options.min_time_s,
        )
        ranks.barrier(group)  # and profiling
        folder = staging / f"rank{info.rank}"
        folder.mkdir()
        facts = {
            "rank": info.rank,
            "world_size": info.world_size,
            "local_rank": info.local_rank,
            "backend": backend,
        }

        def annotate(report: dict[str, Any]) -> None:
            report["distributed"] = facts

        report = _profile_and_report(
            workload,
            run_step,
            folder,
            measured,
            options.model_path,
            options.out_dir / folder.name,
            options.profiled_steps,
            rules,
            options.peaks_file,
            cuda,
            display,
            annotate=annotate,
        )
    return report, group


def _profile_under_torchrun(options: _RankOptions, info, rules, *, progress: bool) -> dict[str, Any] | None:
    """This process is one rank of ``torchrun -m gpuadvisor profile``: rank 0 makes the staging folder and
    tells the others, every rank profiles itself into it, rank 0 merges after a barrier and publishes.
    Returns the merged report on rank 0, None on the others. Errors name the rank. Best effort on failure:
    torchrun stops the other ranks; the failing rank and rank 0 both remove the staging folder."""
    import signal
    import threading

    from gpuadvisor.capture import distributed as ranks
    from gpuadvisor.errors import GpuAdvisorError

    if info.rank == 0:
        _check_ranks_out_dir(options.out_dir)
    state: dict[str, Any] = {"staging": None, "created": []}

    def staging_for(group) -> Path:
        path = None
        if info.rank == 0:
            state["staging"], state["created"] = _make_staging(options.out_dir)
            path = str(state["staging"])
        path = ranks.broadcast_text(path, group)
        state["staging"] = Path(path)
        return state["staging"]

    def interrupted(signum, frame) -> None:
        raise KeyboardInterrupt  # torchrun stops the ranks with SIGTERM: clean up as after Ctrl-C

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, interrupted)
    published = False
    try:
        try:
            _, group = profile_rank(options, info, rules, staging_for, progress=progress and info.rank == 0)
            ranks.barrier(group)  # every rank has written its folder
            _destroy_process_group()
            if info.rank != 0:
                return None
            report = _merge_ranks(
                state["staging"],
                info.world_size,
                options,
                rules,
                how=f"torchrun --nproc-per-node {info.local_world_size} -m gpuadvisor profile",
            )
            from gpuadvisor.report.write import write_reports

            write_reports(report, state["staging"], ["json", "markdown"])
            _publish(state["staging"], options.out_dir, check=_check_ranks_out_dir)
            published = True
            return report
        except GpuAdvisorError as error:
            raise type(error)(f"rank {info.rank}: {error}") from error.__cause__
    finally:
        if not published and state["staging"] is not None and (info.rank == 0 or sys.exc_info()[0] is not None):
            shutil.rmtree(state["staging"], ignore_errors=True)
            _remove_dirs(state["created"])
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _destroy_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _merge_ranks(staging: Path, world_size: int, options: _RankOptions, rules, *, how: str) -> dict[str, Any]:
    """The top-level report of N ranks: rank 0's own report, its source widened to all ranks, plus the `ranks`
    table (the trace analysis of every rank beside each rank's CUDA-event timing) and the distributed rules'
    findings over all ranks (GPU traces only: they need NCCL kernels)."""
    import copy

    from gpuadvisor.capture.distributed import read_rank_reports

    rank_reports = read_rank_reports(staging, world_size)
    report = copy.deepcopy(rank_reports[0])
    facts = report.pop("distributed", None) or {}
    backend = facts.get("backend")
    on_gpu = bool(report.get("kernels")) or report.get("env", {}).get("device") != "cpu"
    multi = _multi_rank_analysis(staging, world_size, options, rules, report["env"]) if on_gpu else None

    rows_by_rank = {row["rank"]: row for row in (multi or {}).get("ranks", {}).get("rows", [])}
    rows = [_rank_row(rank, rank_reports[rank], rows_by_rank.get(rank)) for rank in range(world_size)]
    differences = [abs(row["trace_vs_timed_pct"]) for row in rows if row["trace_vs_timed_pct"] is not None]
    worst = max(differences) if differences else None
    section = {
        "world_size": world_size,
        "backend": backend,
        "launcher": how,
        "matched_steps": [],
        "step_basis": "each rank's profiled steps (ProfilerStep windows), median",
        "rows": rows,
        "straggler": None,
        "straggler_excess_wait_us_per_step": None,
        "straggler_excess_wait_pct": None,
        "timing_agreement": {
            "tolerance_pct": STEP_AGREEMENT_PCT,
            "max_abs_difference_pct": _round(worst),
            "within_tolerance": None if worst is None else worst <= STEP_AGREEMENT_PCT,
        },
    }
    if multi is not None and "ranks" in multi:
        for key in (
            "matched_steps",
            "step_basis",
            "straggler",
            "straggler_excess_wait_us_per_step",
            "straggler_excess_wait_pct",
        ):
            section[key] = multi["ranks"].get(key)
    report["ranks"] = section

    distributed_ids = {rule.id for rule in rules if rule.category == DISTRIBUTED_CATEGORY}
    findings = [f for f in report.get("findings", []) if f.get("rule_id") not in distributed_ids]
    skipped = [s for s in report.get("skipped_rules", []) if s.get("rule_id") not in distributed_ids]
    if multi is not None and world_size > 1:
        findings += [_against_timed_step(f, report) for f in multi["findings"] if f.get("rule_id") in distributed_ids]
        skipped += [s for s in multi.get("skipped_rules", []) if s.get("rule_id") in distributed_ids]
    else:
        why = (
            "one rank: nothing to compare"
            if world_size == 1
            else f"CPU ranks ({backend or 'gloo'}): the traces hold no GPU communication (NCCL) kernels, which the "
            "exposed-communication and straggler analyses measure"
        )
        skipped += [{"rule_id": rule_id, "reason": why} for rule_id in sorted(distributed_ids)]
    from gpuadvisor.rules.engine import combined_estimate, rank_key

    findings.sort(key=rank_key)
    report["findings"] = findings
    report["summary"].update(combined_estimate(findings, report["summary"]))
    report["skipped_rules"] = skipped
    if findings:
        report["summary"]["top_finding"] = findings[0]["rule_id"]
    report["summary"]["world_size"] = world_size

    source = report.setdefault("source", {})
    source["path"] = str(options.out_dir)
    source["ranks"] = list(range(world_size))
    source["events"] = sum(int((r.get("source") or {}).get("events") or 0) for r in rank_reports.values())
    source["size_bytes"] = sum(int((r.get("source") or {}).get("size_bytes") or 0) for r in rank_reports.values())
    source["rank_folders"] = [f"rank{rank}" for rank in range(world_size)]

    own_notes = [n for n in report.get("notes", []) if not str(n).startswith("wrote ")]
    report["notes"] = [
        f"{world_size} rank(s), process group backend {backend or 'unknown'}, run by `{how}`: the summary, kernels, "
        "steps and per-rank findings are rank 0's (rank0/report.json; each rank's own report is in rank<N>/); the "
        "ranks table compares every rank"
        + (", and the distributed rules (GA7xx) cover all ranks" if world_size > 1 else ""),
        _agreement_note(rows, worst),
        *own_notes,
        f"wrote {options.out_dir}: report.json, report.md, "
        + ", ".join(f"rank{rank}/" for rank in range(world_size))
        + " (each: trace.json.gz, report.json, report.md, nvml.csv when NVML sampled)",
    ]
    from gpuadvisor.report.json import to_plain

    return to_plain(report)


def _multi_rank_analysis(staging: Path, world_size: int, options: _RankOptions, rules, env) -> dict[str, Any]:
    """The folder analysis of `gpuadvisor analyze` over every rank's trace (rank 0's view plus the ranks table
    and the distributed rules), from a temporary folder of links to the rank traces."""
    from gpuadvisor.pipeline import analyze_trace_object
    from gpuadvisor.trace.kineto import load_trace

    merge_dir = staging / _MERGE_DIR
    merge_dir.mkdir()
    try:
        for rank in range(world_size):
            source = staging / f"rank{rank}" / TRACE_FILE
            target = merge_dir / f"rank{rank:05d}.json.gz"  # sorted as the ranks are when a trace names none
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
        trace = load_trace(merge_dir)
        first = trace.ranks[0]
        one = trace.for_rank(first) if len(trace.ranks) > 1 else trace
        return analyze_trace_object(
            one, peaks_file=options.peaks_file, rules=rules, command="profile", env=env, all_ranks=trace
        )
    finally:
        shutil.rmtree(merge_dir, ignore_errors=True)


def _rank_row(rank: int, rank_report: dict[str, Any], trace_row: dict[str, Any] | None) -> dict[str, Any]:
    """One row of the merged `ranks` table: the trace figures (the multi-rank analysis's row on GPUs; the rank's
    own profiled steps otherwise) beside the rank's timed steps."""
    summary = rank_report.get("summary") or {}
    if trace_row is not None:
        row = dict(trace_row)
    else:
        row = {
            "rank": rank,
            "steps": summary.get("steps"),
            "step_time_us": summary.get("trace_step_time_us"),
            "gpu_busy_pct": summary.get("gpu_busy_pct"),
            "compute_us_per_step": None,
            "communication_us_per_step": None,
            "exposed_communication_us_per_step": None,
            "overlapped_communication_us_per_step": None,
            "collectives_per_step": None,
            "communication_us_total": None,
            "exposed_communication_us_total": None,
        }
    timed = summary.get("step_time_us")
    trace_step = row.get("step_time_us")
    row.update(
        timed_step_time_us=timed,
        timed_step_p10_us=summary.get("step_time_p10_us"),
        timed_step_p90_us=summary.get("step_time_p90_us"),
        timed_steps=summary.get("timed_steps"),
        step_time_source=summary.get("step_time_source"),
        trace_vs_timed_pct=_round(100.0 * (trace_step - timed) / timed) if trace_step and timed else None,
        folder=f"rank{rank}",
    )
    return row


def _against_timed_step(finding: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """A distributed finding's saving clipped to, and expressed as a share of, rank 0's timed step (as
    :func:`_rescale_savings` does for the other findings)."""
    timed = (report.get("summary") or {}).get("step_time_us")
    if not timed:
        return finding
    saving = min(max(0.0, float(finding.get("estimated_saving_us_per_step") or 0.0)), float(timed))
    finding["estimated_saving_us_per_step"] = round(saving, 1)
    finding["estimated_saving_pct"] = round(100.0 * saving / timed, 1)
    return finding


def _agreement_note(rows: list[dict[str, Any]], worst: float | None) -> str:
    if worst is None:
        return "per-rank step times from the trace could not be compared with the timed ones (a figure is missing)"
    pairs = ", ".join(
        f"rank {row['rank']} {_us_text(row.get('step_time_us'))} vs {_us_text(row.get('timed_step_time_us'))}"
        for row in rows[:8]
    )
    verdict = (
        f"agree within {STEP_AGREEMENT_PCT:.0f}%"
        if worst <= STEP_AGREEMENT_PCT
        else f"do NOT agree within {STEP_AGREEMENT_PCT:.0f}% (the profiler slows the host; a step bound by the "
        "host's launches or, on the CPU, by the operators themselves, stretches under it)"
    )
    return (
        f"per-rank step times, profiled trace vs timed without the profiler (median): {pairs}; largest difference "
        f"{worst:.1f}%: they {verdict}"
    )


def _us_text(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):,.0f} µs"

"""Running the user's code for the commands that run a model (``profile``, ``apply``): build, warm-up, the step
wrapper, synchronisation, out-of-memory errors, the NVML sampler around the timed steps, the profiled steps.

Whatever the user's code raises becomes one line naming where it happened (:class:`UserCodeError`, exit 3): the
phase, the step (1-based, of how many) and the deepest line of the user's own source. That includes
``sys.exit()`` and other BaseException subclasses a step raises (:func:`gpuadvisor.workload.make_step_fn`); only
KeyboardInterrupt (Ctrl-C, or SIGTERM: :mod:`gpuadvisor.interrupt`) goes through as it is. While the user's code
runs, what it prints on stdout goes to stderr (:func:`user_stdout_to_stderr`), so that ``--format json`` on
stdout stays one JSON document. Torch is imported inside the functions.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuadvisor.errors import UserCodeError
from gpuadvisor.workload import safe_text

if TYPE_CHECKING:
    from gpuadvisor.progress import ProgressDisplay
    from gpuadvisor.workload import Workload

# Profiler schedule around the recorded steps: one step skipped, one recorded and dropped (the profiler's
# own start-up cost lands there), then the active ones.
PROFILE_WAIT = 1
PROFILE_WARMUP = 1
MAX_ERROR_CHARS = 300

StepRunner = Callable[[str, int, int], Any]


@contextmanager
def user_stdout_to_stderr() -> Iterator[None]:
    """Send what the user's code prints on stdout (Python's ``print`` and the C level's file descriptor 1) to
    stderr for the duration, so that the command's own output on stdout (``--format json``) stays clean."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no file descriptors 1 and 2 (an embedding host): Python's level only
        if saved is not None:
            os.close(saved)
        saved = None
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        for stream in (sys.stderr, sys.__stdout__):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def label_of(model_path: Path, entry: str | None) -> str:
    """What errors about the workload name: the file, or the module of a ``pkg.module:function`` entry."""
    return str(model_path) if entry is None or ":" not in entry else entry.rpartition(":")[0]


def build_workload(model_path: Path, entry: str | None, display: ProgressDisplay) -> tuple[Workload, str]:
    """Load the workload and call its build; returns (workload, the label errors name). Running out of GPU
    memory in build() says so, with the sizes."""
    from gpuadvisor.workload import load_workload

    display.phase(f"build {model_path.name}")
    try:
        workload = load_workload(str(model_path), entry)
    except UserCodeError as error:
        oom = oom_error(error, "build()")
        if oom is None:
            raise
        raise oom from error.__cause__
    return workload, label_of(model_path, entry)


def step_runner(step_fn: Callable[[], Any]) -> StepRunner:
    """``run(phase, index, total)``: one step; a failure names the phase and the step (1-based)."""

    def run(phase: str, index: int, total: int) -> Any:
        try:
            return step_fn()
        except UserCodeError as error:
            where = f"the step ({phase}, step {index + 1} of {total})"
            oom = oom_error(error, where)
            if oom is not None:
                raise oom from error.__cause__
            raise UserCodeError(f"{error} during {phase}, step {index + 1} of {total}") from error.__cause__

    return run


def warm_up(run_step: StepRunner, phase: str, steps: int, display: ProgressDisplay, cuda: bool, label: str) -> None:
    """``steps`` untimed steps, then wait for the GPU."""
    display.phase(phase, steps)
    for i in range(steps):
        run_step(phase, i, steps)
        display.advance()
    synchronize(cuda, label, phase)


def synchronize(cuda: bool, label: str, phase: str) -> None:
    """Wait for the GPU; an asynchronous CUDA error of the user's kernels becomes a UserCodeError."""
    if not cuda:
        return
    import torch

    try:
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - e.g. a device-side assert raised by the user's kernels
        oom = oom_error(UserCodeError(f"{label}: {one_line(error)}"), f"the {phase} steps", error)
        if oom is not None:
            raise oom from error
        raise UserCodeError(f"{label}: the GPU reported an error after the {phase} steps: {one_line(error)}") from error


def one_line(error: BaseException) -> str:
    """``TypeName: message`` on one line, at most MAX_ERROR_CHARS of message (an exception whose ``__str__``
    raises is named by its type)."""
    text = " ".join(safe_text(error).split())
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "…"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def is_oom(error: BaseException | None) -> bool:
    """Whether ``error`` is torch's out-of-GPU-memory error."""
    if error is None:
        return False
    try:
        import torch
    except ImportError:  # pragma: no cover - the commands that run a model need torch
        return False
    oom_types = tuple(
        t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if t
    )
    if isinstance(error, oom_types):
        return True
    return isinstance(error, RuntimeError) and "CUDA out of memory" in safe_text(error)


_SIZE = r"[\d.]+ ?[KMGTP]?i?B"


def oom_error(error: UserCodeError, where: str, cause: BaseException | None = None) -> UserCodeError | None:
    """``model.py: CUDA out of memory in build(): tried to allocate 20.00 GiB; 1.20 GiB free of 139.80 GiB``
    when ``error`` (a user-code error) was caused by running out of GPU memory, else None."""
    cause = cause if cause is not None else error.__cause__
    if not is_oom(cause):
        return None
    text = " ".join(safe_text(cause).split())
    label = str(error).split(": ", 1)[0]
    tried = re.search(rf"[Tt]ried to allocate ({_SIZE})", text)
    capacity = re.search(rf"total capacity of ({_SIZE}) of which ({_SIZE}) is free", text)
    if capacity:
        free = f"{capacity.group(2)} free of {capacity.group(1)}"
    else:
        free = free_memory()
    where_in_code = re.search(r"\(at ([^()]+:\d+)\)$", str(error))
    message = (
        f"{label}: CUDA out of memory in {where}: tried to allocate "
        f"{tried.group(1) if tried else 'an unknown amount'}; {free}"
    )
    if where_in_code:
        message += f" (at {where_in_code.group(1)})"
    return UserCodeError(message)


def free_memory() -> str:
    """``1.20 GiB free of 139.80 GiB``, or why that is unknown."""
    try:
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            return f"{free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB"
    except Exception:  # noqa: BLE001 - the device may be in no state to answer
        pass
    return "free GPU memory unknown"


@contextmanager
def sampling_while_timing(sampler, label: str, cuda: bool) -> Iterator[None]:
    """Run the NVML ``sampler`` (if any) around the timed steps, stopping it however they end; a CUDA error
    of the user's kernels, surfacing at a synchronize, becomes a UserCodeError."""
    try:
        if sampler is not None:
            sampler.start()
        yield
    except RuntimeError as error:
        if not cuda or "CUDA" not in safe_text(error):
            raise
        raise UserCodeError(f"{label}: the GPU reported an error during timing: {one_line(error)}") from error
    finally:
        if sampler is not None:
            sampler.stop()


def record_profile(
    workload: Workload, run_step: StepRunner, trace_path: Path, profiled_steps: int, display: ProgressDisplay
) -> Path:
    """Record ``profiled_steps`` steps (after PROFILE_WAIT + PROFILE_WARMUP) under the profiler into
    ``trace_path``; a failing step names the profiling phase and its step."""
    import dataclasses

    from gpuadvisor.capture.profiler import record_trace

    total = PROFILE_WAIT + PROFILE_WARMUP + profiled_steps
    display.phase("profiling", total)
    counter = iter(range(total))

    def profiled_step() -> Any:
        i = next(counter, 0)
        result = run_step("profiling", i, total)
        display.advance()
        return result

    profiled = dataclasses.replace(workload, step_fn=profiled_step)
    return record_trace(
        profiled, trace_path, wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=profiled_steps, with_stack=True
    )

"""Step times without the profiler: CUDA events around each step on a GPU, ``time.perf_counter`` on the CPU.

The profiler slowed an eager decode step 3.2x on the H200 (DESIGN.md, "Measuring"), so the step time a
report quotes comes from here, measured after warm-up.

How the CUDA timing works: the steps run back to back, as in a training or serving loop. A start event is
recorded on the current stream before each step and an end event after it; the host synchronizes once,
after the last step, and reads every sample then (``elapsed_time`` between the step's own two events).
Nothing synchronizes between steps, so no step pays for a sync the workload does not do itself, and the
host may run ahead of the GPU as it does in production. Because step i+1's start event is queued right
behind step i's end event, the samples add up to the GPU time of the whole phase; a step whose GPU waits
for the host to launch its kernels (a launch-bound step) is measured with that wait, which is part of
its cost. ``benchmarks/plain_decode_timing.py`` times the same way without gpuadvisor, as a reference.

Torch is imported inside the functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuadvisor.stats import percentile


@dataclass
class StepTimes:
    """Per-step samples (µs) and how they were measured."""

    samples_us: list[float]
    source: str  # e.g. "CUDA events, 30 steps, no profiler"
    wall_s: float  # wall-clock time of the whole timed phase, host included

    @property
    def median_us(self) -> float | None:
        return percentile(self.samples_us, 50)

    @property
    def p10_us(self) -> float | None:
        return percentile(self.samples_us, 10)

    @property
    def p90_us(self) -> float | None:
        return percentile(self.samples_us, 90)


def time_steps(
    run_step: Callable[[int], Any],
    steps: int,
    *,
    cuda: bool,
    on_step: Callable[[], None] | None = None,
) -> StepTimes:
    """Run ``run_step(i)`` for i in 0..steps-1 and time each call.

    ``cuda``: time with CUDA events on the current stream (see the module docstring); otherwise with
    ``time.perf_counter`` around each call (host wall clock; right for a model that runs on the CPU).
    ``on_step`` runs after each step, outside the measured interval (a progress bar). An exception from a
    step propagates as it is.
    """
    if steps < 1:
        raise ValueError("steps must be at least 1")
    if cuda:
        return _time_cuda(run_step, steps, on_step)
    samples = []
    phase_start = time.perf_counter()
    for i in range(steps):
        start = time.perf_counter()
        run_step(i)
        samples.append((time.perf_counter() - start) * 1e6)
        if on_step is not None:
            on_step()
    wall = time.perf_counter() - phase_start
    return StepTimes(samples, f"CPU wall clock (time.perf_counter), {steps} steps, no profiler, no CUDA", wall)


def _time_cuda(run_step: Callable[[int], Any], steps: int, on_step: Callable[[], None] | None) -> StepTimes:
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(steps)]
    torch.cuda.synchronize()  # nothing from before the phase runs inside the first step's events
    phase_start = time.perf_counter()
    for i in range(steps):
        starts[i].record()
        run_step(i)
        ends[i].record()
        if on_step is not None:
            on_step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - phase_start
    samples = [start.elapsed_time(end) * 1000.0 for start, end in zip(starts, ends)]  # ms -> µs
    return StepTimes(samples, f"CUDA events, {steps} steps, no profiler", wall)

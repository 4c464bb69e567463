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

How long ``optimizer.step()`` takes without the profiler: the profiler's per-operator cost stretches an
optimizer's Python loop over its parameters far more than the rest of a step (a GPT-2 AdamW loop of 2,220
small operators per step took 34 ms of a 97 ms profiled step, and about 9 ms of the 54 ms timed one), so a
saving derived from the profiled region would be several times too large. :class:`OptimizerClock` reads the
host clock in torch.optim's global step pre/post hooks during the timed steps (two ``perf_counter`` reads per
``optimizer.step()`` call, nothing on the GPU) and the step times carry that figure per step. It is host
time: in a step whose GPU waits for the optimizer's launches (the loop this measures) it is also the time the
GPU spends on it.

How long the host takes to enqueue a step (:func:`probe_host`): after the timed steps, each probe waits for the
GPU (``torch.cuda.synchronize``), reads the host clock around one call of the step, and waits again. With the
GPU idle at its start the host never waits for the GPU inside the call (unless the step itself synchronizes,
or launches more kernels than the GPU's launch queue holds: the host started to wait between 512 and 1,024
queued launches on the H200, benchmarks/results/host_bound_check.json), so the figure is the time the step's
Python and launches take the host, the step time it cannot go under while it runs eagerly. A step whose GPU
work shrinks below it turns host-bound: ``benchmarks/host_bound_check.py`` measured a timm ResNet-50 training
step at 32.0 ms with 28.6 ms of host time and 32.0 ms of GPU time; in channels_last the GPU took 23.0 ms and
the step 28.8 ms, the host's time.

Torch is imported inside the functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuadvisor.stats import percentile


@dataclass
class StepTimes:
    """Per-step samples (µs) and how they were measured."""

    samples_us: list[float]
    source: str  # e.g. "CUDA events, 30 steps, no profiler"
    wall_s: float  # wall-clock time of the whole timed phase, host included
    # Host wall time inside torch.optim's optimizer.step() per timed step (µs; the calls of a step summed), from
    # the optimizer step hooks; empty when the step called no optimizer (see OptimizerClock).
    optimizer_step_us: list[float] = field(default_factory=list)
    # Host wall time of one step started with the GPU idle (µs per probe; see the module docstring); empty when
    # no probe ran (the CPU, or host_probes=0).
    host_us: list[float] = field(default_factory=list)
    # What the step takes longer per step with TF32 on, timed in a loop of steps (µs per round of two blocks: the
    # round's ratio from :func:`time_paired_blocks`, less 1, times the timed steps' median; negative where it
    # takes less); empty when not timed.
    tf32_step_delta_us: list[float] = field(default_factory=list)

    @property
    def host_median_us(self) -> float | None:
        return percentile(self.host_us, 50) if self.host_us else None

    @property
    def tf32_step_delta_median_us(self) -> float | None:
        return percentile(self.tf32_step_delta_us, 50) if self.tf32_step_delta_us else None

    @property
    def optimizer_step_median_us(self) -> float | None:
        return percentile(self.optimizer_step_us, 50) if any(self.optimizer_step_us) else None

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
    with OptimizerClock() as clock:
        if cuda:
            times = _time_cuda(lambda i: clock.step(run_step, i), steps, on_step)
        else:
            samples = []
            phase_start = time.perf_counter()
            for i in range(steps):
                start = time.perf_counter()
                clock.step(run_step, i)
                samples.append((time.perf_counter() - start) * 1e6)
                if on_step is not None:
                    on_step()
            wall = time.perf_counter() - phase_start
            times = StepTimes(samples, f"CPU wall clock (time.perf_counter), {steps} steps, no profiler, no CUDA", wall)
    times.optimizer_step_us = clock.per_step_us
    return times


class OptimizerClock:
    """Host time spent inside ``torch.optim.Optimizer.step`` per step, through torch's global step hooks.

    Installed only when torch.optim is already imported (a model without an optimizer never imports it, and
    nothing here imports torch); the hooks are removed on exit, whatever happened. Nested or repeated calls
    within one step are summed; a step that calls no optimizer records 0.
    """

    def __init__(self) -> None:
        self.per_step_us: list[float] = []
        self._handles: list[Any] = []
        self._started: float | None = None
        self._current = 0.0
        self._depth = 0

    def __enter__(self) -> OptimizerClock:
        import sys

        optimizer = sys.modules.get("torch.optim.optimizer")
        pre = getattr(optimizer, "register_optimizer_step_pre_hook", None)
        post = getattr(optimizer, "register_optimizer_step_post_hook", None)
        if pre is not None and post is not None:
            self._handles = [pre(self._pre), post(self._post)]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _pre(self, *args: Any, **kwargs: Any) -> None:
        if self._depth == 0:
            self._started = time.perf_counter()
        self._depth += 1

    def _post(self, *args: Any, **kwargs: Any) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0 and self._started is not None:
            self._current += time.perf_counter() - self._started
            self._started = None

    def step(self, run_step: Callable[[int], Any], i: int) -> Any:
        self._current, self._depth, self._started = 0.0, 0, None
        try:
            return run_step(i)
        finally:
            if self._handles:
                self.per_step_us.append(self._current * 1e6)


def probe_host(run_step: Callable[[int], Any], first_index: int, probes: int) -> list[float]:
    """``probes`` calls ``run_step(first_index + k)``, each timed on the host clock from an idle GPU (the module
    docstring): the host's time to run and enqueue one step, µs per probe. CUDA only."""
    import torch

    samples = []
    for k in range(probes):
        torch.cuda.synchronize()
        start = time.perf_counter()
        run_step(first_index + k)
        samples.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return samples


def time_paired_blocks(
    run_step: Callable[[int], Any], wrap: Callable[[], Any], first_index: int, rounds: int, steps: int
) -> list[float]:
    """What running the step inside ``wrap()`` (a context manager factory) does to its time per step in a loop
    of steps, as a ratio per round (inside over outside; under 1 where the step gets faster): each round times
    two blocks of ``steps`` steps back to back with CUDA events (as :func:`time_steps` does), one inside
    ``wrap()`` and one without, the order alternating so that a slow stretch of the host's clock falls on both
    sides alike; a block's figure is the median of its steps. A ratio, not a difference, because the host's
    speed drifts over seconds and a setting's cost on a host-bound step moves with it: on the H100 the
    single-image ViT step's median went from 7.4 to 11.3 ms over the four quarters of apply's 240 rounds, and
    TF32's cost from 263 to 436 µs, while the ratio stayed between 1.035 and 1.058
    (benchmarks/results/tf32_h100/); a caller scales the ratio by the step time it reports. Each block follows
    an untimed call in its own setting, as the steps of a loop follow one another: a setting that changes
    cuBLAS's or cuDNN's choices pays their first-call heuristics there. Unlike :func:`probe_host`, the GPU is
    not idle at each step's start: a host-bound step is timed as its loop runs it, host and GPU together.
    ``rounds x 2 x (steps + 1)`` calls of ``run_step``. CUDA only."""

    def inside(index: int) -> None:
        with wrap():
            run_step(index)

    index, ratios = first_index, []
    for k in range(rounds):
        medians = {}
        for wrapped in (False, True) if k % 2 == 0 else (True, False):
            run = inside if wrapped else run_step
            run(index)  # untimed: the block after it follows a call in its own setting
            base = index + 1
            times = _time_cuda(lambda i, run=run, base=base: run(base + i), steps, None)
            medians[wrapped] = percentile(times.samples_us, 50)
            index += steps + 1
        if medians[False] > 0:
            ratios.append(medians[True] / medians[False])
    return ratios


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

"""``apply --fix auto`` as a measured search: build candidate stacks of fixes, keep the fastest that passes the guard.

A stack is a list of fix ids run in the registry's order (``gpuadvisor.fixes.registry``). From the fix ids the
before-profile's findings recommend (``recommended``), the candidates are, in this order:

1. everything recommended (what ``auto`` applied before it searched), when anything is;
2. the model-wide levers among them (``sdpa``, ``channels_last``, ``bf16``, ``tf32``, ``fused_optimizer``) with
   ``compile``:
   torch.compile is what a user would otherwise pick, and it fuses, pads GEMMs and (reduce-overhead) replays
   CUDA graphs itself, so ``fusion`` and ``graphs`` are left out of this stack;
3. ``compile`` alone, when stack 2 holds levers (a lever that does not pay under compile must not hide it);
4. the levers with ``graphs`` and without ``fusion``, when stack 1 holds both (a fused kernel that is slower than
   cuBLAS under a graph must not hide the graph);
5. stack 1 without ``bf16``, when it holds both ``bf16`` and ``tf32``: the two are alternatives on the same
   GEMMs, and autocast's casts cost an eager step time TF32 does not (the suite's ViT at batch 32 on the H100:
   bf16+tf32 15.3 ms, tf32 alone 9.2 ms, from 30.9 ms).

Each candidate goes through ``apply_fixes`` on the ORIGINAL workload (each fix works on its own copy or wraps the
step, so no candidate sees another's changes) with the numerics guard on. Candidates that apply nothing, or
apply exactly what an earlier candidate applied, are not timed again. The survivors and the original are then
timed together: ``SEARCH_ROUNDS`` rounds, each running every side for ``SEARCH_STEPS`` steps in a rotating
order (CUDA events, no profiler, after ``SEARCH_WARMUP`` untimed steps), and the candidate with the lowest
median wins when it beats the original's median by more than ``MIN_GAIN``. ``budget_s`` bounds the search: no
new candidate is started once it is spent, and the report says which were skipped.

The order candidates are tried in (``run_order``; the rows keep the listed order): the first stack, then the
first other stack with ``compile`` (compile with the model-wide levers: the most promising), then ``compile``
alone (the plainest stack with compile: what a user would try without gpuadvisor), then the rest as listed. Two
candidates are never skipped by the budget: the first, and compile alone unless a candidate tried before it
applied exactly its fixes, so that the result is never judged without the user's obvious alternative timed
beside it. When the budget is spent before the most promising compile stack starts, compile alone runs in its
place (first among the compile stacks). Why: torch.compile of a ResNet-50 training step takes ~110 s on the H200;
with a 120 s budget, compile alone came third and was skipped on both ResNet-50 steps of the suite, and on the
transformers one, where the lever stack's compile was rolled back, nothing was kept at all.

The result's ``rows`` list every candidate in the listed order: its stack, what it applied, its median, its guard
verdicts, when it was tried (``tried``: 1 for the first applied), and why it lost (slower, nothing applied, a
duplicate, the budget). ``outcomes`` are the winner's fix outcomes, followed by
the first refusal, rollback or failure seen for each other recommended fix, so the report still says why a
recommended fix is not in the result.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LEVERS = ("sdpa", "channels_last", "bf16", "tf32", "fused_optimizer")
DEFAULT_BUDGET_S = 120.0
SEARCH_WARMUP = 3
SEARCH_ROUNDS = 3
SEARCH_STEPS = 10
# The winner must beat the original's median by more than this (a tie is noise, not a reason to change code).
MIN_GAIN = 0.02


@dataclass
class SearchResult:
    patched: Any
    outcomes: list[Any]
    winner: int | None  # index into rows, None when the original stays
    rows: list[dict[str, Any]] = field(default_factory=list)
    original_us: float | None = None
    wall_s: float = 0.0


def candidate_stacks(recommended: list[str], explicit: list[str], order: list[str]) -> list[list[str]]:
    """The candidate stacks (module docstring) from the recommended and the explicitly named fix ids."""
    rank = {fix_id: index for index, fix_id in enumerate(order)}

    def ordered(ids) -> list[str]:
        return sorted(dict.fromkeys(ids), key=lambda fix_id: rank.get(fix_id, len(rank)))

    recommended = [fix_id for fix_id in recommended if fix_id in rank]
    everything = ordered([*recommended, *explicit])
    levers = [fix_id for fix_id in everything if fix_id in LEVERS]
    stacks = []
    if everything:
        stacks.append(everything)
    if "compile" in rank:
        stacks.append(ordered([*levers, *[f for f in explicit if f not in ("fusion", "graphs")], "compile"]))
        if levers:
            stacks.append(ordered([*[f for f in explicit if f not in ("fusion", "graphs")], "compile"]))
    if "fusion" in everything and "graphs" in everything:
        stacks.append(ordered([f for f in everything if f != "fusion"]))
    if "bf16" in everything and "tf32" in everything:
        stacks.append(ordered([f for f in everything if f != "bf16"]))
    unique: list[list[str]] = []
    for stack in stacks:
        if stack and stack not in unique:
            unique.append(stack)
    return unique


def plain_compile(stacks: list[list[str]]) -> int | None:
    """The index of compile alone: the stack with the fewest fixes that holds ``compile`` (the earliest of
    those); ``candidate_stacks`` lists it as ``compile`` plus any fix named beside ``auto``."""
    holding = [index for index, stack in enumerate(stacks) if "compile" in stack]
    return min(holding, key=lambda index: (len(stacks[index]), index)) if holding else None


def run_order(stacks: list[list[str]]) -> list[int]:
    """The order the stacks are tried in (module docstring): the first, the most promising compile stack,
    compile alone, then the rest as listed."""
    if not stacks:
        return []
    order = [0]
    plain = plain_compile(stacks)
    if plain is not None and plain != 0:
        # The first compile stack listed before it (candidate_stacks: the levers with compile), unless the first
        # stack already holds compile: then compile alone comes second.
        promising = next((i for i in range(1, plain) if "compile" in stacks[i]), None)
        if promising is not None and "compile" not in stacks[0]:
            order.append(promising)
        order.append(plain)
    order += [index for index in range(len(stacks)) if index not in order]
    return order


def run_search(
    workload: Any,
    stacks: list[list[str]],
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    cuda: bool,
    phase: Callable[[str], None] = lambda text: None,
    make_runner: Callable[[Any], Callable[[str, int, int], Any]],
    clock: Callable[[], float] = time.perf_counter,
) -> SearchResult:
    """Apply each stack to ``workload``, time the survivors against it, keep the fastest (module docstring)."""
    from gpuadvisor.capture.timing import time_steps
    from gpuadvisor.fixes.registry import apply_fixes
    from gpuadvisor.stats import percentile

    started = clock()
    rows: list[dict[str, Any]] = [
        {"fixes": list(stack), "applied": [], "step_us": None, "status": "", "why": None} for stack in stacks
    ]
    patched_by_row: dict[int, Any] = {}
    outcomes_by_row: dict[int, list[Any]] = {}
    seen_applied: dict[tuple[str, ...], int] = {}
    plain = plain_compile(stacks)
    order = run_order(stacks)
    pending = list(order)
    tried = 0
    while pending:
        elapsed = clock() - started
        spent = tried > 0 and elapsed > budget_s
        if spent and plain in pending and tuple(stacks[plain]) not in seen_applied:
            index = plain  # compile alone is never skipped: it jumps ahead of what the budget skips
        else:
            index = pending[0]
        pending.remove(index)
        stack, row = stacks[index], rows[index]
        if spent and index != plain:
            row.update(status="skipped", why=f"the search budget ({budget_s:g} s) was spent after {elapsed:.0f} s")
            continue
        if spent and tuple(stack) in seen_applied:
            row.update(
                status="skipped",
                why=f"the search budget ({budget_s:g} s) was spent after {elapsed:.0f} s, and candidate"
                f" {seen_applied[tuple(stack)] + 1} applied the same fixes",
            )
            continue
        tried += 1
        row["tried"] = tried
        phase(f"auto: candidate {index + 1}/{len(stacks)}: {'+'.join(stack)}")
        patched, outcomes = apply_fixes(
            workload,
            stack,
            guard=True,
            progress=lambda fix_id, stage, i=index: phase(f"auto {i + 1}: {fix_id} {stage}"),
        )
        applied = tuple(o.fix_id for o in outcomes if o.status == "applied")
        row["applied"] = list(applied)
        row["outcomes"] = [
            {"fix_id": o.fix_id, "status": o.status, "reason": o.reason, "numerics": (o.numerics or {}).get("detail")}
            for o in outcomes
        ]
        row["apply_s"] = round(clock() - started - elapsed, 1)
        outcomes_by_row[index] = outcomes
        if not applied:
            row.update(status="nothing applied", why="every fix in it was refused, rolled back or failed")
            continue
        if applied in seen_applied:
            row.update(status="duplicate", why=f"applied the same fixes as candidate {seen_applied[applied] + 1}")
            continue
        seen_applied[applied] = index
        patched_by_row[index] = patched
        row["status"] = "timed"

    # Time the survivors and the original together, interleaved.
    runners: dict[Any, Callable[[str, int, int], Any]] = {"original": make_runner(workload)}
    for index, patched in patched_by_row.items():
        runners[index] = make_runner(patched)
    samples: dict[Any, list[float]] = {key: [] for key in runners}
    if len(runners) > 1:
        phase("auto: timing the candidates")
        for run in runners.values():
            for i in range(SEARCH_WARMUP):
                run("auto: warm-up", i, SEARCH_WARMUP)
        keys = list(runners)
        for round_index in range(SEARCH_ROUNDS):
            shift = round_index % len(keys)
            for key in keys[shift:] + keys[:shift]:
                run = runners[key]
                times = time_steps(lambda i, run=run: run("auto: timing", i, SEARCH_STEPS), SEARCH_STEPS, cuda=cuda)
                samples[key].extend(times.samples_us)
    original_us = percentile(samples["original"], 50) if samples["original"] else None
    medians = {key: percentile(values, 50) for key, values in samples.items() if key != "original" and values}
    for index, median in medians.items():
        rows[index]["step_us"] = round(median, 1)

    winner = None
    if medians and original_us:
        best = min(medians, key=medians.get)
        if medians[best] < original_us * (1.0 - MIN_GAIN):
            winner = best
    for index in medians:
        row = rows[index]
        if index == winner:
            row.update(status="kept", why=None)
        elif winner is not None:
            row.update(status="slower", why=f"{row['step_us']:,.0f} µs vs {rows[winner]['step_us']:,.0f} µs (kept)")
        else:
            row.update(
                status="slower",
                why=f"{row['step_us']:,.0f} µs vs the original's {original_us:,.0f} µs: not {100 * MIN_GAIN:g}% faster",
            )

    if winner is None:
        patched, outcomes = workload, []
    else:
        patched, outcomes = patched_by_row[winner], list(outcomes_by_row[winner])
    # Why each other fix a candidate tried is not in the result: its first refusal, rollback or failure.
    have = {o.fix_id for o in outcomes}
    for candidate in outcomes_by_row.values():
        for outcome in candidate:
            if outcome.fix_id not in have and outcome.status != "applied":
                outcomes.append(outcome)
                have.add(outcome.fix_id)
    for index in list(patched_by_row):
        if index != winner:
            del patched_by_row[index]
    del runners
    gc.collect()
    if cuda:
        import torch

        torch.cuda.empty_cache()
    return SearchResult(
        patched=patched,
        outcomes=outcomes,
        winner=winner,
        rows=rows,
        original_us=round(original_us, 1) if original_us else None,
        wall_s=round(clock() - started, 1),
    )

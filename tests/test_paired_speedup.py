"""The paired speedup of ``apply``: the median of the per-round ratios, bootstrapped over the rounds.

A host-bound step on a host whose speed drifts over seconds (benchmarks/results/host_noise.json: the H200
machine's vCPUs ran at half speed for seconds at a time) makes each side's pooled median a mix of speeds. The
rounds below reproduce that: every round runs at its own host speed (1x to 2x), before and after alike, and the
fix's true effect is a fixed ratio."""

from __future__ import annotations

import numpy as np
import pytest
from apply_sides import apply_report, summarize

from gpuadvisor.stats import MIN_PAIRED_ROUNDS, paired_speedup, speedup_interval

TRUE_RATIO = 1.08  # the fix takes 7.4% off the step at any host speed
BEFORE_US = 45_000.0


def drifting_rounds(
    rounds: int, steps: int, seed: int = 3, per_block: bool = False
) -> tuple[list[list[float]], list[list[float]]]:
    """Per round, ``steps`` samples a side; the round's host speed is drawn from 1x-2x and shared by its two
    blocks (``per_block``: each block draws its own, as with blocks longer than the host's steady spells), with
    2% step-to-step noise on top."""
    rng = np.random.default_rng(seed)
    before, after = [], []
    for _ in range(rounds):
        slow = rng.uniform(1.0, 2.0)
        before.append(list(BEFORE_US * slow * rng.normal(1.0, 0.02, steps)))
        slow = rng.uniform(1.0, 2.0) if per_block else slow
        after.append(list(BEFORE_US / TRUE_RATIO * slow * rng.normal(1.0, 0.02, steps)))
    return before, after


def test_paired_speedup_recovers_the_ratio_that_pooling_loses_in_host_drift():
    before, after = drifting_rounds(60, 2)
    paired = paired_speedup([float(np.median(b)) for b in before], [float(np.median(a)) for a in after])
    pooled = speedup_interval([x for b in before for x in b], [x for a in after for x in a])
    assert paired["rounds"] == 60
    assert paired["ci_low"] <= TRUE_RATIO <= paired["ci_high"]
    assert paired["median"] == pytest.approx(TRUE_RATIO, rel=0.01)
    assert paired["ci_high"] - paired["ci_low"] < 0.03
    # pooling 120 steps a side across speeds 1x-2x: an interval many times as wide
    assert pooled["ci_high"] - pooled["ci_low"] > 5 * (paired["ci_high"] - paired["ci_low"])
    assert paired_speedup([float(np.median(b)) for b in before], [float(np.median(a)) for a in after]) == paired


def test_paired_speedup_needs_enough_usable_rounds():
    assert paired_speedup([100.0] * (MIN_PAIRED_ROUNDS - 1), [90.0] * (MIN_PAIRED_ROUNDS - 1)) is None
    # rounds without a figure on either side are left out, not read as 0
    before = [100.0] * MIN_PAIRED_ROUNDS + [None, 0.0]
    after = [None] + [80.0] * (MIN_PAIRED_ROUNDS - 1) + [50.0, 50.0]
    assert paired_speedup(before, after) is None
    result = paired_speedup([100.0] * MIN_PAIRED_ROUNDS, [80.0] * MIN_PAIRED_ROUNDS)
    assert result["median"] == result["ci_low"] == result["ci_high"] == pytest.approx(1.25)


def _report(rounds: int, steps: int, per_block: bool = False):
    from gpuadvisor.apply import SideMeasurement
    from gpuadvisor.capture.timing import StepTimes

    before, after = drifting_rounds(rounds, steps, per_block=per_block)
    measured = {}
    for name, blocks in (("before", before), ("after", after)):
        side = SideMeasurement(name)
        for block in blocks:
            side.add_block(StepTimes(block, f"CUDA events, {steps} steps", sum(block) / 1e6), None, 1, 1)
        summarize(side)
        measured[name] = side
    return apply_report(measured, steps=steps, rounds=rounds, fix="fused_optimizer")


def test_apply_report_carries_the_paired_speedup_and_says_when_pooling_misled():
    from gpuadvisor.report.apply_sections import speedup_text

    report = _report(40, 2)
    paired = report["speedup"]["paired"]
    assert paired["rounds"] == 40 and paired["ci_low"] <= TRUE_RATIO <= paired["ci_high"]
    note = next(n for n in report["notes"] if n.startswith("paired over the rounds"))
    pooled = report["speedup"]["median"]
    assert ("lies outside it" in note) == (not paired["ci_low"] <= pooled <= paired["ci_high"])
    assert f"paired over 40 rounds {paired['median']:.3g}x" in speedup_text(report)
    from gpuadvisor.report.html import render_html

    assert "paired over 40 rounds" in render_html(report)


def test_few_disagreeing_rounds_get_advice_instead_of_a_paired_figure():
    report = _report(3, 20, per_block=True)
    assert report["speedup"]["paired"] is None
    ratios = report["speedup"]["round_ratios"]
    assert max(ratios) > 1.1 * min(ratios)  # the drift makes three rounds disagree
    assert any("--rounds 60 --steps 2" in note for note in report["notes"])
    assert not any(n.startswith("paired over the rounds") for n in report["notes"])

"""A precision-keeping fix on top of a precision-changing one: judged against the guarded stack when it misses
the precision policy's bound against the original (gpuadvisor/fixes/registry.py, _against_the_stack)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

pytest.importorskip("torch")

from gpuadvisor.fixes import numerics  # noqa: E402
from gpuadvisor.fixes.base import Applied, Fix  # noqa: E402
from gpuadvisor.fixes.registry import apply_fixes, register_fix, unregister_fix  # noqa: E402
from gpuadvisor.workload import load_workload  # noqa: E402

MODEL = Path(__file__).resolve().parents[1] / "examples" / "tiny_mlp.py"


class Planted(Fix):
    numerics = "model"

    def __init__(self, fix_id: str, factor: float):
        self.id = self.title = fix_id
        self.factor = factor

    def check(self, workload):
        return None

    def apply(self, workload):
        step = workload.step
        factor = self.factor

        @functools.wraps(step)
        def scaled(model, inputs):
            return step(model, inputs) * factor

        patched = workload.with_step(workload.model, scaled)
        patched.planted = self.id
        return Applied(patched, [f"output x {factor}"])


@pytest.fixture
def plant():
    ids = []

    def make(fix_id, factor):
        register_fix(Planted(fix_id, factor))
        ids.append(fix_id)
        return fix_id

    yield make
    for fix_id in ids:
        unregister_fix(fix_id)


def _bf16_applied(outcomes):
    assert outcomes[0].fix_id == "bf16" and outcomes[0].status == "applied", outcomes[0].reason


def test_a_correct_fix_that_misses_against_the_original_passes_against_the_stack(plant, monkeypatch):
    fix_id = plant("planted_same", 1.0)
    real = numerics.check_numerics

    def strict_against_the_original(original, patched, policy, **kw):
        result = real(original, patched, policy, **kw)
        if getattr(patched, "planted", None) == fix_id and policy == "bf16":
            return numerics.NumericsResult(**{**result.to_dict(), "passed": False, "detail": "missed by a hair"})
        return result

    monkeypatch.setattr(numerics, "check_numerics", strict_against_the_original)
    _, outcomes = apply_fixes(load_workload(str(MODEL)), ["bf16", fix_id])
    _bf16_applied(outcomes)
    assert outcomes[1].status == "applied", outcomes[1].reason
    detail = outcomes[1].numerics["detail"]
    assert "missed by a hair" in detail and "against the guarded stack it joins" in detail


def test_a_wrong_fix_on_top_of_bf16_is_still_rolled_back(plant):
    fix_id = plant("planted_scaled", 1.05)
    _, outcomes = apply_fixes(load_workload(str(MODEL)), ["bf16", fix_id])
    _bf16_applied(outcomes)
    assert outcomes[1].status == "rolled_back", outcomes[1].numerics
    assert "against the guarded stack" not in outcomes[1].reason


def test_without_a_precision_fix_nothing_is_judged_twice(plant, monkeypatch):
    fix_id = plant("planted_scaled_alone", 1.05)
    calls = []
    real = numerics.check_numerics
    monkeypatch.setattr(numerics, "check_numerics", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    _, outcomes = apply_fixes(load_workload(str(MODEL)), [fix_id])
    assert outcomes[0].status == "rolled_back" and calls == ["model"]

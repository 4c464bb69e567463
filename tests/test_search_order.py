"""``--fix auto``'s search order and budget (gpuadvisor/search.py), with stub candidates and a fake clock: compile
alone (the user's obvious alternative) is always tried, early, and never skipped by the budget when no candidate
has timed it; the H200 runs of the suite's two ResNet-50 training steps skipped it at 121 s and 132 s of a 120 s
budget, and on transformers' ResNet nothing was kept."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import gpuadvisor.capture.timing as timing
import gpuadvisor.fixes.registry as registry
from gpuadvisor.fixes.base import FixOutcome
from gpuadvisor.search import candidate_stacks, plain_compile, run_order, run_search

ORDER = ["sdpa", "channels_last", "bf16", "fused_optimizer", "fusion", "fp8", "compile", "graphs"]
# The committed H200 searches (benchmarks/results/real_auto_reports): what each stack applied and cost to apply.
RESNET = candidate_stacks(["channels_last", "bf16", "fusion", "graphs"], [], ORDER)


class Clock:
    """A fake perf_counter: time moves only when a stub candidate is applied."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def search(monkeypatch):
    """run_search over stub fixes: ``cost[fix]`` seconds to apply a stack per fix in it, ``refused`` fixes never
    apply, and a patched workload's step takes ``speed[applied stack]`` µs (the original 1,000)."""

    def run(stacks, *, budget_s, cost, speed=None, refused=()):
        clock = Clock()
        tried: list[list[str]] = []

        def apply_fixes(workload, stack, guard=True, progress=None):
            tried.append(list(stack))
            clock.now += sum(cost.get(fix_id, 1.0) for fix_id in stack)
            outcomes = [
                FixOutcome(fix_id, fix_id, "refused" if fix_id in refused else "applied", reason=None)
                for fix_id in stack
            ]
            applied = tuple(o.fix_id for o in outcomes if o.status == "applied")
            return SimpleNamespace(step_us=(speed or {}).get(applied, 900.0), applied=applied), outcomes

        def time_steps(run_step, steps, *, cuda, on_step=None):
            return SimpleNamespace(samples_us=[run_step(i) for i in range(steps)])

        monkeypatch.setattr(registry, "apply_fixes", apply_fixes)
        monkeypatch.setattr(timing, "time_steps", time_steps)
        original = SimpleNamespace(step_us=1000.0)
        result = run_search(
            original,
            stacks,
            budget_s=budget_s,
            cuda=False,
            clock=clock,
            make_runner=lambda w: lambda label, i, n: w.step_us,
        )
        return result, tried

    return run


def test_the_run_order_puts_compile_alone_right_after_the_most_promising_compile_stack():
    assert RESNET == [
        ["channels_last", "bf16", "fusion", "graphs"],
        ["channels_last", "bf16", "compile"],
        ["compile"],
        ["channels_last", "bf16", "graphs"],
    ]
    assert plain_compile(RESNET) == 2 and run_order(RESNET) == [0, 1, 2, 3]
    # The first stack already holds compile (GPT-2 eager attention): compile alone comes second.
    gpt2 = candidate_stacks(["sdpa", "fusion", "compile", "graphs"], [], ORDER)
    assert gpt2[2] == ["compile"] and run_order(gpt2) == [0, 2, 1, 3]
    # A stack list where compile alone is listed last still tries it right after the lever stack.
    assert run_order([["fusion"], ["bf16", "compile"], ["graphs"], ["compile"]]) == [0, 1, 3, 2]
    assert run_order([["fusion", "graphs"]]) == [0] and run_order([]) == []
    # A fix named beside auto rides in every stack: compile alone is compile with it.
    explicit = candidate_stacks(["fusion", "sdpa"], ["bf16"], ORDER)
    assert explicit[plain_compile(explicit)] == ["bf16", "compile"]


def test_compile_alone_is_tried_when_the_lever_stack_spends_the_budget(search):
    # timm's ResNet-50 on the H200: the first stack 13 s, each compile ~110 s, a 120 s budget.
    result, tried = search(RESNET, budget_s=120, cost={"compile": 110.0, "channels_last": 4.0, "bf16": 4.0})
    assert tried == [RESNET[0], RESNET[1], ["compile"]]  # compile alone was not skipped (it was before)
    rows = result.rows
    assert rows[2]["status"] != "skipped" and rows[2]["tried"] == 3 and rows[2]["step_us"] is not None
    assert rows[3]["status"] == "skipped" and "budget (120 s) was spent" in rows[3]["why"]
    assert "tried" not in rows[3]


def test_a_tight_budget_tries_compile_alone_before_the_other_compile_stacks(search):
    # The budget is spent by the first stack: compile alone runs next, the lever stack is skipped.
    result, tried = search(RESNET, budget_s=10, cost={"channels_last": 6.0, "bf16": 6.0})
    assert tried == [RESNET[0], ["compile"]]
    assert result.rows[2]["tried"] == 2
    assert result.rows[1]["status"] == "skipped" and result.rows[3]["status"] == "skipped"
    # Even a zero budget: the first stack and compile alone.
    _, tried = search(RESNET, budget_s=0, cost={})
    assert tried == [RESNET[0], ["compile"]]


def test_compile_alone_wins_where_the_lever_stack_is_slower(search):
    # transformers' ResNet on the H200: channels_last+bf16 timed slower than the original; compile did not.
    result, tried = search(
        RESNET,
        budget_s=120,
        cost={"compile": 110.0},
        speed={("channels_last", "bf16", "graphs"): 1100.0, ("channels_last", "bf16"): 1100.0, ("compile",): 700.0},
        refused={"fusion"},
    )
    assert ["compile"] in tried
    assert result.winner == 2 and result.rows[2]["status"] == "kept"


def test_compile_alone_is_skipped_only_when_a_candidate_before_it_applied_exactly_it(search):
    # The first stack's other fixes were refused: it timed compile alone already.
    stacks = [["fusion", "compile", "graphs"], ["sdpa", "compile"], ["compile"]]
    result, tried = search(stacks, budget_s=1, cost={"compile": 50.0}, refused={"fusion", "graphs"})
    assert tried == [stacks[0]]
    row = result.rows[2]
    assert row["status"] == "skipped" and "candidate 1 applied the same fixes" in row["why"]
    # Within the budget it is tried as before, and reported as the duplicate it is.
    result, tried = search(stacks, budget_s=1000, cost={}, refused={"fusion", "graphs"})
    assert tried == [stacks[0], stacks[2], stacks[1]]
    assert result.rows[2]["status"] == "duplicate" and "candidate 1" in result.rows[2]["why"]


def test_within_the_budget_every_candidate_is_tried_in_order(search):
    result, tried = search(RESNET, budget_s=1e6, cost={"compile": 110.0})
    assert tried == RESNET
    assert [row["tried"] for row in result.rows] == [1, 2, 3, 4]
    assert result.wall_s == pytest.approx(sum(sum(110.0 if f == "compile" else 1.0 for f in s) for s in RESNET))

"""The ``compile`` fix and ``auto``'s measured search, on the CPU with the real-model suite's small sizes.

The mechanics (the compiled call switched in only while the step runs, state restored after the mode trials,
the guard on a stateful training step, the facts in the outcome) are checked with dynamo's ``aot_eager``
backend, which needs no C++ compiler; one test compiles with inductor where a compiler is present.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from gpuadvisor.fixes.base import Refusal  # noqa: E402
from gpuadvisor.fixes.compile import CompileFix, compiled_mode  # noqa: E402
from gpuadvisor.fixes.copying import held_modules  # noqa: E402
from gpuadvisor.fixes.registry import apply_fixes  # noqa: E402
from gpuadvisor.search import candidate_stacks  # noqa: E402
from gpuadvisor.workload import load_workload  # noqa: E402

SUITE = Path(__file__).resolve().parent.parent / "examples" / "real"
OPTIMIZER = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)  # a module-level optimizer


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setenv("GPUADVISOR_REAL_SIZE", "small")
    monkeypatch.setenv("GPUADVISOR_COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_training_step_with_dropout_and_adamw_is_compiled_and_passes_the_guard(small):
    workload = load_workload(str(SUITE / "hf_bert_finetune_amp.py"))
    workload.step_fn()  # the optimizer's state exists, as after apply's warm-up
    weights_before = workload.model.model.classifier.weight.detach().clone()
    patched, (outcome,) = apply_fixes(workload, ["compile"])
    assert outcome.status == "applied", (outcome.reason, outcome.numerics)
    assert outcome.numerics["passed"] and "autocast(bfloat16)" in outcome.numerics["detail"]
    assert outcome.facts["compiled"] == ["model.model"] and outcome.facts["fallback_random"] is True
    assert outcome.facts["mode"] == "default" and outcome.facts["modes"]["default"]["compile_s"] > 0
    # Dynamo traced the model's call: torch 2.13 skips frames of nn.Module's own methods, so compiling
    # ``module._call_impl`` itself ran the step eagerly there and reported it compiled.
    assert outcome.facts["modes"]["default"]["not_compiled"] == []
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    assert compiled_mode(patched) == "default" and compiled_mode(workload) is None
    # The original is untouched: eager between calls (nothing switched in) and its weights where they were.
    assert workload.model.model._compiled_call_impl is None
    assert torch.equal(workload.model.model.classifier.weight, weights_before)
    # The patched step compiles only while it runs.
    patched.step_fn()
    assert patched.model.model._compiled_call_impl is None


def test_a_compiled_step_whose_logits_are_one_percent_off_is_rolled_back(small):
    workload = load_workload(str(SUITE / "hf_bert_classifier.py"))
    applied = CompileFix().apply(workload)
    inner = applied.workload.step

    def wrong(model, inputs):  # the compiled step, its output 1% too large
        return inner(model, inputs) * 1.01

    from gpuadvisor.fixes.numerics import check_numerics

    result = check_numerics(workload, applied.workload.with_step(workload.model, wrong), "model")
    assert not result.passed and "rel-L2 of output" in result.detail, result.detail


def test_a_mode_dynamo_ran_eagerly_is_skipped_not_reported_compiled(small, monkeypatch):
    import gpuadvisor.fixes.compile as compile_fix

    monkeypatch.setattr(compile_fix, "_compiled_code_count", lambda function: 0)
    workload = load_workload(str(SUITE / "hf_bert_classifier.py"))
    with pytest.raises(RuntimeError, match="compiled nothing for model: dynamo ran the step eagerly"):
        CompileFix().apply(workload)


def test_each_module_s_call_has_its_own_code_for_dynamo():
    from gpuadvisor.fixes.compile import _traced_call

    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    assert _traced_call(first).__code__ is not _traced_call(second).__code__
    assert torch.equal(_traced_call(first)(torch.ones(1, 2)), first(torch.ones(1, 2)))


def test_refusals_say_why():
    fix = CompileFix()

    class Holder:
        def __init__(self):
            self.name = "no module here"

    from gpuadvisor.workload import Workload

    plain = Workload("x.py", Holder(), (), lambda: None, None, "x")
    refusal = fix.check(plain)
    assert isinstance(refusal, Refusal) and "holding no torch.nn.Module" in refusal.reason
    module = torch.nn.Linear(4, 4)
    module.compile(backend="eager")
    compiled = Workload("x.py", module, (torch.randn(2, 4),), lambda: None, None, "x")
    refusal = fix.check(compiled)
    assert refusal is not None and "already compiled" in refusal.reason


def test_modules_are_found_on_the_state_object_one_attribute_deep(small):
    workload = load_workload(str(SUITE / "hf_gpt2_train_foreach_off.py"))
    found = held_modules(workload.model)
    assert [label for label, _ in found] == ["model.model"]
    # The compiled step is looked through to the user's: what it reaches (a module-level optimizer) is state.
    from gpuadvisor.fixes.compile import CompiledStep, _SwitchedIn
    from gpuadvisor.fixes.state import step_globals

    def step(model, inputs):
        return OPTIMIZER.step()

    assert "OPTIMIZER" in step_globals(CompiledStep(step, _SwitchedIn([]), "default"))


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="inductor on the CPU needs a C++ compiler")
def test_inductor_compiles_the_bert_classifier_on_the_cpu(monkeypatch):
    monkeypatch.setenv("GPUADVISOR_REAL_SIZE", "small")
    monkeypatch.delenv("GPUADVISOR_COMPILE_BACKEND", raising=False)
    torch._dynamo.reset()
    workload = load_workload(str(SUITE / "hf_bert_classifier.py"))
    patched, (outcome,) = apply_fixes(workload, ["compile"])
    assert outcome.status == "applied", outcome.reason
    assert outcome.facts["modes"]["default"]["graph_breaks"] == 0, outcome.facts
    assert "no graph breaks" in outcome.changes
    torch._dynamo.reset()


def test_auto_candidates_put_compile_beside_the_recommended_stack():
    order = ["sdpa", "channels_last", "bf16", "fused_optimizer", "fusion", "fp8", "compile", "graphs"]
    # A launch-bound decode: the recommended graphs (+ fusion), compile, and graphs without fusion.
    assert candidate_stacks(["graphs", "fusion"], [], order) == [["fusion", "graphs"], ["compile"], ["graphs"]]
    # Eager attention with an unfused chain: the levers ride along with compile, and compile alone.
    assert candidate_stacks(["fusion", "sdpa"], [], order) == [["sdpa", "fusion"], ["sdpa", "compile"], ["compile"]]
    # Nothing recommended: compile is still tried; a fix named beside auto is in every stack.
    assert candidate_stacks([], [], order) == [["compile"]]
    assert candidate_stacks(["graphs"], ["bf16"], order) == [["bf16", "graphs"], ["bf16", "compile"]]
    # Ids the registry does not know are ignored.
    assert candidate_stacks(["pad_vocab"], [], order) == [["compile"]]


def test_the_search_times_what_applied_against_the_original_and_says_why_each_other_lost(small):
    from gpuadvisor.search import run_search
    from gpuadvisor.steps import step_runner

    workload = load_workload(str(SUITE / "hf_bert_classifier.py"))
    result = run_search(
        workload,
        [["graphs"], ["compile"], ["compile"]],
        budget_s=600,
        cuda=False,
        make_runner=lambda w: step_runner(w.step_fn),
    )
    graphs, compiled, again = result.rows
    assert graphs["status"] == "nothing applied" and graphs["outcomes"][0]["status"] == "refused"
    assert compiled["applied"] == ["compile"] and compiled["step_us"] > 0
    assert again["status"] == "duplicate" and "candidate 2" in again["why"]
    assert result.original_us > 0
    if result.winner is None:  # aot_eager on the CPU is rarely faster than eager: then the original stays
        assert compiled["status"] == "slower" and "the original's" in compiled["why"]
        assert result.patched is workload
    else:
        assert result.winner == 1 and compiled["status"] == "kept"
    # graphs' refusal is reported beside the result, so the user sees why it is not in it.
    assert any(o.fix_id == "graphs" and o.status == "refused" for o in result.outcomes)


def test_the_mode_choice_says_how_briefly_it_was_timed(monkeypatch):
    # Two modes that run on the CPU, through dynamo's eager backend (no code generation): the change list names
    # both times and says they come from the selection's own short timing, not the before/after timing.
    monkeypatch.setenv("GPUADVISOR_COMPILE_MODES", "default,max-autotune-no-cudagraphs")
    monkeypatch.setenv("GPUADVISOR_COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    workload = load_workload(str(Path(__file__).resolve().parent.parent / "examples" / "tiny_mlp.py"))
    patched, (outcome,) = apply_fixes(workload, ["compile"], guard=False)
    assert outcome.status == "applied", outcome.reason
    assert sorted(outcome.facts["modes"]) == ["default", "max-autotune-no-cudagraphs"]
    (line,) = [c for c in outcome.changes if c.startswith("mode chosen by measurement")]
    assert line.startswith("mode chosen by measurement (10 steps back to back per mode after its warm-up): ")
    assert outcome.facts["mode"] in line.split(": ", 1)[1].split(" ")[0]
    torch._dynamo.reset()

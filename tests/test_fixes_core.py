"""The core of `apply`: fix registry and order, refusals with the user's source line, the numerics guard, rollback,
and gpuadvisor.optimize. CPU tests run in CI; gpu-marked ones need CUDA (they skip elsewhere)."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import gpuadvisor
from gpuadvisor.errors import BadInputError
from gpuadvisor.fixes.base import Applied, Fix
from gpuadvisor.fixes.graphs import GraphedStep, GraphsFix
from gpuadvisor.fixes.numerics import check_numerics, fresh_inputs, nan_inf_parity, relative_l2, sqnr_db
from gpuadvisor.fixes.registry import (
    FIX_ORDER,
    apply_fixes,
    fix_order,
    load_fix,
    register_fix,
    resolve_fix_ids,
    unregister_fix,
)
from gpuadvisor.fixes.safety import analyze_step
from gpuadvisor.optimizer import keep_lines, optimize
from gpuadvisor.workload import Workload, load_workload

FIXTURES = Path(__file__).parent / "fixtures" / "fix_models"
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


def fixture(name: str) -> Workload:
    return load_workload(str(FIXTURES / f"{name}.py"))


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in [*model.named_parameters(), *model.named_buffers()]}


def assert_unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    after = dict([*model.named_parameters(), *model.named_buffers()])
    assert after.keys() == before.keys()
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), f"{name} changed"


def mlp_workload(dtype: torch.dtype = torch.float32) -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).to(dtype).eval().requires_grad_(False)
    inputs = (torch.randn(16, 32, dtype=dtype),)
    return Workload("mlp.py", model, inputs, lambda: model(*inputs), None, "mlp")


# ---------------------------------------------------------------------------------------------------------------
# Planted fixes


class ScaleOutput(Fix):
    """Breaks the numerics on purpose: the output times 1.05 (relative L2 0.05)."""

    id = "planted_scale"
    title = "planted: output x 1.05"
    numerics = "model"

    def __init__(self, factor: float = 1.05):
        self.factor = factor

    def check(self, workload):
        return None

    def apply(self, workload):
        model = copy.deepcopy(workload.model)
        user_step = workload.step
        factor = self.factor
        return Applied(workload.with_step(model, lambda m, inputs: user_step(m, inputs) * factor), ["scaled"])


class Raises(Fix):
    id = "planted_raise"
    title = "planted: raises"

    def check(self, workload):
        return None

    def apply(self, workload):
        raise RuntimeError("planted failure\nsecond line")


class Identity(Fix):
    id = "planted_identity"
    title = "planted: a copy of the model"

    def check(self, workload):
        return None

    def apply(self, workload):
        return Applied(workload.with_model(copy.deepcopy(workload.model)), ["copied"])


@pytest.fixture
def planted():
    fixes = [ScaleOutput(), Raises(), Identity()]
    for fix in fixes:
        register_fix(fix)
    yield {fix.id: fix for fix in fixes}
    for fix in fixes:
        unregister_fix(fix.id)


# ---------------------------------------------------------------------------------------------------------------
# Registry


def test_fix_order_puts_module_swaps_before_the_graph():
    # Model-wide switches, then module swaps, then what compiles or captures the result.
    assert FIX_ORDER == (
        "sdpa",
        "channels_last",
        "bf16",
        "tf32",
        "fused_optimizer",
        "fusion",
        "fp8",
        "compile",
        "graphs",
    )
    assert resolve_fix_ids("graphs,fusion,fp8", []) == ["fusion", "fp8", "graphs"]
    assert resolve_fix_ids("graphs,bf16,sdpa,compile", []) == ["sdpa", "bf16", "compile", "graphs"]
    assert resolve_fix_ids(" Graphs , graphs ", []) == ["graphs"]


def test_resolve_auto_takes_the_recommended_fixes_in_order():
    assert resolve_fix_ids("auto", ["graphs", "fusion", "graphs"]) == ["fusion", "graphs"]
    # A rule may name a fix that is not built yet: auto ignores it.
    assert resolve_fix_ids("auto", ["int4_weights", "graphs"]) == ["graphs"]
    assert resolve_fix_ids("auto", []) == []


def test_resolve_unknown_and_empty_are_bad_input():
    with pytest.raises(BadInputError, match=r"unknown fix 'graph'.*graphs"):
        resolve_fix_ids("graph", [])
    for text in ("", " , "):
        with pytest.raises(BadInputError, match="no fix named"):
            resolve_fix_ids(text, [])


def test_planted_fixes_run_before_graphs(planted):
    order = fix_order()
    assert order[-1] == "graphs" and order.index("planted_scale") > order.index("fp8")
    assert resolve_fix_ids("graphs,planted_identity", []) == ["planted_identity", "graphs"]


# ---------------------------------------------------------------------------------------------------------------
# Refusals: each names the reason and the user's source line, and changes nothing


def refusal_of(workload: Workload) -> str:
    before = snapshot(workload.model)
    model = workload.model
    final, outcomes = apply_fixes(workload, ["graphs"])
    assert final is workload and workload.model is model
    assert_unchanged(model, before)
    (outcome,) = outcomes
    assert outcome.status == "refused", outcome
    assert "\n" not in outcome.reason
    assert outcome.suggestion
    return outcome.reason


def test_graphs_refuses_item_in_forward():
    reason = refusal_of(fixture("item_in_forward"))
    assert re.search(r"host sync: \.item\(\) at item_in_forward\.py:13\b", reason), reason
    if not CUDA:
        assert "also: needs a CUDA device" in reason


def test_graphs_refuses_data_dependent_control_flow():
    reason = refusal_of(fixture("tensor_if"))
    assert "data-dependent control flow" in reason and "tensor_if.py:13" in reason, reason


def test_graphs_refuses_changing_shapes():
    reason = refusal_of(fixture("random_length"))
    assert "shapes change between two calls of the step" in reason and "random_length.py:25" in reason, reason


@pytest.mark.gpu
@needs_cuda
def test_graphs_refuses_cpu_work_in_a_cuda_model():
    workload = fixture("cpu_tensor")
    refusal_of(workload)
    details = GraphsFix().check(workload).details
    assert any("CPU" in line and "cpu_tensor.py:13" in line for line in details), details
    assert any("copy to the CPU" in line and "cpu_tensor.py:15" in line for line in details), details


@pytest.mark.skipif(CUDA, reason="the fixture builds on the GPU there, where the graph applies")
def test_graphs_on_a_clean_cpu_model_refuses_for_the_device_only():
    reason = refusal_of(fixture("clean_mlp"))
    assert reason.startswith("needs a CUDA device"), reason


def test_analysis_finds_data_dependent_shapes_and_ignores_first_call_initialization():
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 1:
                x.sum().item()  # lazy initialization reads a value once: the graph's warm-up absorbs it
            kept = x[x > 0]
            return kept.sum() + torch.nonzero(x).float().sum()

    model = Masked()
    inputs = (torch.randn(8),)
    analysis = analyze_step(Workload("m.py", model, inputs, lambda: None, None, "m"))
    kinds = [(finding.kind, finding.reason) for finding in analysis.findings]
    assert [kind for kind, _ in kinds] == ["data_dependent_shape", "data_dependent_shape"], kinds
    assert "boolean-mask indexing" in kinds[0][1] and "nonzero" in kinds[1][1]
    assert model.calls == 0  # the analysis ran on a copy


def test_analysis_reports_state_the_step_writes_and_leaves_the_model_alone():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(4, 3))

        def forward(self, x, position):
            self.cache.index_copy_(0, position, x)
            return self.cache.sum(0)

    model = Counter()
    before = snapshot(model)
    inputs = (torch.ones(1, 3), torch.tensor([2]))
    analysis = analyze_step(Workload("c.py", model, inputs, lambda: None, None, "c"))
    assert analysis.writes_state == ["model.cache"] and analysis.findings == []
    assert_unchanged(model, before)


# ---------------------------------------------------------------------------------------------------------------
# The apply loop: rollback and failure keep the previous stage, the original is never touched


def test_numerics_failure_rolls_back_with_the_numbers(planted):
    workload = mlp_workload()
    before = snapshot(workload.model)
    final, (outcome,) = apply_fixes(workload, ["planted_scale"])
    assert outcome.status == "rolled_back"
    assert final is workload
    assert "numerics guard failed" in outcome.reason
    assert "5.00e-02" in outcome.reason and "bound 0.0001" in outcome.reason, outcome.reason
    assert outcome.numerics["passed"] is False and outcome.numerics["value"] == pytest.approx(0.05, rel=1e-3)
    assert_unchanged(workload.model, before)


def test_exception_in_a_fix_is_failed_on_one_line_and_rolled_back(planted):
    workload = mlp_workload()
    before = snapshot(workload.model)
    progress = []
    final, outcomes = apply_fixes(
        workload, ["planted_identity", "planted_raise"], progress=lambda fix_id, stage: progress.append((fix_id, stage))
    )
    # Extra fixes run in registration order: planted_raise (registered before planted_identity) first.
    assert [outcome.fix_id for outcome in outcomes] == ["planted_raise", "planted_identity"]
    failed, identity = outcomes
    assert identity.status == "applied" and identity.numerics["passed"]
    assert failed.status == "failed"
    assert failed.reason.startswith("raised while applying: RuntimeError: planted failure second line")
    assert "\n" not in failed.reason and "test_fixes_core.py" in failed.reason
    assert "Traceback" in failed.debug_traceback and "debug_traceback" not in failed.to_dict()
    assert final.model is not workload.model  # the stage after the failure ran on the original and was kept
    assert_unchanged(workload.model, before)
    assert ("planted_raise", "apply") in progress and ("planted_raise", "failed") in progress


def test_guard_compares_with_the_original_not_the_previous_stage():
    # Two stages that each scale by 1.00007 (rel-L2 7e-5, under the fp32 bound 1e-4): the second looks fine
    # against the first stage, but together they are 1.4e-4 away from the original.
    register_fix(ScaleOutput(1.00007), "planted_first")
    register_fix(ScaleOutput(1.00007), "planted_second")
    try:
        _, outcomes = apply_fixes(mlp_workload(), ["planted_first", "planted_second"])
    finally:
        unregister_fix("planted_first")
        unregister_fix("planted_second")
    assert [outcome.status for outcome in outcomes] == ["applied", "rolled_back"]
    assert outcomes[1].numerics["value"] == pytest.approx(1.4e-4, rel=1e-2)


def test_after_an_fp8_stage_later_stages_are_held_to_the_fp8_bound():
    # A 1% change (SQNR 40 dB) passes an fp8-policy stage; the identity stage after it still carries that 1%
    # against the original, which the fp32 bound (1e-4) would reject: it is judged by fp8's SQNR instead.
    lossy = ScaleOutput(1.01)
    lossy.numerics = "fp8"
    register_fix(lossy, "planted_lossy")
    register_fix(Identity(), "planted_after")
    try:
        _, outcomes = apply_fixes(mlp_workload(), ["planted_lossy", "planted_after"])
    finally:
        unregister_fix("planted_lossy")
        unregister_fix("planted_after")
    assert [outcome.status for outcome in outcomes] == ["applied", "applied"]
    assert outcomes[1].numerics["metric"] == "sqnr_db"
    assert outcomes[1].numerics["value"] == pytest.approx(40.0, abs=0.1)


def test_guard_off_applies_without_numerics(planted):
    final, (outcome,) = apply_fixes(mlp_workload(), ["planted_scale"], guard=False)
    assert outcome.status == "applied" and outcome.numerics is None


def test_unknown_fix_id_is_bad_input():
    with pytest.raises(BadInputError, match="unknown fix"):
        apply_fixes(mlp_workload(), ["nope"])


def test_fp8_on_cpu_is_refused_with_the_reason():
    load_fix("fp8")
    if CUDA:
        pytest.skip("this test is about a machine without CUDA")
    workload = mlp_workload()
    before = snapshot(workload.model)
    final, (outcome,) = apply_fixes(workload, ["fp8"])
    assert outcome.status == "refused", outcome
    assert re.search(r"CUDA|compute capability|Hopper|GPU", outcome.reason), outcome.reason
    assert final is workload
    assert_unchanged(workload.model, before)


# ---------------------------------------------------------------------------------------------------------------
# Numerics


def test_relative_l2_and_sqnr_by_hand():
    reference = torch.tensor([3.0, 4.0])  # norm 5
    test = torch.tensor([3.0, 4.5])  # error norm 0.5
    assert relative_l2(test, reference) == pytest.approx(0.1)
    assert sqnr_db(test, reference) == pytest.approx(10 * math.log10(25 / 0.25))  # 20 dB
    assert relative_l2(reference, reference) == 0.0 and sqnr_db(reference, reference) == math.inf
    zeros = torch.zeros(2)
    assert relative_l2(zeros, zeros) == 0.0 and relative_l2(test, zeros) == math.inf
    # bf16 inputs are compared in float64: no rounding of the difference itself.
    assert relative_l2(test.bfloat16(), reference.bfloat16()) == pytest.approx(0.1)


def test_nan_inf_parity():
    a = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert nan_inf_parity(a.clone(), a)
    assert not nan_inf_parity(torch.tensor([1.0, 2.0, float("inf"), -float("inf")]), a)
    assert not nan_inf_parity(torch.tensor([1.0, float("nan"), -float("inf"), float("inf")]), a)


def test_nan_parity_failure_fails_the_guard():
    original = mlp_workload()
    model = copy.deepcopy(original.model)

    def nan_step(m, inputs):
        out = m(*inputs).clone()
        out[0, 0] = float("nan")
        return out

    result = check_numerics(original, original.with_step(model, nan_step), "model")
    assert not result.passed and result.nan_inf_parity is False
    assert "NaN/Inf parity" in result.detail


def test_fresh_inputs_keep_shapes_dtypes_and_valid_ranges():
    example = (torch.randn(4, 8) * 3, torch.tensor([[5, 1023]]), torch.tensor([True, False]), 7, {"k": torch.ones(2)})
    fresh = fresh_inputs(example, seed=0)
    again = fresh_inputs(example, seed=0)
    assert fresh[0].shape == (4, 8) and fresh[0].dtype == torch.float32 and not torch.equal(fresh[0], example[0])
    assert 1.5 < fresh[0].std().item() < 5  # scaled to the example's std (about 3)
    assert fresh[1].dtype == torch.int64 and 0 <= fresh[1].min() and fresh[1].max() <= 1023
    assert fresh[2].dtype == torch.bool and fresh[3] == 7
    assert fresh[4]["k"].shape == (2,)  # constant example (std 0): plain randn
    assert all(torch.equal(a, b) for a, b in zip(fresh[:3], again[:3]))


def test_model_policy_measures_the_bf16_models_own_error_against_fp32():
    original = mlp_workload(torch.bfloat16)
    same = check_numerics(original, original.with_model(copy.deepcopy(original.model)), "model")
    assert same.passed and same.metric == "rel_l2_vs_fp32_reference" and same.dtype == "bfloat16"
    # bf16 rounding of this MLP's output: small but not zero (unit roundoff 2^-8 = 3.9e-3).
    assert 1e-4 < same.reference_error < 1e-2
    assert same.value == pytest.approx(same.reference_error)
    assert same.bound == pytest.approx(max(2 * same.reference_error, 1e-2))
    assert "the original's own" in same.detail

    # 3% off is beyond max(2 x the model's own error, 1e-2): rejected, with both numbers.
    def off(m, inputs):
        return m(*inputs) * 1.03

    worse = check_numerics(original, original.with_step(copy.deepcopy(original.model), off), "model")
    assert (
        not worse.passed
        and worse.value > worse.bound
        # the model's own error on the trial judged worst: the same order as above
        and worse.reference_error == pytest.approx(same.reference_error, rel=0.5)
    )


def test_fp32_model_uses_the_fixed_bound_against_the_original():
    original = mlp_workload()
    result = check_numerics(original, original.with_model(copy.deepcopy(original.model)), "model")
    assert result.passed and result.metric == "rel_l2_vs_original" and result.bound == 1e-4
    assert result.reference_error is None and result.value == 0.0


def test_fp8_policy_is_sqnr_against_the_original():
    original = mlp_workload()

    def noisy(m, inputs):  # about 1% noise: 40 dB
        out = m(*inputs)
        return out + 0.01 * out.std() * torch.randn(out.shape, generator=torch.Generator().manual_seed(1))

    result = check_numerics(original, original.with_step(copy.deepcopy(original.model), noisy), "fp8")
    assert result.passed and result.metric == "sqnr_db" and result.bound == 25.0 and 35 < result.value < 45

    def very_noisy(m, inputs):
        out = m(*inputs)
        return out + 0.2 * out.std() * torch.randn(out.shape, generator=torch.Generator().manual_seed(1))

    assert not check_numerics(original, original.with_step(original.model, very_noisy), "fp8").passed


def test_structured_outputs_and_exact_integer_outputs():
    @dataclasses.dataclass
    class Output:
        logits: torch.Tensor
        tokens: torch.Tensor

    original = mlp_workload()

    def structured(m, inputs):
        logits = m(*inputs)
        return {"out": Output(logits, logits.argmax(-1)), "extra": (logits.sum(), None)}

    def flipped(m, inputs):
        result = structured(m, inputs)
        result["out"].tokens[0] += 1
        return result

    base = original.with_step(original.model, structured)
    assert check_numerics(base, base.with_model(copy.deepcopy(original.model)), "model").passed
    result = check_numerics(base, base.with_step(original.model, flipped), "model")
    assert not result.passed and "tokens" in result.detail and "differs in 1 of 16" in result.detail


def test_stateful_step_compares_on_copies_and_leaves_the_original():
    class Cache(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.randn(8, 4))

        def forward(self, x, position):
            self.cache.index_copy_(0, position, x)  # idempotent: the same slot, the same values
            return self.cache * 2

    torch.manual_seed(0)
    model = Cache()
    inputs = (torch.randn(1, 4), torch.tensor([7]))
    original = Workload("cache.py", model, inputs, lambda: None, None, "cache")
    before = snapshot(model)
    result = check_numerics(original, original.with_model(copy.deepcopy(model)), "model")
    assert result.passed, result.detail
    assert_unchanged(model, before)


def test_step_without_tensors_cannot_be_judged():
    original = Workload("none.py", nn.Linear(2, 2), (torch.randn(1, 2),), lambda: None, None, "none")
    original = original.with_step(original.model, lambda m, inputs: None)
    result = check_numerics(original, original, "model")
    assert not result.passed and "no floating tensor" in result.detail


def test_a_step_returning_only_token_ids_is_not_judged_and_says_what_to_return():
    """A generate() step returns token ids: equal ids cannot show a fix's float error, so the guard asks for
    the scores instead of passing it."""
    model = nn.Linear(4, 8)
    original = Workload("gen.py", model, (torch.randn(3, 4),), lambda: None, None, "gen")
    original = original.with_step(model, lambda m, inputs: m(*inputs).argmax(-1))
    result = check_numerics(original, original.with_model(copy.deepcopy(model)), "model")
    assert not result.passed
    assert "only integer tensors (output, int64; equal to the original's in every trial)" in result.detail
    assert "output_scores=True" in result.detail


# ---------------------------------------------------------------------------------------------------------------
# GraphedStep input checks (CPU: a stand-in graph)


class _FakeGraph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def test_graphed_step_copies_inputs_and_checks_shapes():
    static = torch.zeros(2, 3)
    output = torch.zeros(1)
    graph = _FakeGraph()
    graphed = GraphedStep(graph, (static, 5), output, model=None)
    new = torch.ones(2, 3)
    assert graphed(new, 5) is output and graph.replays == 1 and torch.equal(static, new)
    with pytest.raises(ValueError, match=r"captured for input 0 of shape \(2, 3\) float32 .* got shape \(2, 4\)"):
        graphed(torch.ones(2, 4), 5)
    with pytest.raises(ValueError, match="captured with input 1 = 5"):
        graphed(new, 6)
    with pytest.raises(ValueError, match="captured for 2 inputs, got 1"):
        graphed(new)


# ---------------------------------------------------------------------------------------------------------------
# optimize()


@pytest.mark.skipif(CUDA, reason="on a GPU the graph applies (test_optimize_graphs_on_cuda)")
def test_optimize_on_cpu_falls_back_and_warns_once():
    workload = fixture("clean_mlp")
    model, (x,) = workload.model, workload.inputs
    before = snapshot(model)
    with pytest.warns(RuntimeWarning) as caught:
        opt = gpuadvisor.optimize(model, (x,), fixes=("graphs",))
    assert len(caught) == 1 and "graphs refused: needs a CUDA device" in str(caught[0].message)
    assert torch.equal(opt(x), model(x))
    assert [outcome.status for outcome in opt.fixes] == ["refused"]
    assert "graphs: refused" in opt.report()
    assert_unchanged(model, before)


def test_optimize_strict_raises_with_the_reason():
    model = nn.Linear(4, 4)
    with warnings.catch_warnings(record=True) as caught:
        with pytest.raises(BadInputError, match=r"graphs refused: host sync: \.item\(\)"):
            optimize(lambda x: model(x) * model(x).sum().item(), (torch.randn(2, 4),), fixes=["graphs"], strict=True)
    assert not [warning for warning in caught if "gpuadvisor.optimize" in str(warning.message)]  # raised, not warned


def test_optimize_bad_arguments():
    with pytest.raises(BadInputError, match="unknown fix"):
        optimize(nn.Linear(2, 2), (torch.randn(1, 2),), fixes=["grahps"])
    with pytest.raises(BadInputError, match="auto"):
        optimize(nn.Linear(2, 2), (torch.randn(1, 2),), fixes="auto")
    with pytest.raises(BadInputError, match=r"tuple.*\(x,\)"):
        optimize(nn.Linear(2, 2), torch.randn(1, 2))


class KeywordNet(nn.Module):
    """A model called with keyword inputs, as transformers models are: model(input_ids=..., scale=...)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, features, scale):
        return self.linear(features) * scale


def test_optimize_takes_a_batch_dict_and_is_called_with_it_or_its_keywords():
    torch.manual_seed(0)
    model = KeywordNet()
    batch = {"features": torch.randn(2, 4), "scale": torch.tensor(3.0)}
    opt = optimize(model, batch, fixes=["fused_optimizer"], guard=False)  # refused (no optimizer): runs as is
    assert opt.workload.inputs == (batch,)
    expected = model(**batch)
    assert torch.equal(opt(batch), expected) and torch.equal(opt(**batch), expected)
    with pytest.raises(TypeError, match=r"opt\(batch\)"):
        opt(batch, batch)
    # a step of the user's own takes the dict itself
    seen = []
    opt = optimize(model, batch, fixes=["fused_optimizer"], guard=False, step=lambda m, b: seen.append(b) or m(**b))
    assert torch.equal(opt(batch), expected) and seen[-1] is batch


@pytest.mark.parametrize("fixes", [[], (), "", " , "])
def test_optimize_without_a_fix_speaks_the_api_terms(fixes):
    """Issue 16: fixes=[] said "--fix: no fix named; expected auto or ..." (a CLI flag, and a value optimize
    refuses). The API's errors name its own parameter and the values it takes."""
    with pytest.raises(BadInputError) as caught:
        optimize(nn.Linear(2, 2), (torch.randn(1, 2),), fixes=fixes)
    message = str(caught.value)
    assert message.startswith("fixes: no fix named; expected a list of fix ids: sdpa, ")
    assert "--fix" not in message and "auto" not in message


def test_optimize_unknown_fix_speaks_the_api_terms():
    with pytest.raises(BadInputError) as caught:
        optimize(nn.Linear(2, 2), (torch.randn(1, 2),), fixes=["grahps"])
    message = str(caught.value)
    assert message.startswith("fixes: unknown fix 'grahps'; known fixes: ") and "graphs" in message
    assert "--fix" not in message and "auto" not in message


def test_keep_lines():
    assert keep_lines(["graphs", "fusion"]) == [
        "import gpuadvisor",
        'model = gpuadvisor.optimize(model, example_inputs, fixes=["fusion", "graphs"])',
    ]


def test_import_gpuadvisor_stays_light(python):
    code = (
        "import sys, gpuadvisor; assert 'torch' not in sys.modules;"
        "import gpuadvisor.optimizer, gpuadvisor.fixes.registry; assert 'torch' not in sys.modules;"
        "assert callable(gpuadvisor.optimize); print('ok')"
    )
    result = python("-c", code)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


# ---------------------------------------------------------------------------------------------------------------
# GraphsFix on CUDA


@pytest.mark.gpu
@needs_cuda
def test_graphs_fix_on_cuda():
    workload = fixture("clean_mlp")
    before = snapshot(workload.model)
    final, (outcome,) = apply_fixes(workload, ["graphs"])
    assert outcome.status == "applied", outcome
    assert outcome.numerics["passed"] and outcome.numerics["metric"] == "rel_l2_vs_original"
    (x,) = workload.inputs
    eager = workload.model(x)
    torch.testing.assert_close(final.step_fn(), eager)
    # New data through the static buffers; the output is the graph's, overwritten by the next replay.
    other = torch.randn_like(x)
    replayed = final.step(final.model, (other,))
    torch.testing.assert_close(replayed, workload.model(other))
    with pytest.raises(ValueError, match=r"captured for input 0 of shape \(16, 32\)"):
        final.step(final.model, (torch.randn(8, 32, device="cuda"),))
    assert_unchanged(workload.model, before)


@pytest.mark.gpu
@needs_cuda
def test_optimize_graphs_on_cuda():
    workload = fixture("clean_mlp")
    (x,) = workload.inputs
    opt = gpuadvisor.optimize(workload.model, (x,), fixes=["graphs"], strict=True)  # strict: raises unless applied
    torch.testing.assert_close(opt(x).clone(), workload.model(x))


@pytest.mark.gpu
@needs_cuda
def test_graphs_fix_on_a_stateful_decode_step_captures_a_copy():
    workload = load_workload(str(Path(__file__).parents[1] / "examples" / "llama_decode.py"))
    # One eager step first: it writes the KV cache at the input position (idempotently from then on).
    eager = workload.step_fn().clone()
    before = snapshot(workload.model)
    final, (outcome,) = apply_fixes(workload, ["graphs"])
    assert outcome.status == "applied", outcome
    assert outcome.numerics["metric"] == "rel_l2_vs_fp32_reference", outcome.numerics
    assert any("captured on a copy of the model" in change for change in outcome.changes)
    assert final.model is not workload.model
    assert_unchanged(workload.model, before)
    # The guard wrote random slots of the graph's cache; a fresh capture replays exactly what eager computes.
    fix = GraphsFix()
    assert fix.check(workload) is None
    patched = fix.apply(workload).workload
    torch.testing.assert_close(patched.step_fn().clone(), eager)


def test_keep_lines_pass_the_files_own_step_on():
    assert keep_lines(["graphs", "fusion"]) == [
        "import gpuadvisor",
        'model = gpuadvisor.optimize(model, example_inputs, fixes=["fusion", "graphs"])',
    ]
    assert keep_lines(["graphs"], with_step=True)[1].endswith('fixes=["graphs"], step=step)')

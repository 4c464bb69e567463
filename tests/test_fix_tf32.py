"""The ``tf32`` fix (gpuadvisor/fixes/tf32.py) and its numerics policy (``tf32_rounding`` in
gpuadvisor/fixes/numerics.py): GA301's fp32 SIMT GEMMs moved onto the tensor cores, judged against the model's
own TF32 rounding. TF32 itself needs a CUDA GPU; the policy runs here on the CPU with TF32 emulated."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

from gpuadvisor.fixes import numerics  # noqa: E402
from gpuadvisor.fixes.autocast import Bf16Fix  # noqa: E402
from gpuadvisor.fixes.base import Applied  # noqa: E402
from gpuadvisor.fixes.registry import apply_fixes, fix_order  # noqa: E402
from gpuadvisor.fixes.tf32 import Tf32Fix, tf32_allowed  # noqa: E402
from gpuadvisor.search import candidate_stacks  # noqa: E402
from gpuadvisor.workload import Workload  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite_workloads import assert_same_state, load, state_values  # noqa: E402


@pytest.fixture(autouse=True)
def one_trial(monkeypatch):
    monkeypatch.setattr(numerics.check_numerics, "__kwdefaults__", {"trials": 1, "seed": 0})


def only(workload, fix_id):
    final, (outcome,) = apply_fixes(workload, [fix_id])
    return final, outcome


def truncated_tf32(convolutions: bool = True) -> TorchFunctionMode:
    """TF32 as tensor cores may take it: the matmul operands' 13 low mantissa bits dropped (toward zero, not to
    nearest, so biased against the guard's emulation), gradients left in float32. ``convolutions=False``: the
    convolutions as they are (on a GPU cuDNN runs them in TF32 before and after the fix alike)."""
    from torch.nn import functional

    lowered = numerics._lowered_ops()
    if not convolutions:
        lowered -= {functional.conv1d, functional.conv2d, functional.conv3d}

    def cut(value):
        if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
            bits = value.detach().contiguous().view(torch.int32) & ~0x1FFF
            return value + (bits.view(torch.float32) - value).detach()
        if isinstance(value, (list, tuple)) and any(isinstance(item, torch.Tensor) for item in value):
            return type(value)(cut(item) for item in value)
        return value

    class Truncated(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func not in lowered:
                return func(*args, **kwargs)
            return func(*[cut(a) for a in args], **{k: cut(v) for k, v in kwargs.items()})

    return Truncated()


def under(mode_factory, scale: float = 1.0):
    """A planted fix: the step run under ``mode_factory()`` (its output times ``scale``)."""

    def make(workload):
        step = workload.step

        @functools.wraps(step)
        def patched(model, inputs):
            with mode_factory():
                out = step(model, inputs)
            return out * scale if scale != 1.0 else out

        return Applied(workload.with_step(workload.model, patched), ["planted"])

    return make


# ---------------------------------------------------------------------------------------------------------------
# rounding


def test_round_to_tf32_keeps_ten_mantissa_bits_to_nearest_ties_to_even():
    u = 2.0**-11  # half of TF32's last place at 1.0
    largest = torch.finfo(torch.float32).max
    values = torch.tensor(
        [1 + u, 1 + 3 * u, 1 + u + 2.0**-20, -(1 + 3 * u), 1 + 2.0**-10, 0.0, float("inf"), float("nan"), largest]
    )
    rounded = numerics.round_to_tf32(values)
    expected = [1.0, 1 + 4 * u, 1 + 2 * u, -(1 + 4 * u), 1 + 2.0**-10, 0.0, float("inf")]
    assert rounded[:7].tolist() == expected
    assert torch.isnan(rounded[7])
    assert torch.isinf(rounded[8])  # the largest float32 rounds up past the largest TF32 value, as to nearest does
    x = torch.randn(100_000, dtype=torch.float32)
    relative = ((numerics.round_to_tf32(x) - x).abs() / x.abs()).max().item()
    assert 2.0**-12 < relative <= 2.0**-11  # at most half a last place, and rounding does happen
    low_bits = numerics.round_to_tf32(x).view(torch.int32) & 0x1FFF
    assert int(low_bits.abs().sum()) == 0


def test_tf32_rounding_rounds_forward_operands_and_backward_gradients_but_not_results():
    a = torch.randn(64, 64, requires_grad=True)
    b = torch.randn(64, 64)
    with numerics.tf32_rounding():
        out = a @ b
    exact = numerics.round_to_tf32(a.detach()) @ numerics.round_to_tf32(b)
    assert torch.equal(out.detach(), exact)  # float32 product of rounded operands; the result is not rounded
    assert int((out.detach().view(torch.int32) & 0x1FFF).abs().sum()) > 0
    grad = torch.randn(64, 64)
    out.backward(grad)
    expected = numerics.round_to_tf32(grad) @ numerics.round_to_tf32(b).T
    assert torch.allclose(a.grad, expected, rtol=0, atol=1e-5)
    assert not torch.allclose(a.grad, grad @ numerics.round_to_tf32(b).T, rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# the policy on suite models (CPU)


def test_a_truncating_tf32_passes_and_bf16_or_a_one_percent_scale_fail_on_vit(monkeypatch, planted):
    workload = load("hf_vit_infer", monkeypatch)
    before = state_values(workload)
    _, outcome = only(workload, planted("planted_tf32_truncated", under(truncated_tf32), "tf32"))
    assert outcome.status == "applied", outcome.reason
    numbers = outcome.numerics
    assert numbers["policy"] == "tf32" and numbers["metric"] == "rel_l2_vs_tf32_rounding"
    assert 0 < numbers["reference_error"] < 2e-3 and numbers["value"] <= numbers["bound"]
    assert "the original with TF32 rounding where TF32 rounds" in numbers["detail"]
    # bf16 autocast has 3 fewer mantissa bits: on the small ViT its logits land ~5.8x the TF32 emulation's rel-L2,
    # outside the bound of 3x it.
    _, outcome = only(workload, planted("planted_bf16_as_tf32", lambda w: Bf16Fix().apply(w), "tf32"))
    assert outcome.status == "rolled_back", outcome.numerics
    assert outcome.numerics["value"] > 5 * outcome.numerics["reference_error"]
    assert outcome.numerics["value"] > 1.3 * outcome.numerics["bound"]
    _, outcome = only(workload, planted("planted_tf32_scaled", under(numerics.tf32_rounding, 1.01), "tf32"))
    assert outcome.status == "rolled_back" and "output" in outcome.reason, outcome.reason
    assert_same_state(before, workload)


def test_a_truncating_tf32_passes_on_a_resnet_training_step_and_a_scaled_loss_fails(monkeypatch, planted):
    workload = load("hf_resnet_train", monkeypatch)
    workload.step_fn()  # momentum buffers exist
    before = state_values(workload)
    linears_only = functools.partial(truncated_tf32, convolutions=False)
    _, outcome = only(workload, planted("planted_tf32_train", under(linears_only), "tf32"))
    assert outcome.status == "applied", outcome.reason
    assert "compared the state the step writes too" in outcome.numerics["detail"]
    _, outcome = only(workload, planted("planted_tf32_train_scaled", under(linears_only, 1.01), "tf32"))
    assert outcome.status == "rolled_back", outcome.numerics

    def update_scaled(workload):
        """TF32, and the classifier's SGD update 1.1x too large: state writes have a floor of 1e-2, not more."""
        applied = under(linears_only)(workload)
        step = applied.workload.step

        @functools.wraps(step)
        def patched(state, inputs):
            weight = state.model.classifier[-1].weight
            start = weight.detach().clone()
            out = step(state, inputs)
            with torch.no_grad():
                weight.copy_(start + 1.1 * (weight - start))
            return out

        return Applied(applied.workload.with_step(applied.workload.model, patched), ["planted"])

    _, outcome = only(workload, planted("planted_tf32_update_scaled", update_scaled, "tf32"))
    assert outcome.status == "rolled_back" and "classifier" in outcome.reason, outcome.reason
    assert "1e-02 for a state write" in outcome.reason
    assert_same_state(before, workload)


# ---------------------------------------------------------------------------------------------------------------
# the fix


def linear_workload(model):
    x = torch.randn(4, 8)
    return Workload("m.py", model, (x,), lambda: model(x), None, "m")


def test_tf32_refuses_off_cuda():
    final, outcome = only(linear_workload(nn.Linear(8, 8)), "tf32")
    assert outcome.status == "refused"
    assert outcome.reason == "TF32 is a CUDA tensor-core format (the model is on cpu)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
def test_apply_fix_tf32_on_a_cpu_is_refused_and_strict_exits_2_writing_nothing(tmp_path, cli):
    tiny = Path(__file__).resolve().parents[1] / "examples" / "tiny_mlp.py"
    fast = ["--warmup", "1", "--steps", "4", "--rounds", "3", "--profile-steps", "1"]
    result = cli("apply", tiny, "--fix", "tf32", "--strict", "--out", tmp_path / "out", *fast)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "tf32" in lines[0] and "TF32 is a CUDA tensor-core format" in lines[0]
    assert not (tmp_path / "out").exists()


def test_tf32_refusals_on_a_gpu(monkeypatch):
    """The checks after the device's: seen as if on an H100 (the device checks read these two functions)."""
    import gpuadvisor.fixes.safety as safety

    monkeypatch.setattr(safety, "model_device", lambda model, inputs: "cuda:0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    fix = Tf32Fix()
    assert fix.check(linear_workload(nn.Sequential(nn.Linear(8, 8), nn.ReLU()))) is None
    convolutions = fix.check(linear_workload(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())))
    assert convolutions.reason.startswith("no Linear or attention modules with float32 weights, and cuDNN already")
    half = fix.check(linear_workload(nn.Linear(8, 8).to(torch.bfloat16)))
    assert half.reason == "no Linear or attention modules with float32 weights: TF32 changes no matmul work"
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    already = fix.check(linear_workload(nn.Linear(8, 8)))
    assert already.reason.startswith("float32 matmuls may already run in TF32")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    old = fix.check(linear_workload(nn.Linear(8, 8)))
    assert old.reason.startswith("this GPU has no TF32 tensor cores (compute capability 7.5")


def test_the_patched_step_allows_tf32_only_while_it_runs_also_when_it_raises():
    seen = []

    def step(model, inputs):
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        if inputs[0] is None:
            raise RuntimeError("boom")
        return model(*inputs)

    model = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    workload = Workload("m.py", model, (x,), lambda: step(model, (x,)), None, "m", step)
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    applied = Tf32Fix.wrapped(workload, [("model", model)])
    assert applied.workload.model is model
    applied.workload.step(model, (x,))
    assert seen[-1] == (True, True)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    with pytest.raises(RuntimeError):
        applied.workload.step(model, (None,))
    assert seen[-1] == (True, True)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    assert "1 Linear multiply in TF32" in applied.changes[0]
    with tf32_allowed():
        assert torch.backends.cuda.matmul.allow_tf32


def test_tf32_is_a_lever_of_the_search_and_runs_after_bf16():
    order = fix_order()
    assert order.index("bf16") < order.index("tf32") < order.index("compile")
    stacks = candidate_stacks(["bf16", "tf32", "fusion"], [], order)
    assert stacks[0] == ["bf16", "tf32", "fusion"]
    assert stacks[1] == ["bf16", "tf32", "compile"]  # the levers with compile: tf32 stays when bf16 is rolled back
    assert ["compile"] in stacks
    assert stacks[-1] == ["tf32", "fusion"]  # the GEMMs in TF32 without autocast's casts, eagerly


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tf32_on_a_gpu_linear_stack_is_applied_and_guarded():
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 needs compute capability 8.0")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    x = torch.randn(512, 1024, device="cuda")
    workload = Workload("m.py", model, (x,), lambda: model(x), None, "m")
    _, outcome = only(workload, "tf32")
    assert outcome.status == "applied", (outcome.reason, outcome.numerics)
    assert outcome.numerics["policy"] == "tf32" and outcome.numerics["passed"]
    assert not torch.backends.cuda.matmul.allow_tf32

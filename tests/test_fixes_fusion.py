"""The ``fusion`` and ``fp8`` fixes on the CPU: pattern detection, the per-module check, refusals.

Without CUDA the Triton kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set before triton is
imported), so the swaps are exercised end to end on examples/llama_decode.py's small configuration; with
CUDA the same tests run the compiled kernels on the GPU. The GPU timing of the swaps is
benchmarks/decode_fixes.py.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path

import pytest
from kernel_mode import kernel_mode  # noqa: E402

torch, CUDA, _ = kernel_mode()
DEVICE = "cuda" if CUDA else "cpu"

from gpuadvisor.fixes.fp8 import Fp8Fix, plan_layers  # noqa: E402
from gpuadvisor.fixes.fusion import FusionFix, find_candidates  # noqa: E402
from gpuadvisor.fixes.modules import (  # noqa: E402
    DecodeLinear,
    FusedDecodeAttention,
    FusedPreNormBlock,
    FusedRMSNorm,
    FusedSwiGLU,
)
from gpuadvisor.workload import load_workload  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama_decode.py"


@functools.cache
def _example_module():
    name = "llama_decode_for_fusion_tests"
    spec = importlib.util.spec_from_file_location(name, EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def _relative_l2(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _count(model, cls) -> int:
    return sum(isinstance(module, cls) for module in model.modules())


def _fp32_model(example):
    # fp32 on the CPU: Triton's interpreter truncates fp32 -> bf16 where the GPU rounds, which doubles a bf16
    # kernel's error here (layer 1's attention: 1.04e-2 against the 1e-2 module bound); fp32 keeps the checks
    # about the patterns, not about the interpreter.
    return example.build_model(example.CPU_CONFIG, DEVICE, torch.float32)


@pytest.fixture(scope="module")
def decode_workload():
    workload = load_workload(str(EXAMPLE))
    example = _example_module()
    return workload.with_model(_fp32_model(example), example.decode_inputs(example.CPU_CONFIG, DEVICE))


def test_fusion_swaps_every_pattern_of_the_decode_example(decode_workload):
    fix = FusionFix()
    assert fix.check(decode_workload) is None
    applied = fix.apply(decode_workload)
    patched = applied.workload.model
    # CPU configuration: 2 layers -> 2 x 2 block norms + the final norm; 2 MLPs, 2 attentions, 2 blocks;
    # linears: wqkv, wo, w1, w3, w2 per layer + the output projection = 11.
    assert _count(patched, FusedRMSNorm) == 5
    assert _count(patched, FusedSwiGLU) == 2
    assert _count(patched, FusedDecodeAttention) == 2
    assert _count(patched, FusedPreNormBlock) == 2
    assert _count(patched, DecodeLinear) == 11
    assert applied.skipped == []
    assert any("5 RMSNorm modules" in change for change in applied.changes)
    assert any("11 linear layers" in change for change in applied.changes)

    expected = decode_workload.step_fn()
    got = applied.workload.step_fn()
    assert got.shape == expected.shape
    # fp32 model: the per-module bound is 1e-4; the whole model stays within it too.
    assert _relative_l2(got, expected) < 1e-4

    # The original model is untouched: still its own RMSNorm and nn.Linear classes.
    original = decode_workload.model
    assert type(original.layers[0].attention_norm).__name__ == "RMSNorm"
    assert type(original.layers[0].attention.wqkv) is torch.nn.Linear
    assert _count(original, FusedRMSNorm) == 0


def test_fusion_leaves_lookalikes_alone_and_says_why(decode_workload):
    example = _example_module()

    class GemmaStyleRMSNorm(example.RMSNorm):
        """Scales by (1 + weight): an RMSNorm by name, not by what it computes."""

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return h.to(x.dtype) * (1 + self.weight)

    class GeluFeedForward(example.FeedForward):
        def forward(self, x):
            return self.w2(torch.nn.functional.gelu(self.w1(x)) * self.w3(x))

    model = _fp32_model(example)
    model.layers[0].attention_norm.__class__ = GemmaStyleRMSNorm
    model.layers[1].feed_forward.__class__ = GeluFeedForward
    workload = decode_workload.with_model(model, example.decode_inputs(example.CPU_CONFIG, DEVICE))

    applied = FusionFix().apply(workload)
    reasons = {item["target"]: item["reason"] for item in applied.skipped}
    assert "output differs from the original" in reasons["layers.0.attention_norm"]
    assert "silu" in reasons["layers.1.feed_forward"]
    patched = applied.workload.model
    assert isinstance(patched.layers[0].attention_norm, GemmaStyleRMSNorm)
    assert _count(patched, FusedRMSNorm) == 4
    assert _count(patched, FusedSwiGLU) == 1
    # The block whose first norm stayed eager is still fused at its second norm; its output is checked.
    assert _relative_l2(applied.workload.step_fn(), workload.step_fn()) < 1e-4


def test_fusion_skips_a_mask_that_is_not_causal_by_position(decode_workload):
    example = _example_module()
    model = _fp32_model(example)
    model.causal_mask.fill_(True)  # every slot visible: not what the fused kernel computes
    workload = decode_workload.with_model(model, example.decode_inputs(example.CPU_CONFIG, DEVICE))
    # The example's position is the last slot, where an all-True row equals the causal row; move it.
    workload = workload.with_model(model, (workload.inputs[0], torch.tensor([3], device=DEVICE)))
    applied = FusionFix().apply(workload)
    reasons = [item["reason"] for item in applied.skipped]
    assert sum("not causal by position" in reason for reason in reasons) == 2
    assert _count(applied.workload.model, FusedDecodeAttention) == 0


def test_fusion_refuses_training_mode_and_non_modules(decode_workload):
    example = _example_module()
    model = _fp32_model(example).train()
    refusal = FusionFix().check(decode_workload.with_model(model))
    assert refusal is not None and "training mode" in refusal.reason and "eval()" in refusal.suggestion
    refusal = FusionFix().check(decode_workload.with_model(lambda *a: a[0]))
    assert refusal is not None and "not a torch.nn.Module" in refusal.reason


def test_fusion_candidates_of_a_transformers_style_layer():
    class LlamaRMSNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(32))
            self.variance_epsilon = 1e-6

    class LlamaMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = torch.nn.Linear(32, 64, bias=False)
            self.up_proj = torch.nn.Linear(32, 64, bias=False)
            self.down_proj = torch.nn.Linear(64, 32, bias=False)

    class LlamaDecoderLayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = LlamaRMSNorm(), LlamaRMSNorm()
            self.self_attn = torch.nn.Linear(32, 32)
            self.mlp = LlamaMLP()

    plan = find_candidates(LlamaDecoderLayer())
    assert [name for name, _ in plan["norms"]] == ["input_layernorm", "post_attention_layernorm"]
    assert plan["norms"][0][1] == pytest.approx(1e-6)
    assert plan["mlps"] == [("mlp", ("gate_proj", "up_proj", "down_proj"))]
    assert plan["linears"] == ["self_attn"]  # the MLP's projections belong to the fused MLP
    assert any("transformers decoder layer" in item["reason"] for item in plan["skipped"])


def test_fp8_refuses_without_cuda_and_plans_layers_by_shape(decode_workload):
    if not torch.cuda.is_available():
        refusal = Fp8Fix().check(decode_workload)
        assert refusal is not None and "compute capability >= 8.9" in refusal.reason

    class Layers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.big = torch.nn.Linear(2048, 4096, bias=False).to(torch.bfloat16)
            self.odd = torch.nn.Linear(2048, 4100, bias=False).to(torch.bfloat16)
            self.small = torch.nn.Linear(64, 64, bias=False).to(torch.bfloat16)
            self.fp32 = torch.nn.Linear(2048, 4096, bias=False)

    eligible, skipped = plan_layers(Layers())
    assert eligible == ["big"]
    reasons = {item["target"]: item["reason"] for item in skipped}
    assert "multiples of 16" in reasons["odd"]
    assert "too small to pay" in reasons["small"]
    assert "float32" in reasons["fp32"]


def test_fp8_keeps_layers_the_step_calls_with_more_than_16_rows(decode_workload):
    class TwoPaths(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decode = torch.nn.Linear(2048, 2048, bias=False).to(torch.bfloat16)
            self.prefill = torch.nn.Linear(2048, 2048, bias=False).to(torch.bfloat16)
            self.unused = torch.nn.Linear(2048, 2048, bias=False).to(torch.bfloat16)

        def forward(self, token, prompt):
            self.calls = getattr(self, "calls", 0) + 1
            return self.decode(token).sum() + self.prefill(prompt).sum()

    model = TwoPaths()
    inputs = (torch.randn(1, 2048, dtype=torch.bfloat16), torch.randn(32, 2048, dtype=torch.bfloat16))
    planned, eligible, skipped = Fp8Fix()._plan(decode_workload.with_model(model, inputs))
    assert eligible == ["decode"]
    assert planned is not model and planned.calls == 1 and not hasattr(model, "calls")  # ran on a copy only
    reasons = {item["target"]: item["reason"] for item in skipped}
    assert reasons["prefill"].startswith("called with 32 rows")
    assert reasons["unused"] == "not called by the step"


def test_fp8_sees_the_rows_of_a_fused_mlps_gate_and_up(decode_workload):
    """A fused SwiGLU streams its gate and up weights in one kernel without calling those layers: their rows
    are the MLP's input rows, so fp8 can convert them (after fusion they were "not called by the step")."""
    from gpuadvisor.fixes.fp8 import rows_per_layer

    fused = FusionFix().apply(decode_workload).workload
    names = [f"layers.{i}.feed_forward.{attr}" for i in (0, 1) for attr in ("w1", "w3", "w2")]
    rows = rows_per_layer(fused, names)
    assert rows == {name: 1 for name in names}


def test_fusion_refuses_a_model_it_would_not_change_and_says_why(monkeypatch):
    """GPT-2 (transformers, eager attention): Conv1D projections, LayerNorm, and one nn.Linear (the LM head)
    called with every token's row. Swapping that head for the decode kernel would only call cuBLAS again, so
    fusion refuses instead of reporting an applied no-op."""
    pytest.importorskip("transformers")
    from gpuadvisor.fixes.registry import apply_fixes

    monkeypatch.setenv("GPUADVISOR_REAL_SIZE", "small")
    workload = load_workload(str(EXAMPLE.parent / "real" / "hf_gpt2_eager_attention.py"))
    _, outcomes = apply_fixes(workload, ["fusion"])
    outcome = outcomes[0]
    assert outcome.status == "refused", (outcome.status, outcome.reason)
    assert outcome.reason.startswith("nothing to fuse at these shapes")
    assert "more than 16 rows" in outcome.reason and "torch.compile" in outcome.suggestion
    assert any("lm_head" in line for line in outcome.details)

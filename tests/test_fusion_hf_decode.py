"""The ``fusion`` fix on transformers' own decoders (examples/real/hf_llama_decode.py, hf_qwen2_decode.py) and
the kernels it swaps in for them: ``hf_rope_kv_update`` and grouped-query ``decode_attention``.

Without CUDA the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set by ``kernel_mode`` before
triton is imported) on the suite files' small float32 configurations: Llama (4 heads, 4 KV heads) and Qwen2
(4 heads, 2 KV heads: grouped-query attention, biases on q, k and v), 2 layers, a 32-slot StaticCache.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
from kernel_mode import kernel_mode  # noqa: E402

torch, CUDA, INTERPRET = kernel_mode()
pytest.importorskip("transformers")

from gpuadvisor.fixes import fusion  # noqa: E402
from gpuadvisor.fixes.fusion import FusionFix, _hf_mask_not_causal  # noqa: E402
from gpuadvisor.fixes.modules import (  # noqa: E402
    DecodeLinear,
    FusedHFAttention,
    FusedHFDecoderLayer,
    FusedRMSNorm,
    FusedSwiGLU,
)
from gpuadvisor.kernels import hf_rope_cache  # noqa: E402
from gpuadvisor.kernels.decode_attention import decode_attention, decode_attention_reference  # noqa: E402
from gpuadvisor.kernels.hf_rope_cache import hf_rope_kv_update, hf_rope_kv_update_reference  # noqa: E402

SUITE = Path(__file__).resolve().parent.parent / "examples" / "real"
sys.path.insert(0, str(SUITE))
from _real import cache_argument  # noqa: E402
from suite_workloads import load  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
FILES = ["hf_llama_decode", "hf_qwen2_decode"]
BOUND = 1e-4  # the fp32 module bound (fusion.MODULE_BOUNDS); the whole model stays within it too

cpu_only = pytest.mark.skipif(not INTERPRET, reason="CPU tensors need Triton's interpreter (TRITON_INTERPRET=1)")


def _relative_l2(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _count(model, cls) -> int:
    return sum(isinstance(module, cls) for module in model.modules())


@pytest.fixture(scope="module")
def workloads():
    with pytest.MonkeyPatch.context() as monkeypatch:
        loaded = {name: load(name, monkeypatch) for name in FILES}
    return loaded


@pytest.fixture(scope="module")
def fused(workloads):
    return {name: FusionFix().apply(workload) for name, workload in workloads.items()}


@pytest.fixture
def rope_calls(monkeypatch):
    """How many times the fused attention's rotary + cache kernel ran."""
    calls = []
    original = hf_rope_cache.hf_rope_kv_update

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(hf_rope_cache, "hf_rope_kv_update", counting)
    return calls


def _cache_state(cache):
    return [
        {attr: getattr(layer, attr).detach().clone() for attr in ("keys", "values", "cumulative_length")}
        for layer in cache.layers
    ]


def _assert_same_cache(got, expected, written: slice):
    """Counters equal; the written slots within the fp32 bound; every other slot bit for bit."""
    for got_layer, expected_layer in zip(got, expected):
        assert torch.equal(got_layer["cumulative_length"], expected_layer["cumulative_length"])
        for attr in ("keys", "values"):
            g, e = got_layer[attr], expected_layer[attr]
            keep = torch.ones(g.shape[2], dtype=torch.bool, device=g.device)
            keep[written] = False
            assert torch.equal(g[:, :, keep], e[:, :, keep]), attr
            assert _relative_l2(g[:, :, written], e[:, :, written]) < BOUND, attr


def _forward(model, ids, cache, positions=None):
    kwargs = {cache_argument(type(model)): cache}
    if positions is not None:
        kwargs["position_ids"] = positions
    with torch.no_grad():
        return model(input_ids=ids, use_cache=True, **kwargs).logits


# --- the fix on the two suite decoders -------------------------------------------------------------------------


@cpu_only
@pytest.mark.parametrize("name", FILES)
def test_fusion_swaps_the_attention_and_decoder_layers_of_transformers_models(name, workloads, fused, rope_calls):
    workload, applied = workloads[name], fused[name]
    patched = applied.workload.model
    # 2 layers: 2 attentions, 2 decoder layers, 2 MLPs, 2 x 2 norms + the final one; linears: q, k, v, o (the
    # fused path's fallback), gate, up, down per layer + lm_head.
    assert _count(patched, FusedHFAttention) == 2
    assert _count(patched, FusedHFDecoderLayer) == 2
    assert _count(patched, FusedSwiGLU) == 2
    assert _count(patched, FusedRMSNorm) == 5
    assert _count(patched, DecodeLinear) == 15
    assert applied.skipped == []
    assert any("2 transformers attention modules" in change for change in applied.changes)
    assert any("2 transformers decoder layers" in change for change in applied.changes)
    # The state dict keeps its keys (the fused q/k/v weight is not a submodule).
    assert patched.state_dict().keys() == workload.model.state_dict().keys()
    # The original model is untouched.
    assert _count(workload.model, (FusedHFAttention, FusedHFDecoderLayer, DecodeLinear)) == 0

    attention = patched.model.layers[0].self_attn
    n_heads, n_kv_heads = attention._fused_heads
    if name == "hf_qwen2_decode":
        assert (n_heads, n_kv_heads) == (4, 2)  # grouped-query attention
        assert "grouped-query" in " ".join(applied.changes)
        assert attention._fused_qkv.bias is not None  # q, k and v biases, in the one GEMV
        bias = torch.cat([attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias])
        assert torch.equal(attention._fused_qkv.bias, bias)
    else:
        assert (n_heads, n_kv_heads) == (4, 4) and attention._fused_qkv.bias is None

    # One step on each model from the same cache: the logits and the cache it leaves.
    _, position, cache = workload.inputs
    start = copy.deepcopy(cache)
    expected_logits = workload.step(workload.model, (workload.inputs[0], position, cache))
    expected_state = _cache_state(cache)
    rope_calls.clear()
    fused_cache = copy.deepcopy(start)
    got_logits = applied.workload.step(patched, (workload.inputs[0], position, fused_cache))
    assert len(rope_calls) == 2  # the fused path ran in both layers
    assert _relative_l2(got_logits, expected_logits) < BOUND
    slot = int(position[0])
    _assert_same_cache(_cache_state(fused_cache), expected_state, slice(slot, slot + 1))
    assert all(int(layer["cumulative_length"]) == slot + 1 for layer in _cache_state(fused_cache))


@cpu_only
@pytest.mark.parametrize("name", FILES)
def test_several_steps_advance_the_cache_counter_as_the_library_does(name, workloads, fused, rope_calls):
    """Three single-token steps and one 3-token step, no counter reset: the counters advance on the device."""
    workload, patched = workloads[name], fused[name].workload.model
    _, position, cache = workload.inputs
    start = int(position[0])
    ours, theirs = copy.deepcopy(cache), copy.deepcopy(cache)
    for c in (ours, theirs):
        for layer in c.layers:
            layer.cumulative_length.fill_(start)
    torch.manual_seed(1)
    tokens = [torch.randint(0, 256, (1, 1), device=DEVICE) for _ in range(3)] + [
        torch.randint(0, 256, (1, 3), device=DEVICE)
    ]
    rope_calls.clear()
    for ids in tokens:
        expected = _forward(workload.model, ids, theirs)
        got = _forward(patched, ids, ours)
        assert _relative_l2(got, expected) < BOUND
    assert len(rope_calls) == 2 * len(tokens)
    _assert_same_cache(_cache_state(ours), _cache_state(theirs), slice(start, start + 6))
    assert all(int(layer.cumulative_length) == start + 6 for layer in ours.layers)


@cpu_only
def test_more_than_16_rows_and_other_caches_run_the_original_forward(workloads, fused, rope_calls):
    from transformers import DynamicCache, StaticCache

    workload, patched = workloads["hf_qwen2_decode"], fused["hf_qwen2_decode"].workload.model
    config = workload.model.config
    prompt = torch.randint(0, config.vocab_size, (1, 20), device=DEVICE)
    rope_calls.clear()
    # A 20-token prompt into a fresh StaticCache: more than 16 rows.
    ours, theirs = StaticCache(config=config, max_cache_len=32), StaticCache(config=config, max_cache_len=32)
    assert _relative_l2(_forward(patched, prompt, ours), _forward(workload.model, prompt, theirs)) < BOUND
    assert rope_calls == []
    _assert_same_cache(_cache_state(ours), _cache_state(theirs), slice(0, 20))
    # A DynamicCache, prompt and one decode token: not a static layer.
    ours, theirs = DynamicCache(config=config), DynamicCache(config=config)
    for ids in (prompt[:, :5], prompt[:, 5:6]):
        assert _relative_l2(_forward(patched, ids, ours), _forward(workload.model, ids, theirs)) < BOUND
    assert rope_calls == []


@cpu_only
def test_verification_leaves_the_cache_as_the_recording_step_did(workloads):
    workload = workloads["hf_llama_decode"]
    workload.step_fn()
    after_one_step = _cache_state(workload.inputs[2])
    FusionFix().apply(workload)  # records one step, then replays each module from its "before" state
    for got, expected in zip(_cache_state(workload.inputs[2]), after_one_step):
        for attr, value in expected.items():
            assert torch.equal(got[attr], value), attr


@cpu_only
def test_an_attention_mask_that_is_not_causal_by_position_is_left_to_the_original(workloads):
    workload = workloads["hf_llama_decode"]

    def padded_step(model, inputs):
        ids, position, cache = inputs
        for layer in cache.layers:
            layer.cumulative_length.copy_(position[0])
        mask = torch.ones(1, int(position[0]) + 1, dtype=torch.long, device=DEVICE)
        mask[0, 3] = 0  # a padding slot: not visible, though it is before the position
        with torch.no_grad():
            return model(
                input_ids=ids,
                position_ids=position.unsqueeze(0),
                attention_mask=mask,
                use_cache=True,
                **{cache_argument(type(model)): cache},
            ).logits

    padded = workload.with_step(workload.model, padded_step)
    applied = FusionFix().apply(padded)
    reasons = [item["reason"] for item in applied.skipped]
    assert sum("not causal by position" in reason for reason in reasons) == 2, reasons
    patched = applied.workload.model
    assert _count(patched, FusedHFAttention) == 0
    assert _count(patched, FusedHFDecoderLayer) == 2  # the residual + norm fusion does not depend on the mask
    assert _relative_l2(applied.workload.step_fn(), padded.step_fn()) < BOUND


@cpu_only
def test_a_prefill_without_a_cache_fuses_the_decoder_layers_but_not_the_attention(monkeypatch):
    workload = load("hf_llama_prefill", monkeypatch)
    applied = FusionFix().apply(workload)
    patched = applied.workload.model
    assert _count(patched, FusedHFDecoderLayer) == 2  # no cache written: the recorded call replays as it is
    assert _count(patched, FusedHFAttention) == 0
    reasons = [item["reason"] for item in applied.skipped]
    assert sum("static cache layer" in reason for reason in reasons) == 2, reasons
    assert _relative_l2(applied.workload.step_fn(), workload.step_fn()) < BOUND


def test_the_mask_check_reads_boolean_and_additive_masks():
    x = torch.zeros(1, 2, 8)
    state = {"cumulative_length": torch.tensor(3)}
    causal = torch.arange(6)[None, :] <= torch.tensor([3, 4])[:, None]  # [S=2, T=6]

    def forward(hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        pass

    def check(mask):
        return _hf_mask_not_causal(((), {"hidden_states": x, "attention_mask": mask}, None), state, forward)

    minimum = torch.finfo(torch.float32).min
    assert check(None) is None
    assert check(causal[None, None]) is None
    assert check(torch.where(causal, 0.0, float("-inf"))[None, None]) is None
    assert check(torch.where(causal, 0.0, minimum)[None, None]) is None
    assert "not causal" in check(torch.ones(1, 1, 2, 6, dtype=torch.bool))
    shifted = torch.arange(6)[None, :] <= torch.tensor([4, 5])[:, None]
    assert "not causal" in check(shifted[None, None])
    assert "values other than 0 and -inf" in check(torch.where(causal, 0.5, minimum)[None, None])
    assert "not a tensor" in check([1, 2])


@cpu_only
def test_eager_attention_returning_weights_is_not_swapped(workloads):
    workload = workloads["hf_llama_decode"]
    model = copy.deepcopy(workload.model)
    model.config._attn_implementation = "eager"
    applied = FusionFix().apply(workload.with_model(model))
    reasons = [item["reason"] for item in applied.skipped]
    assert sum("attention weights" in reason for reason in reasons) == 2, reasons
    assert _count(applied.workload.model, FusedHFAttention) == 0


@cpu_only
def test_a_cache_write_the_replacement_misses_is_caught(workloads, monkeypatch):
    """The check replays from the recorded "before" state with the written slots set to NaN: a kernel that
    skips the v write leaves NaN there, and the module stays as it was."""
    original = hf_rope_cache.hf_rope_kv_update

    def no_v_write(qkv, cos, sin, start, k_cache, v_cache, n_heads, n_kv_heads):
        return original(qkv, cos, sin, start, k_cache, v_cache.clone(), n_heads, n_kv_heads)

    monkeypatch.setattr(hf_rope_cache, "hf_rope_kv_update", no_v_write)
    applied = FusionFix().apply(workloads["hf_llama_decode"])
    reasons = {item["target"]: item["reason"] for item in applied.skipped}
    for layer in (0, 1):
        reason = reasons[f"model.layers.{layer}.self_attn"]
        assert "output differs" in reason or "values written" in reason, reason
    assert _count(applied.workload.model, FusedHFAttention) == 0


def test_candidates_of_transformers_attention_and_lookalikes():
    pytest.importorskip("transformers")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=64,
    )
    model = Qwen2ForCausalLM(config).eval()
    plan = fusion.find_candidates(model)
    assert plan["hf_attentions"] == [("model.layers.0.self_attn", (4, 2))]
    assert [name for name, _ in plan["hf_blocks"]] == ["model.layers.0"]
    # A q_norm (Qwen3-style) changes what the attention computes: named, not swapped.
    model.model.layers[0].self_attn.q_norm = torch.nn.Identity()
    plan = fusion.find_candidates(model)
    assert plan["hf_attentions"] == []
    assert any("q_norm" in item["reason"] for item in plan["skipped"])


# --- the kernels -----------------------------------------------------------------------------------------------

DEVICES = [pytest.param("cpu", marks=cpu_only, id="cpu")]
if CUDA and not INTERPRET:
    DEVICES = [pytest.param("cuda", id="cuda")]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# The rotation against float64 math: one rounding to the storage dtype, 2**-24 / 2**-11 / 2**-8 relative
# (bf16: 2**-7 in the interpreter, which truncates fp32 -> bf16).
ROTATION_RTOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}
ATTENTION_TOLERANCES = {
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-4),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-4),
}

# (B, H, KVH, S, head_dim, T, start, cos batch): groups 1, 2 and 4, odd head counts, a head_dim that is not a
# power of two (24: masked lanes), first slot 0, the middle and the last (start + S - 1 = T - 1).
ROPE_CASES = [
    (1, 4, 4, 1, 16, 7, 0, 1),
    (2, 6, 3, 2, 24, 9, 4, 2),
    (1, 8, 2, 3, 32, 33, 30, 1),
    (2, 3, 3, 1, 64, 5, 4, 1),
    (1, 4, 1, 1, 128, 16, 15, 1),
]


def _random(shape, dtype, device, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ROPE_CASES, ids=lambda c: "B{}-H{}-KVH{}-S{}-hd{}-T{}-start{}-cosB{}".format(*c))
def test_hf_rope_kv_update_matches_the_library_and_float64(case, dtype, device):
    batch, n_heads, n_kv_heads, seq, head_dim, n_slots, start, cos_batch = case
    qkv = _random((batch, seq, (n_heads + 2 * n_kv_heads) * head_dim), dtype, device, 0)
    # Random tables (not cos/sin of angles): the halves' entries differ, so a swapped half shows.
    cos = _random((cos_batch, seq, head_dim), dtype, device, 1)
    sin = _random((cos_batch, seq, head_dim), dtype, device, 2)
    counter = torch.tensor(start, device=device)
    k_cache = _random((batch, n_kv_heads, n_slots, head_dim), dtype, device, 3)
    v_cache = _random((batch, n_kv_heads, n_slots, head_dim), dtype, device, 4)
    k_expected, v_expected, k_before = k_cache.clone(), v_cache.clone(), k_cache.clone()

    q, positions = hf_rope_kv_update(qkv, cos, sin, counter, k_cache, v_cache, n_heads, n_kv_heads)
    q_expected, positions_expected = hf_rope_kv_update_reference(
        qkv, cos, sin, counter, k_expected, v_expected, n_heads, n_kv_heads
    )
    assert int(counter) == start  # read, not advanced
    assert q.shape == (batch, n_heads, seq, head_dim) and q.dtype == dtype and q.is_contiguous()
    assert torch.equal(positions, positions_expected) and positions.dtype == torch.int64
    assert torch.equal(v_cache, v_expected)  # v copied, every other slot untouched
    written = slice(start, start + seq)
    untouched = torch.ones(n_slots, dtype=torch.bool, device=device)
    untouched[written] = False
    assert torch.equal(k_cache[:, :, untouched], k_before[:, :, untouched])
    if dtype == torch.float32:  # the library's products and sums, no FMA: bit for bit
        assert torch.equal(q, q_expected)
        assert torch.equal(k_cache, k_expected)

    # Against float64 math (the library rounds each product in bf16/fp16; the kernel rounds once).
    def rotate64(x):  # [B, S, heads, hd]
        x = x.double().transpose(1, 2)
        c, s = cos.double()[:, None], sin.double()[:, None]
        half = head_dim // 2
        return x * c + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s

    q_in, k_in, _ = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], dim=-1)
    q64 = rotate64(q_in.reshape(batch, seq, n_heads, head_dim))
    k64 = rotate64(k_in.reshape(batch, seq, n_kv_heads, head_dim))
    rtol = ROTATION_RTOL[dtype]
    scale = float(q64.abs().max())  # products of two N(0, 1) values: absolute error relative to the range
    torch.testing.assert_close(q.double().cpu(), q64.cpu(), rtol=rtol, atol=rtol * scale)
    torch.testing.assert_close(k_cache[:, :, written].double().cpu(), k64.cpu(), rtol=rtol, atol=rtol * scale)


@cpu_only
def test_hf_rope_kv_update_does_not_write_outside_the_cache():
    qkv = _random((1, 2, 3 * 2 * 8), torch.float32, "cpu", 0)
    cos, sin = _random((1, 2, 8), torch.float32, "cpu", 1), _random((1, 2, 8), torch.float32, "cpu", 2)
    k_cache, v_cache = torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8)
    _, positions = hf_rope_kv_update(qkv, cos, sin, torch.tensor(3), k_cache, v_cache, 2, 2)
    assert positions.tolist() == [3, 4]
    assert k_cache[:, :, :3].abs().sum() == 0 and v_cache[:, :, :3].abs().sum() == 0
    assert k_cache[:, :, 3].abs().sum() > 0  # slot 3 written, slot 4 (past the end) dropped


def _bad_rope_inputs():
    qkv = torch.randn(1, 2, (4 + 2 * 2) * 8)
    cos = torch.randn(1, 2, 8)
    start = torch.tensor(0)
    cache = torch.randn(1, 2, 16, 8)
    return [
        (lambda: hf_rope_kv_update(qkv.double(), cos, cos, start, cache, cache, 4, 2), "qkv has dtype"),
        (lambda: hf_rope_kv_update(qkv, cos, cos, start, cache, cache, 4, 3), "multiple of n_kv_heads"),
        (lambda: hf_rope_kv_update(qkv, cos, cos, start, cache, cache, 2, 2), r"qkv must have shape"),
        (lambda: hf_rope_kv_update(qkv, cos[:, :1], cos, start, cache, cache, 4, 2), r"cos must have shape"),
        (lambda: hf_rope_kv_update(qkv, cos, cos.double(), start, cache, cache, 4, 2), "sin has dtype"),
        (lambda: hf_rope_kv_update(qkv, cos, cos, start.float(), cache, cache, 4, 2), "start must be one int"),
        (lambda: hf_rope_kv_update(qkv, cos, cos, 0, cache, cache, 4, 2), "start must be a torch.Tensor"),
        (lambda: hf_rope_kv_update(qkv, cos, cos, start, cache[:, :1], cache, 4, 2), r"k_cache must have shape"),
        (lambda: hf_rope_kv_update(qkv, cos, cos, start, cache, cache[:, :, :9], 4, 2), "v_cache has 9 slots"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_rope_inputs())))
def test_hf_rope_kv_update_bad_inputs_raise_one_line_value_error(case):
    call, message = _bad_rope_inputs()[case]
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


# (B, H, KVH, S, head_dim, T, positions): groups 1, 2 and 4; positions 0, the middle and T - 1.
GQA_CASES = [
    (1, 4, 4, 1, 16, 33, [0]),
    (2, 4, 2, 2, 24, 33, [16, 32]),
    (1, 8, 2, 3, 32, 45, [0, 22, 44]),
    (1, 4, 1, 1, 64, 64, [63]),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", GQA_CASES, ids=lambda c: "B{}-H{}-KVH{}-S{}-hd{}-T{}".format(*c[:6]))
def test_grouped_query_decode_attention_matches_float64(case, dtype, device):
    batch, n_heads, n_kv_heads, seq, head_dim, n_slots, positions = case
    q = _random((batch, n_heads, seq, head_dim), dtype, device, 3, scale=2.0)
    k_cache = _random((batch, n_kv_heads, n_slots, head_dim), dtype, device, 4)
    v_cache = _random((batch, n_kv_heads, n_slots, head_dim), dtype, device, 5)
    input_pos = torch.tensor(positions, device=device)
    expected = decode_attention_reference(q, k_cache, v_cache, input_pos, scale=0.2)
    # Against transformers' own recipe too: repeat_kv, then a masked softmax.
    k_rep, v_rep = (cache.repeat_interleave(n_heads // n_kv_heads, dim=1) for cache in (k_cache, v_cache))
    assert torch.equal(expected, decode_attention_reference(q, k_rep, v_rep, input_pos, scale=0.2))

    k_poisoned, v_poisoned = k_cache.clone(), v_cache.clone()
    k_poisoned[:, :, max(positions) + 1 :] = float("nan")
    v_poisoned[:, :, max(positions) + 1 :] = float("nan")
    out = decode_attention(q, k_poisoned, v_poisoned, input_pos, scale=0.2)
    assert out.shape == (batch, seq, n_heads * head_dim) and out.dtype == dtype
    torch.testing.assert_close(out.double().cpu(), expected.cpu(), **ATTENTION_TOLERANCES[dtype])


def test_a_cache_whose_heads_do_not_divide_the_query_heads_is_refused():
    q = torch.randn(1, 4, 1, 8)
    cache = torch.randn(1, 3, 16, 8)
    with pytest.raises(ValueError, match=r"k_cache must have shape \(1, 4, T, 8\)"):
        decode_attention(q, cache, cache, torch.tensor([3]))

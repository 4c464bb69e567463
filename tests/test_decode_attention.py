"""rope_kv_update and decode_attention (gpuadvisor/kernels) against eager and float64 references.

Without CUDA the kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 is set below before triton is
imported (see tests/test_kernels.py for why it must come first). Tests marked ``gpu`` run the same checks
compiled on CUDA, at the real decode shape (B=1, H=16, hd=128, T=1024, bf16), and inside a CUDA graph.

The last test swaps the two kernels into examples/llama_decode.py's Attention module (its CPU_CONFIG) and
compares the module's own forward with the fused one: the equivalence a module swap relies on.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import sys
from pathlib import Path

import pytest
from kernel_mode import kernel_mode  # noqa: E402

torch, CUDA, INTERPRET = kernel_mode()

from gpuadvisor.kernels import decode_attention as decode_attention_module  # noqa: E402
from gpuadvisor.kernels.decode_attention import (  # noqa: E402
    chunk_for,
    decode_attention,
    decode_attention_reference,
)
from gpuadvisor.kernels.rope_cache import rope_kv_update, rope_kv_update_reference  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama_decode.py"

# (B, H, S, head_dim, T, positions): odd batch/head/query counts, head_dim 16/24/64/128, T of 1, 7, 33 (not
# multiples of any chunk) and 1024; positions at slot 0, the middle and the last slot, distinct and unordered
# within one call. The interpreter runs one program at a time, so the T=1024 cases keep B * H * S small.
CASES = [
    (1, 1, 1, 16, 1, [0]),
    (2, 3, 2, 16, 7, [6, 0]),
    (1, 3, 1, 64, 7, [3]),
    (1, 2, 1, 24, 7, [5]),  # a head_dim that is not a power of two: masked lanes in both kernels
    (1, 4, 3, 64, 33, [16, 17, 18]),
    (2, 2, 3, 16, 33, [32, 0, 20]),
    (1, 2, 1, 128, 1024, [1023]),
    (1, 1, 2, 128, 1024, [511, 1000]),  # chunk 16: 64 partials per query, merged in 4 steps of kernel 2
]
CASE_IDS = [f"B{b}-H{h}-S{s}-hd{hd}-T{t}-pos{'_'.join(map(str, p))}" for b, h, s, hd, t, p in CASES]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Attention over T=1024 takes the interpreter ~2-4 s a call (one program at a time, 64 tiles per query), so
# those cases run in two dtypes (the low-precision one of the real model and fp32) instead of three.
ATTENTION_PARAMS = [
    pytest.param(case, dtype, id=f"{case_id}-{str(dtype).removeprefix('torch.')}")
    for case, case_id in zip(CASES, CASE_IDS)
    for dtype in DTYPES
    if case[4] < 1024 or dtype != torch.float16
]

# decode_attention against the float64 reference (q and the caches are the same rounded values in both):
# - float32: scores and sums in fp32 over <= 1024 slots and 128 dims, ~sqrt(n) * 6e-8 relative each; 2e-5.
# - float16: the output is rounded once to a 10-bit mantissa: 2**-11 ~ 4.9e-4 relative; 1e-3.
# - bfloat16: one rounding to an 8-bit mantissa is 2**-9 relative, and Triton's CPU interpreter truncates
#   fp32 -> bf16 instead of rounding to nearest (triton/runtime/interpreter.py, _convert_float): up to one
#   whole ulp, 2**-7 ~ 7.8e-3 (measured: 92% of an 8e-3 bound at hd=64, T=33); 1e-2.
# atol covers outputs near zero, where the fp32 error is absolute (relative to max|v| ~ 4), not relative.
ATTENTION_TOLERANCES = {
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-4),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-4),
}
# The rotation against float64 math: one rounding of the fp32 products is far below the final rounding to the
# storage dtype, which is 2**-24 / 2**-11 / 2**-8 relative (bf16: 2**-7 in the interpreter, which truncates).
ROTATION_RTOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}

cpu_only = pytest.mark.skipif(not INTERPRET, reason="CPU tensors need Triton's interpreter (TRITON_INTERPRET=1)")
needs_cuda = pytest.mark.skipif(not CUDA or INTERPRET, reason="needs CUDA (and TRITON_INTERPRET unset)")

DEVICES = [
    pytest.param("cpu", marks=cpu_only, id="cpu"),
    pytest.param("cuda", marks=[needs_cuda, pytest.mark.gpu], id="cuda"),
]


def _random(shape, dtype, device, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float32) * scale).to(device=device, dtype=dtype)


def _rope_rows(positions, head_dim, device):
    """cos/sin of examples/llama_decode.py's rotary angles (base 10000) at ``positions``: [S, hd/2, 2] float32."""
    half = head_dim // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, half, dtype=torch.float32) / half))
    angles = torch.outer(torch.tensor(positions, dtype=torch.float32), inv_freq)
    return torch.stack([angles.cos(), angles.sin()], dim=-1).to(device)


def _assert_same_as_eager(actual, expected):
    """Bit-exact, except bf16 in the interpreter, whose fp32 -> bf16 cast truncates: then within one ulp."""
    if INTERPRET and actual.dtype == torch.bfloat16:
        torch.testing.assert_close(actual.double(), expected.double(), rtol=2**-7, atol=0)
    else:
        assert torch.equal(actual, expected)


def _rotation_float64(x, rope):
    """x: [B, S, H, hd]; rope [S, hd/2, 2]: the rotation in float64 (returns [B, S, H, hd] float64)."""
    pairs = x.double().reshape(*x.shape[:-1], -1, 2)
    cos, sin = (rope.double()[None, :, None, :, i] for i in (0, 1))
    rotated = torch.stack([pairs[..., 0] * cos - pairs[..., 1] * sin, pairs[..., 1] * cos + pairs[..., 0] * sin], -1)
    return rotated.flatten(3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_rope_kv_update_matches_eager(case, dtype, device):
    batch, n_heads, seq, head_dim, n_slots, positions = case
    qkv = _random((batch, seq, 3 * n_heads * head_dim), dtype, device, 0)
    rope = _rope_rows(positions, head_dim, device)
    input_pos = torch.tensor(positions, device=device)
    k_cache = _random((batch, n_heads, n_slots, head_dim), dtype, device, 1)
    v_cache = _random((batch, n_heads, n_slots, head_dim), dtype, device, 2)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    k_before = k_cache.clone()

    q = rope_kv_update(qkv, rope, input_pos, k_cache, v_cache, n_heads)
    q_expected = rope_kv_update_reference(qkv, rope, input_pos, k_expected, v_expected, n_heads)

    assert q.shape == (batch, n_heads, seq, head_dim) and q.dtype == dtype and q.is_contiguous()
    _assert_same_as_eager(q, q_expected)
    _assert_same_as_eager(k_cache, k_expected)  # the new slots rotated, every other slot untouched
    assert torch.equal(v_cache, v_expected)  # v is copied, never rounded
    untouched = torch.ones(n_slots, dtype=torch.bool, device=device)
    untouched[positions] = False
    assert torch.equal(k_cache[:, :, untouched], k_before[:, :, untouched])

    # And the rotation itself against float64 math.
    q_in, k_in, _ = qkv.split(n_heads * head_dim, dim=-1)
    shape = (batch, seq, n_heads, head_dim)
    q64 = _rotation_float64(q_in.reshape(shape), rope).transpose(1, 2)
    k64 = _rotation_float64(k_in.reshape(shape), rope).transpose(1, 2)
    rtol = ROTATION_RTOL[dtype]
    torch.testing.assert_close(q.double().cpu(), q64.cpu(), rtol=rtol, atol=rtol)
    torch.testing.assert_close(k_cache[:, :, positions].double().cpu(), k64.cpu(), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("case", "dtype"), ATTENTION_PARAMS)
def test_decode_attention_matches_float64(case, dtype, device):
    batch, n_heads, seq, head_dim, n_slots, positions = case
    # q scaled by 2 makes the softmax peaked (scores ~ N(0, 4)), so the running max matters.
    q = _random((batch, seq, n_heads, head_dim), dtype, device, 3, scale=2.0).transpose(1, 2)  # a strided view
    k_cache = _random((batch, n_heads, n_slots, head_dim), dtype, device, 4)
    v_cache = _random((batch, n_heads, n_slots, head_dim), dtype, device, 5)
    input_pos = torch.tensor(positions, device=device)
    expected = decode_attention_reference(q, k_cache, v_cache, input_pos)

    # Slots after the last position hold NaN: a kernel that reads them into its sums returns NaN.
    k_poisoned, v_poisoned = k_cache.clone(), v_cache.clone()
    k_poisoned[:, :, max(positions) + 1 :] = float("nan")
    v_poisoned[:, :, max(positions) + 1 :] = float("nan")
    out = decode_attention(q, k_poisoned, v_poisoned, input_pos)

    assert out.shape == (batch, seq, n_heads * head_dim) and out.dtype == dtype and out.is_contiguous()
    torch.testing.assert_close(out.double().cpu(), expected.cpu(), **ATTENTION_TOLERANCES[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk", [16, 32, 512])
def test_any_chunk_size_gives_the_same_answer(chunk, device):
    """The split (forced chunk sizes, a last chunk cut short by T, a scale other than the default)."""
    q = _random((2, 2, 2, 64), torch.float32, device, 6)
    k_cache = _random((2, 2, 45, 64), torch.float32, device, 7)
    v_cache = _random((2, 2, 45, 64), torch.float32, device, 8)
    input_pos = torch.tensor([44, 17], device=device, dtype=torch.int32)
    out = decode_attention_module._launch(q, k_cache, v_cache, input_pos, scale=0.3, chunk=chunk)
    expected = decode_attention_reference(q, k_cache, v_cache, input_pos, scale=0.3)
    torch.testing.assert_close(out.double().cpu(), expected.cpu(), **ATTENTION_TOLERANCES[torch.float32])


def test_chunk_size_is_a_pure_function_of_the_shape():
    # The decode shape (B=1, H=16, S=1, T=1024): 32 chunks of 32, 512 programs for the 132 SMs.
    assert chunk_for(1, 16, 1, 1024) == 32
    assert chunk_for(1, 16, 1, 1024) == chunk_for(1, 16, 1, 1024)
    assert chunk_for(1, 1, 1, 7) == 16  # never below 16 slots
    assert chunk_for(64, 32, 16, 1 << 20) == 512  # never above 512
    target = decode_attention_module.TARGET_PROGRAMS
    for batch, heads, seq, slots in [(1, 16, 1, 1024), (1, 8, 1, 2048), (2, 16, 4, 1024), (1, 32, 1, 4096)]:
        rows, chunk = batch * heads * seq, chunk_for(batch, heads, seq, slots)
        assert rows * -(-slots // chunk) <= target < rows * -(-slots // (chunk // 2))  # the smallest that fits


@functools.cache
def _load_example():
    """examples/llama_decode.py as a module (registered in sys.modules first: its dataclass looks itself up there)."""
    spec = importlib.util.spec_from_file_location("llama_decode_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _fused_attention_forward(attention, x, input_pos, rope):
    """examples/llama_decode.py's Attention.forward with the two kernels: wqkv, 2 launches, wo."""
    cache = attention.kv_cache
    q = rope_kv_update(attention.wqkv(x), rope, input_pos, cache.k_cache, cache.v_cache, attention.n_heads)
    return attention.wo(decode_attention(q, cache.k_cache, cache.v_cache, input_pos))


@cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("positions", [[31], [0], [15], [5, 6, 7]], ids=str)
def test_swapped_into_the_example_attention_module(positions, dtype):
    example = _load_example()
    config = example.CPU_CONFIG
    model = example.build_model(config, device="cpu", dtype=dtype)
    eager = model.layers[0].attention
    fused = copy.deepcopy(eager)
    input_pos = torch.tensor(positions)
    rope = model.rope[input_pos]  # bf16 after model.to(bf16): the kernel upcasts it as eager promotion does
    mask = model.causal_mask[None, None, input_pos]
    x = _random((1, len(positions), config.d_model), dtype, "cpu", 9)

    expected = eager(x, input_pos, rope, mask)
    actual = _fused_attention_forward(fused, x, input_pos, rope)

    assert actual.shape == expected.shape and actual.dtype == dtype
    _assert_same_as_eager(fused.kv_cache.k_cache, eager.kv_cache.k_cache)
    assert torch.equal(fused.kv_cache.v_cache, eager.kv_cache.v_cache)
    # Both sides are approximations of the same float64 value (eager SDPA on the CPU also works in fp32 and
    # rounds once); bf16 outputs then go through wo, a 64-wide bf16 matmul. Relative L2 error: fp32 1e-5,
    # bf16 2e-2 (a few bf16 roundings of 2**-8 each, the interpreter's truncation included).
    relative_error = ((actual.double() - expected.double()).norm() / expected.double().norm()).item()
    assert relative_error < (1e-5 if dtype == torch.float32 else 2e-2), relative_error


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("position", [1023, 512, 0])
def test_decode_shape_on_gpu_and_in_a_cuda_graph(position):
    """B=1, H=16, hd=128, T=1024, bf16: both kernels, then captured in a CUDA graph and replayed at a new position."""
    batch, n_heads, head_dim, n_slots, dtype = 1, 16, 128, 1024, torch.bfloat16
    qkv = _random((batch, 1, 3 * n_heads * head_dim), dtype, "cuda", 10)
    k_cache = _random((batch, n_heads, n_slots, head_dim), dtype, "cuda", 11)
    v_cache = _random((batch, n_heads, n_slots, head_dim), dtype, "cuda", 12)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    input_pos = torch.tensor([position], device="cuda")
    rope = _rope_rows([position], head_dim, "cuda")

    q = rope_kv_update(qkv, rope, input_pos, k_cache, v_cache, n_heads)
    q_expected = rope_kv_update_reference(qkv, rope, input_pos, k_expected, v_expected, n_heads)
    assert torch.equal(q, q_expected) and torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)
    out = decode_attention(q, k_cache, v_cache, input_pos)
    expected = decode_attention_reference(q, k_cache, v_cache, input_pos)
    torch.testing.assert_close(out.double(), expected, **ATTENTION_TOLERANCES[dtype])

    # Capture both launches with the position in a device tensor, then move it and replay: no host sync inside.
    def step():
        q = rope_kv_update(qkv, rope, input_pos, k_cache, v_cache, n_heads)
        return decode_attention(q, k_cache, v_cache, input_pos)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm up outside the capture (same position: rewrites the same slot)
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = step()
    new_position = (position + 300) % n_slots
    input_pos.fill_(new_position)
    rope.copy_(_rope_rows([new_position], head_dim, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    q_expected = rope_kv_update_reference(qkv, rope, input_pos, k_expected, v_expected, n_heads)
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)
    expected = decode_attention_reference(q_expected, k_cache, v_cache, input_pos)
    torch.testing.assert_close(graph_out.double(), expected, **ATTENTION_TOLERANCES[dtype])


def _bad_inputs():
    qkv = torch.randn(1, 2, 3 * 2 * 8)
    rope = torch.randn(2, 4, 2)
    pos = torch.tensor([3, 4])
    cache = torch.randn(1, 2, 16, 8)
    q = torch.randn(1, 2, 2, 8)
    return [
        (lambda: rope_kv_update(qkv.numpy(), rope, pos, cache, cache, 2), "qkv must be a torch.Tensor"),
        (lambda: rope_kv_update(qkv.double(), rope, pos, cache, cache, 2), "qkv has dtype"),
        (lambda: rope_kv_update(qkv, rope, pos, cache, cache, 0), "n_heads must be a positive int"),
        (lambda: rope_kv_update(qkv, rope, pos, cache, cache, 5), r"qkv must have shape \(B, S, 3 \* 5"),
        (lambda: rope_kv_update(qkv[..., ::2], rope, pos, cache, cache, 1), "unit last-dim stride"),
        (lambda: rope_kv_update(torch.randn(1, 1, 3 * 2 * 3), rope[:1], pos[:1], cache, cache, 2), "must be even"),
        (lambda: rope_kv_update(qkv, rope[:, :3], pos, cache, cache, 2), r"rope must have shape \(2, 4, 2\)"),
        (lambda: rope_kv_update(qkv, rope.double(), pos, cache, cache, 2), "rope has dtype"),
        (lambda: rope_kv_update(qkv, rope, pos.float(), cache, cache, 2), "input_pos has dtype"),
        (lambda: rope_kv_update(qkv, rope, pos[:1], cache, cache, 2), r"input_pos must have shape \(2,\)"),
        (lambda: rope_kv_update(qkv, rope, pos.to("meta"), cache, cache, 2), "input_pos is on"),
        (lambda: rope_kv_update(qkv, rope, pos, cache[:, :1], cache, 2), r"k_cache must have shape \(1, 2, T, 8\)"),
        (lambda: rope_kv_update(qkv, rope, pos, cache, cache.half(), 2), "v_cache has dtype"),
        (lambda: rope_kv_update(qkv, rope, pos, cache, cache[:, :, :9], 2), "v_cache has 9 slots"),
        (lambda: rope_kv_update(qkv, rope, pos, cache, cache.to("meta"), 2), "v_cache is on"),
        (lambda: rope_kv_update(qkv, rope, pos, cache.mT.contiguous().mT, cache, 2), "k_cache must have a unit"),
        (lambda: decode_attention(q.double(), cache, cache, pos), "q has dtype"),
        (lambda: decode_attention(q[0], cache, cache, pos), "q must have a non-empty shape"),
        (lambda: decode_attention(q[..., ::2], cache[..., :4], cache[..., :4], pos), "q must have a unit"),
        (lambda: decode_attention(q, cache[..., :4], cache, pos), r"k_cache must have shape \(1, 2, T, 8\)"),
        (lambda: decode_attention(q, cache[:, :, :0], cache[:, :, :0], pos), r"no slots"),
        (lambda: decode_attention(q, cache, cache.bfloat16(), pos), "v_cache has dtype"),
        (lambda: decode_attention(q, cache, cache[:, :, :5], pos), "v_cache has 5 slots"),
        (lambda: decode_attention(q, cache, cache, pos[:1]), r"input_pos must have shape \(2,\)"),
        (lambda: decode_attention(q, cache, cache, pos, scale=float("nan")), "scale must be a finite number"),
        (lambda: decode_attention(q, cache, cache, [3, 4]), "input_pos must be a torch.Tensor"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_inputs())))
def test_bad_inputs_raise_one_line_value_error(case):
    call, message = _bad_inputs()[case]
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)

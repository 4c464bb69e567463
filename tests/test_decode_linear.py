"""gpuadvisor/kernels/decode_linear.py against float64 references: odd and decode shapes, dtypes, FP8, bias, SwiGLU.

Without CUDA the kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 is set below before triton is
imported (as in test_kernels.py). The interpreter runs one program at a time in numpy (~10 ms per loop step
of a 16 x 512 bf16 tile), so CPU shapes keep programs x K-steps small: a large N goes with a small K and
a large K with a small N. Tests marked ``gpu`` run the Llama decode shapes compiled on CUDA and skip elsewhere.

FP8 in the interpreter: loading a ``torch.float8_e4m3fn`` tensor and converting it to fp32/fp16/bf16 works
under TRITON_INTERPRET=1 with triton 3.9 (exact on every value tried), so the FP8 path is tested on CPU too.
"""

from __future__ import annotations

import pytest
from kernel_mode import kernel_mode  # noqa: E402

torch, CUDA, INTERPRET = kernel_mode()

from gpuadvisor.kernels.decode_linear import (  # noqa: E402
    FP8_E4M3_MAX,
    MAX_ROWS,
    DecodeLinearConfig,
    _launch,
    config_for,
    decode_gate_up_swiglu,
    decode_gate_up_swiglu_reference,
    decode_linear,
    decode_linear_reference,
    quantize_fp8_rows,
)

FP8 = torch.float8_e4m3fn

# Tolerances per output dtype, relative to the float64 reference on outputs of magnitude ~1 (x ~ N(0, 1),
# weights ~ N(0, 1/K)). The reference sees the same rounded inputs, so only fp32 accumulation and the
# final rounding count:
# - float32: fp32 sums of <= 5632 products drift by ~sqrt(K) * 6e-8 ~ 5e-6 relative at most: 2e-5.
# - float16: one rounding of a 10-bit mantissa, 2**-11 ~ 4.9e-4 relative: 2e-3 leaves room for the sums.
# - bfloat16: one rounding of a 7-bit mantissa, 2**-9 relative compiled; Triton's CPU interpreter truncates
#   fp32 -> bf16 instead of rounding to nearest even (interpreter.py, _convert_float): 2**-8. 1.6e-2 as
#   in test_kernels.py, a wrong kernel is off by O(1).
TOLERANCES = {
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

cpu_only = pytest.mark.skipif(not INTERPRET, reason="CPU tensors need Triton's interpreter (TRITON_INTERPRET=1)")
needs_cuda = pytest.mark.skipif(not CUDA or INTERPRET, reason="needs CUDA (and TRITON_INTERPRET unset)")
gpu = [needs_cuda, pytest.mark.gpu]

# (rows, N, K) on CPU: odd everything (N 1, 7, 123, 2053 = 2048 + 5; K 5, 64, 1000, 2048), rows 1, 3, 4, 16.
# 2053 x 64 covers many programs and a masked last block of N; 123 x 2048 covers a long K loop and split-K.
CPU_SHAPES = [(1, 1, 5), (3, 7, 64), (16, 123, 1000), (1, 2053, 64), (4, 123, 2048), (16, 7, 2048), (1, 123, 1000)]
# The Llama decode shapes (d=2048, MLP 5632, vocab 32000): qkv, out-proj, gate/up, down, logits.
DECODE_NK = [(6144, 2048), (2048, 2048), (5632, 2048), (2048, 5632), (32000, 2048)]


def _random(shape, dtype, device, seed, std=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float32) * std).to(device=device, dtype=dtype)


def _weight(n, k, dtype, device, seed, std=1.0):
    """[N, K] with rows of norm ~std (entries ~ N(0, std**2 / K)), so x @ W.T is O(std) for x ~ N(0, 1)."""
    return _random((n, k), dtype, device, seed, std / k**0.5)


def _assert_close(actual, expected_float64, dtype):
    torch.testing.assert_close(actual.double().cpu(), expected_float64.cpu(), **TOLERANCES[dtype])


def _fp8(weight):
    """Quantized on the CPU (a fixed result whatever the device), then moved to the weight's device."""
    w_fp8, scale = quantize_fp8_rows(weight.cpu())
    return w_fp8.to(weight.device), scale.to(weight.device)


@cpu_only
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=str)
def test_decode_linear_matches_reference(shape, dtype):
    rows, n, k = shape
    x = _random((rows, k), dtype, "cpu", 0)
    w = _weight(n, k, dtype, "cpu", 1)
    y = decode_linear(x, w)
    assert y.dtype == dtype and y.shape == (rows, n)
    _assert_close(y, decode_linear_reference(x, w), dtype)


@cpu_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 7, 64), (3, 123, 1000), (16, 2053, 64), (1, 123, 2048)], ids=str)
def test_fp8_weight_matches_reference(shape, dtype):
    rows, n, k = shape
    x = _random((rows, k), dtype, "cpu", 2)
    w_fp8, scale = _fp8(_weight(n, k, torch.float32, "cpu", 3))
    y = decode_linear(x, w_fp8, scale)
    assert y.dtype == dtype and y.shape == (rows, n)
    _assert_close(y, decode_linear_reference(x, w_fp8, scale), dtype)


@cpu_only
@pytest.mark.parametrize("fp8", [False, True], ids=["same-dtype", "fp8"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 123, 1000), (3, 7, 64), (16, 42, 2048)], ids=str)
def test_gate_up_swiglu_matches_reference(shape, dtype, fp8):
    rows, n, k = shape
    x = _random((rows, k), dtype, "cpu", 4)
    w_gate = _weight(n, k, torch.float32, "cpu", 5, std=3.0)  # gate values reach silu's saturated tails
    w_up = _weight(n, k, torch.float32, "cpu", 6)
    if fp8:
        (w_gate, scale_gate), (w_up, scale_up) = _fp8(w_gate), _fp8(w_up)
    else:
        w_gate, w_up, scale_gate, scale_up = w_gate.to(dtype), w_up.to(dtype), None, None
    out = decode_gate_up_swiglu(x, w_gate, w_up, scale_gate, scale_up)
    assert out.dtype == dtype and out.shape == (rows, n)
    _assert_close(out, decode_gate_up_swiglu_reference(x, w_gate, w_up, scale_gate, scale_up), dtype)


@cpu_only
@pytest.mark.parametrize(
    "config",
    [
        DecodeLinearConfig(block_n=8, block_k=128, split_k=1, use_dot=False),
        DecodeLinearConfig(block_n=64, block_k=32, split_k=8, use_dot=False),
        DecodeLinearConfig(block_n=16, block_k=64, split_k=3, use_dot=True),
        DecodeLinearConfig(block_n=32, block_k=512, split_k=2, use_dot=True),
    ],
    ids=["fma-8x128", "fma-64x32-split8", "dot-16x64-split3", "dot-32x512-split2"],
)
@pytest.mark.parametrize("gate_up", [False, True], ids=["linear", "gate_up"])
def test_every_config_path_matches_reference(config, gate_up):
    """The FMA and tl.dot paths, split-K 1/2/3/8 (3 does not divide the 16 K-steps: one short slice), odd tail."""
    rows = 1 if not config.use_dot else 5
    x = _random((rows, 1000), torch.bfloat16, "cpu", 7)
    w = _weight(77, 1000, torch.bfloat16, "cpu", 8)
    bias = _random((77,), torch.float32, "cpu", 9)
    if gate_up:
        w_up = _weight(77, 1000, torch.bfloat16, "cpu", 10)
        out = _launch(x, w, None, None, config, weight2=w_up)
        expected = decode_gate_up_swiglu_reference(x, w, w_up)
    else:
        out = _launch(x, w, None, bias, config)
        expected = decode_linear_reference(x, w, bias=bias)
    _assert_close(out, expected, torch.bfloat16)


@cpu_only
@pytest.mark.parametrize("k", [1088, 1000], ids=["K=17x64", "K=1000"])
@pytest.mark.parametrize("use_dot", [False, True], ids=["fma", "dot"])
def test_unroll_two_tiles_per_step(use_dot, k):
    """unroll=2: 17 tiles of 64 (K=1088) leave the last step half past the end, unmasked path; 1000 is masked."""
    rows = 3 if use_dot else 1
    x = _random((rows, k), torch.float16, "cpu", 23)
    w = _weight(21, k, torch.float16, "cpu", 24)
    for split_k in (1, 3):
        config = DecodeLinearConfig(block_n=16, block_k=64, split_k=split_k, use_dot=use_dot, unroll=2)
        _assert_close(_launch(x, w, None, None, config), decode_linear_reference(x, w), torch.float16)
    w_up = _weight(21, k, torch.float16, "cpu", 25)
    config = DecodeLinearConfig(block_n=16, block_k=128, split_k=3, use_dot=use_dot, unroll=2)
    out = _launch(x, w, None, None, config, weight2=w_up)
    _assert_close(out, decode_gate_up_swiglu_reference(x, w, w_up), torch.float16)


@cpu_only
@pytest.mark.parametrize("split_k", [1, 4], ids=["one-pass", "split-k"])
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_bias_added_in_fp32(bias_dtype, split_k):
    x = _random((3, 256), torch.bfloat16, "cpu", 11)
    w = _weight(123, 256, torch.bfloat16, "cpu", 12)
    bias = _random((123,), bias_dtype, "cpu", 13)
    out = _launch(x, w, None, bias, DecodeLinearConfig(block_n=32, block_k=32, split_k=split_k, use_dot=True))
    _assert_close(out, decode_linear_reference(x, w, bias=bias), torch.bfloat16)
    _assert_close(decode_linear(x, w, bias=bias), decode_linear_reference(x, w, bias=bias), torch.bfloat16)


@cpu_only
def test_leading_dims_strided_rows_and_transposed_x():
    """[B, S, K] in, [B, S, N] out; a row-strided view of x needs no copy; a column-major x is copied (tiny)."""
    w = _weight(45, 100, torch.float16, "cpu", 14)
    x = _random((2, 3, 100), torch.float16, "cpu", 15)
    y = decode_linear(x, w)
    assert y.shape == (2, 3, 45)
    _assert_close(y, decode_linear_reference(x, w), torch.float16)

    wide = _random((4, 300), torch.float16, "cpu", 16)
    x_view = wide[:, 50:150]  # rows 300 apart, last dim contiguous
    assert x_view.stride() == (300, 1)
    _assert_close(decode_linear(x_view, w), decode_linear_reference(x_view, w), torch.float16)
    x_every_other = _random((8, 100), torch.float16, "cpu", 17)[::2]  # row stride 200
    _assert_close(decode_linear(x_every_other, w), decode_linear_reference(x_every_other, w), torch.float16)

    x_col_major = _random((100, 3), torch.float16, "cpu", 18).t()  # last-dim stride 3
    _assert_close(decode_linear(x_col_major, w), decode_linear_reference(x_col_major, w), torch.float16)

    w_rows_strided = _weight(45, 160, torch.float16, "cpu", 19)[:, 30:130]  # weight row stride 160 > K
    _assert_close(decode_linear(x, w_rows_strided), decode_linear_reference(x, w_rows_strided), torch.float16)
    out = decode_gate_up_swiglu(x, w, w_rows_strided)
    assert out.shape == (2, 3, 45)
    _assert_close(out, decode_gate_up_swiglu_reference(x, w, w_rows_strided), torch.float16)


@cpu_only
def test_max_rows_and_empty():
    w = _weight(9, 32, torch.float32, "cpu", 20)
    x = _random((MAX_ROWS // 4, 4, 32), torch.float32, "cpu", 21)  # exactly MAX_ROWS rows
    _assert_close(decode_linear(x, w), decode_linear_reference(x, w), torch.float32)
    assert decode_linear(torch.empty((0, 32)), w).shape == (0, 9)
    assert decode_linear(torch.empty((2, 0, 32)), w).shape == (2, 0, 9)
    assert decode_gate_up_swiglu(torch.empty((0, 32)), w, w).shape == (0, 9)
    assert decode_linear(x, w[:0]).shape == (4, 4, 0)


def test_quantize_fp8_rows():
    """scale = amax / 448 per row; each element within e4m3's rounding; the row max maps to +-448; zero rows safe."""
    w = _random((33, 200), torch.float32, "cpu", 22) * torch.logspace(-3, 3, 33)[:, None]
    w[5] = 0.0
    w_fp8, scale = quantize_fp8_rows(w.bfloat16())
    assert w_fp8.dtype == FP8 and w_fp8.shape == w.shape and scale.dtype == torch.float32 and scale.shape == (33,)
    w_bf16 = w.bfloat16().float()
    amax = w_bf16.abs().amax(dim=1)
    torch.testing.assert_close(scale[amax > 0], amax[amax > 0] / FP8_E4M3_MAX, rtol=1e-6, atol=0)
    assert scale[5] > 0 and torch.all(w_fp8[5].float() == 0)
    dequantized = w_fp8.float() * scale[:, None]
    assert torch.isfinite(dequantized).all()
    # e4m3: 3 mantissa bits, so rounding is <= 2**-4 relative for normals; below 2**-6 (times the scale)
    # values are subnormal with spacing 2**-9, so <= 2**-10 absolute in the scaled domain.
    bound = torch.maximum(w_bf16.abs() * 2**-4, 2**-10 * scale[:, None])
    assert ((dequantized - w_bf16).abs() <= bound * (1 + 1e-6)).all()
    row_max = w_fp8.float().abs().amax(dim=1)
    assert torch.all(row_max[amax > 0] == FP8_E4M3_MAX)


def test_config_for_is_valid_on_decode_shapes():
    """Pure function of shapes: use_dot for more than one row (tl.dot's N >= 16), power-of-two blocks, split 1..8."""
    for rows in (1, 2, 4, 16):
        for n, k in [*DECODE_NK, (1, 5), (7, 64), (123, 1000)]:
            for dtype in (torch.bfloat16, torch.float16, torch.float32, FP8):
                for gate_up in (False, True):
                    c = config_for(rows, n, k, dtype, gate_up=gate_up)
                    assert c == config_for(rows, n, k, dtype, gate_up=gate_up)
                    assert c.use_dot or rows == 1
                    assert c.block_n >= (16 if c.use_dot else 1) and c.block_k >= 16
                    assert c.block_n & (c.block_n - 1) == 0 and c.block_k & (c.block_k - 1) == 0
                    assert 1 <= c.split_k <= 8 and c.num_warps in (1, 2, 4, 8, 16) and c.num_stages >= 1


def _bad_inputs():
    x = torch.randn(2, 8)
    w = torch.randn(4, 8)
    w8, s8 = quantize_fp8_rows(w)
    return [
        (lambda: decode_linear(torch.randn(17, 8), w), "x has 17 rows"),
        (lambda: decode_linear(torch.randn(3, 6, 8), w), "x has 18 rows"),
        (lambda: decode_linear(x, torch.randn(4, 9)), r"weight must have shape \(N, 8\)"),
        (lambda: decode_linear(x, torch.randn(8)), r"weight must have shape \(N, 8\)"),
        (lambda: decode_linear(x.double(), w.double()), "x has dtype torch.float64"),
        (lambda: decode_linear(x.int(), w), "x has dtype torch.int32"),
        (lambda: decode_linear(x, w.half()), "weight has dtype torch.float16; expected x's dtype"),
        (lambda: decode_linear(x, w.to(torch.float8_e5m2)), "weight has dtype torch.float8_e5m2"),
        (lambda: decode_linear(x, w8), "needs scale"),
        (lambda: decode_linear(x, w8, s8.half()), "scale must be a float32 tensor"),
        (lambda: decode_linear(x, w8, s8[:3]), r"scale must have shape \(4,\)"),
        (lambda: decode_linear(x, w, s8), "scale is only for float8_e4m3fn weights"),
        (lambda: decode_linear(x, torch.randn(8, 4).t()), "weight must be contiguous along K"),
        (lambda: decode_linear(x, w, bias=torch.randn(5)), r"bias must have shape \(4,\)"),
        (lambda: decode_linear(x, w, bias=torch.randn(4).double()), "bias must be a float32"),
        (lambda: decode_linear(x.numpy(), w), "x must be a torch.Tensor"),
        (lambda: decode_linear(x, w.numpy()), "weight must be a torch.Tensor"),
        (lambda: decode_linear(torch.randn(2, 0), torch.randn(4, 0)), "non-empty last dimension"),
        (lambda: decode_linear(x, w.to("meta")), "weight is on meta"),
        (lambda: decode_gate_up_swiglu(x, w, torch.randn(5, 8)), "w_up has 5 rows, expected 4"),
        (lambda: decode_gate_up_swiglu(x, w, torch.randn(4, 7)), r"w_up must have shape \(N, 8\)"),
        (lambda: decode_gate_up_swiglu(x, w8, w, s8), "w_up has dtype torch.float32, w_gate has"),
        (lambda: decode_gate_up_swiglu(x, w8, w8, s8), "needs scale_up"),
        (lambda: quantize_fp8_rows(torch.randn(8)), "weight must be a 2-D tensor"),
        (lambda: quantize_fp8_rows(w8), "weight must be float32, float16 or bfloat16"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_inputs())))
def test_bad_inputs_raise_one_line_value_error(case):
    call, message = _bad_inputs()[case]
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


# ---- compiled on CUDA: the decode shapes --------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("nk", DECODE_NK, ids=str)
@pytest.mark.parametrize("weight_kind", ["bf16", "fp8"])
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_decode_shapes_on_gpu(weight_kind, nk, rows, device):
    n, k = nk
    x = _random((rows, k), torch.bfloat16, device, 30)
    w = _weight(n, k, torch.bfloat16, device, 31)
    scale = None
    if weight_kind == "fp8":
        w, scale = _fp8(w.float())
    bias = _random((n,), torch.bfloat16, device, 32)
    _assert_close(decode_linear(x, w, scale), decode_linear_reference(x, w, scale), torch.bfloat16)
    _assert_close(decode_linear(x, w, scale, bias), decode_linear_reference(x, w, scale, bias), torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("weight_kind", ["bf16", "fp8"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_gate_up_and_dtypes_on_gpu(dtype, weight_kind, rows, device):
    n, k = 5632, 2048
    x = _random((1, rows, k), dtype, device, 33)
    w_gate = _weight(n, k, torch.float32, device, 34, std=3.0)
    w_up = _weight(n, k, torch.float32, device, 35)
    if weight_kind == "fp8":
        (w_gate, scale_gate), (w_up, scale_up) = _fp8(w_gate), _fp8(w_up)
    else:
        w_gate, w_up, scale_gate, scale_up = w_gate.to(dtype), w_up.to(dtype), None, None
    out = decode_gate_up_swiglu(x, w_gate, w_up, scale_gate, scale_up)
    assert out.shape == (1, rows, n) and out.dtype == dtype
    _assert_close(out, decode_gate_up_swiglu_reference(x, w_gate, w_up, scale_gate, scale_up), dtype)
    y = decode_linear(x, w_up, scale_up)
    _assert_close(y, decode_linear_reference(x, w_up, scale_up), dtype)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=gpu)])
def test_split_k_is_deterministic_and_graph_capturable_on_gpu(device):
    """Split-K sums partials in a fixed order (same bits every run); a CUDA graph replays the same launches."""
    x = _random((1, 5632), torch.bfloat16, device, 36)
    w = _weight(2048, 5632, torch.bfloat16, device, 37)
    config = DecodeLinearConfig(block_n=16, block_k=256, split_k=8, use_dot=False)
    first = _launch(x, w, None, None, config)
    for _ in range(5):
        assert torch.equal(_launch(x, w, None, None, config), first)
    _assert_close(first, decode_linear_reference(x, w), torch.bfloat16)

    w_gate = _weight(5632, 2048, torch.bfloat16, device, 38)
    w_small = _weight(2048, 2048, torch.bfloat16, device, 39)
    static_x = _random((1, 2048), torch.bfloat16, device, 40)
    decode_linear(static_x, w_small)  # compile (and run once) before capturing
    decode_gate_up_swiglu(static_x, w_gate, w_gate)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = decode_linear(static_x, w_small)
        out = decode_gate_up_swiglu(static_x, w_gate, w_gate)
    static_x.copy_(_random((1, 2048), torch.bfloat16, device, 41))
    graph.replay()
    torch.cuda.synchronize()
    _assert_close(y, decode_linear_reference(static_x, w_small), torch.bfloat16)
    _assert_close(out, decode_gate_up_swiglu_reference(static_x, w_gate, w_gate), torch.bfloat16)

"""The Triton kernels under gpuadvisor/kernels against float64 references, on odd and larger shapes.

Without CUDA the kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1 is set below before triton is
imported (``triton.jit`` reads it when each function, triton.language's own included, is defined, and
launches read it again, so it stays set for the session). Tests marked ``gpu`` run the same checks
compiled on CUDA and skip elsewhere.
"""

from __future__ import annotations

import pytest
from kernel_mode import kernel_mode  # noqa: E402

torch, CUDA, INTERPRET = kernel_mode()

from gpuadvisor.kernels.add_rmsnorm import _launch as _add_rmsnorm_launch  # noqa: E402
from gpuadvisor.kernels.add_rmsnorm import add_rmsnorm, add_rmsnorm_reference  # noqa: E402
from gpuadvisor.kernels.rmsnorm import _launch as _rmsnorm_launch  # noqa: E402
from gpuadvisor.kernels.rmsnorm import rmsnorm, rmsnorm_reference  # noqa: E402
from gpuadvisor.kernels.swiglu import swiglu, swiglu_reference  # noqa: E402

# Odd widths (1, 7, 42, 257, 5000 are not powers of two: masked tails) and rows (1, 3, 6, 17, 123);
# (64, 4096) is a Llama-size hidden width. The interpreter runs one program at a time, so big shapes stay few.
SHAPES = [(1, 1), (3, 7), (6, 42), (123, 257), (64, 4096), (17, 5000)]

# Tolerances per dtype, relative to the float64 reference:
# - float32: fp32 accumulation of <= 5000 squares drifts by ~sqrt(N) * 6e-8 relative, well under 1e-5.
# - float16: a 10-bit mantissa; the output rounding alone is 2**-11 relative, and h's rounding
#   propagates into y, so 2e-3.
# - bfloat16: an 8-bit mantissa (7 stored); one rounding is 2**-8 relative, and Triton's CPU interpreter
#   truncates fp32 -> bf16 instead of rounding to nearest even (triton/runtime/interpreter.py,
#   _convert_float), which doubles that, for h and again for y: 2**-6 ~ 1.6e-2.
TOLERANCES = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
}
DTYPES = [torch.float32, torch.bfloat16]

cpu_only = pytest.mark.skipif(not INTERPRET, reason="CPU tensors need Triton's interpreter (TRITON_INTERPRET=1)")
needs_cuda = pytest.mark.skipif(not CUDA or INTERPRET, reason="needs CUDA (and TRITON_INTERPRET unset)")

DEVICES = [
    pytest.param("cpu", marks=cpu_only, id="cpu"),
    pytest.param("cuda", marks=[needs_cuda, pytest.mark.gpu], id="cuda"),
]


def _random(shape, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)


def _assert_close(actual, expected_float64, dtype):
    # Compare in float64 against the reference; a bad kernel is off by O(1), the tolerance by O(ulp).
    torch.testing.assert_close(actual.double().cpu(), expected_float64.cpu(), **TOLERANCES[dtype])


def _assert_h_matches(h, expected_h, dtype):
    """h is x + residual in the input dtype: bit-exact when compiled; the interpreter's bf16 cast truncates."""
    if INTERPRET and dtype == torch.bfloat16 and h.device.type == "cpu":
        torch.testing.assert_close(h.double(), expected_h.double(), rtol=2**-7, atol=0)
    else:
        assert torch.equal(h, expected_h)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_add_rmsnorm_matches_reference(shape, dtype, device):
    x = _random(shape, dtype, device, 0)
    residual = _random(shape, dtype, device, 1)
    weight = _random(shape[-1:], dtype, device, 2)
    y, h = add_rmsnorm(x, residual, weight, eps=1e-5)
    y_ref, h_ref = add_rmsnorm_reference(x, residual, weight, eps=1e-5)
    assert y.dtype == h.dtype == dtype and y.shape == h.shape == x.shape
    _assert_h_matches(h, h_ref, dtype)
    _assert_close(y, y_ref, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rmsnorm_matches_reference(shape, dtype, device):
    x = _random(shape, dtype, device, 3)
    weight = _random(shape[-1:], dtype, device, 4)
    y = rmsnorm(x, weight, eps=1e-6)
    assert y.dtype == dtype and y.shape == x.shape
    _assert_close(y, rmsnorm_reference(x, weight, eps=1e-6), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_swiglu_matches_reference(shape, dtype, device):
    gate = _random(shape, dtype, device, 5) * 4  # reach silu's saturated tails on both sides
    up = _random(shape, dtype, device, 6)
    out = swiglu(gate, up)
    assert out.dtype == dtype and out.shape == gate.shape
    _assert_close(out, swiglu_reference(gate, up), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_two_pass_path_matches_single_pass_reference(dtype, device):
    """Rows wider than MAX_SINGLE_PASS_N go in chunks; force small chunks on an odd width to cover that path."""
    x = _random((5, 300), dtype, device, 7)
    residual = _random((5, 300), dtype, device, 8)
    weight = _random((300,), torch.float32, device, 9)  # an fp32 weight with low-precision activations
    y, h = _add_rmsnorm_launch(x, residual, weight, 1e-6, chunk_n=128)
    y_ref, h_ref = add_rmsnorm_reference(x, residual, weight, eps=1e-6)
    _assert_h_matches(h, h_ref, dtype)
    _assert_close(y, y_ref, dtype)
    _assert_close(_rmsnorm_launch(x, weight, 1e-6, chunk_n=64), rmsnorm_reference(x, weight, eps=1e-6), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_leading_dims_strided_rows_and_fp16(device):
    """[B, T, N] inputs, row-strided views (halves of a fused projection) and fp16 all work without copies."""
    gate_up = _random((2, 3, 2 * 130), torch.float16, device, 10)
    gate, up = gate_up.chunk(2, dim=-1)
    _assert_close(swiglu(gate, up), swiglu_reference(gate, up), torch.float16)
    weight = _random((130,), torch.float16, device, 11)
    y, h = add_rmsnorm(gate, up, weight)
    y_ref, h_ref = add_rmsnorm_reference(gate, up, weight)
    assert torch.equal(h, h_ref)
    _assert_close(y, y_ref, torch.float16)
    _assert_close(rmsnorm(gate, weight), rmsnorm_reference(gate, weight), torch.float16)


@cpu_only
def test_empty_rows_launch_nothing():
    x = torch.empty((0, 8))
    y, h = add_rmsnorm(x, x, torch.ones(8))
    assert y.shape == h.shape == (0, 8)
    assert rmsnorm(x, torch.ones(8)).shape == (0, 8)
    assert swiglu(x, x).shape == (0, 8)


def _bad_inputs():
    x = torch.randn(4, 8)
    w = torch.ones(8)
    return [
        ("add_rmsnorm", lambda: add_rmsnorm(x, torch.randn(4, 9), w), "residual has shape"),
        ("add_rmsnorm", lambda: add_rmsnorm(x, x.half(), w), "residual has dtype"),
        ("add_rmsnorm", lambda: add_rmsnorm(x, x, torch.ones(7)), "weight must have shape"),
        ("add_rmsnorm", lambda: add_rmsnorm(x, x, torch.ones(8, dtype=torch.float64)), "weight has dtype"),
        ("add_rmsnorm", lambda: add_rmsnorm(x.double(), x.double(), w), "x has dtype"),
        ("add_rmsnorm", lambda: add_rmsnorm(x.t(), x.t(), torch.ones(4)), "contiguous rows"),
        ("add_rmsnorm", lambda: add_rmsnorm(x, x, w, eps=-1.0), "eps must be"),
        ("add_rmsnorm", lambda: add_rmsnorm(x.numpy(), x, w), "x must be a torch.Tensor"),
        ("add_rmsnorm", lambda: add_rmsnorm(torch.randn(4, 0), torch.randn(4, 0), torch.ones(0)), "non-empty"),
        ("add_rmsnorm", lambda: add_rmsnorm(x, x, torch.ones(8, device="meta")), "weight is on"),
        ("add_rmsnorm", lambda: add_rmsnorm(x, x.to("meta"), w), "residual is on"),
        ("rmsnorm", lambda: rmsnorm(x, torch.ones(2, 4)), "weight must have shape"),
        ("rmsnorm", lambda: rmsnorm(x.int(), w), "x has dtype"),
        ("rmsnorm", lambda: rmsnorm(x, torch.ones(16)[::2]), "weight must be contiguous"),
        ("swiglu", lambda: swiglu(x, torch.randn(8, 4)), "up has shape"),
        ("swiglu", lambda: swiglu(x, x.bfloat16()), "up has dtype"),
        ("swiglu", lambda: swiglu(x[:, ::2], x[:, ::2]), "contiguous rows"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_inputs())))
def test_bad_inputs_raise_one_line_value_error(case):
    _, call, message = _bad_inputs()[case]
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)

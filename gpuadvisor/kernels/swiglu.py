"""SwiGLU activation as one Triton kernel: ``silu(gate) * up`` elementwise.

The math runs in fp32 (``silu(g) = g * sigmoid(g)``) and the result is written in the input dtype: one
read of gate and up and one write per element, so it is bound by memory bandwidth alone.

The grid is (rows, column blocks) over a [rows, N] view, so ``gate`` and ``up`` may be strided row
views, such as the two halves of a fused gate/up projection (``gate_up.chunk(2, dim=-1)``), without
a copy. Rows go on grid axis 0 (up to 2**31 - 1 programs); the column blocks on axis 1 (at most 65535).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpuadvisor.kernels.rmsnorm import as_rows, check_row_input

__all__ = ["swiglu", "swiglu_reference"]

# Columns per program: 1024 elements over 4 warps is 8 per thread (16-byte bf16 vectors); the usual
# choice for a pure elementwise kernel, re-timed by benchmarks/kernels_bench.py.
BLOCK_N = 1024


@triton.jit
def _swiglu_kernel(
    gate_ptr,
    up_ptr,
    out_ptr,
    gate_row_stride,
    up_row_stride,
    out_row_stride,
    n_cols,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    g = tl.load(gate_ptr + row * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * up_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(out_ptr + row * out_row_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(gate: torch.Tensor, up: torch.Tensor, block_n: int = BLOCK_N, num_warps: int = 4) -> torch.Tensor:
    gate_rows, up_rows = as_rows(gate), as_rows(up)
    n_rows, n_cols = gate_rows.shape
    out = torch.empty((n_rows, n_cols), dtype=gate.dtype, device=gate.device)
    if n_rows > 0:
        grid = (n_rows, triton.cdiv(n_cols, block_n))
        _swiglu_kernel[grid](
            gate_rows,
            up_rows,
            out,
            gate_rows.stride(0),
            up_rows.stride(0),
            out.stride(0),
            n_cols,
            BLOCK_N=block_n,
            num_warps=num_warps,
        )
    return out.reshape(gate.shape)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for two tensors of the same shape [..., N], dtype and device; rows contiguous.

    Returns a new tensor in the input dtype. Raises ValueError on anything else.
    """
    check_row_input("gate", gate)
    check_row_input("up", up)
    if up.shape != gate.shape:
        raise ValueError(f"up has shape {tuple(up.shape)}, gate has {tuple(gate.shape)}")
    if up.dtype != gate.dtype:
        raise ValueError(f"up has dtype {up.dtype}, gate has {gate.dtype}")
    if up.device != gate.device:
        raise ValueError(f"up is on {up.device}, gate is on {gate.device}")
    return _launch(gate, up)


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The same in plain PyTorch and float64 (returns float64)."""
    return torch.nn.functional.silu(gate.double()) * up.double()

"""RMSNorm as one Triton kernel: ``y = x / sqrt(mean(x**2) + eps) * weight`` over the last dimension.

The mean of squares and the reciprocal square root are computed in fp32 whatever the input dtype; ``y``
is written in the input dtype. One program normalizes one row.

Row width and registers: a row up to ``MAX_SINGLE_PASS_N`` elements is loaded once into registers
(BLOCK_N = next power of two >= N), reduced, scaled and stored: 1 read + 1 write per element. Wider rows
are processed in CHUNK_N-wide slices in two passes (sum of squares, then scale), which reads the row
twice (the second read mostly hits L2: one row of 64k bf16 is 128 KiB) but keeps every live fp32 tile
at CHUNK_N / (32 * num_warps) values per thread, so registers never spill. The 16384 limit is register
arithmetic, not a timing: at 16 warps a 16384-wide tile is 32 fp32 values per thread per live tensor
(x, weight, product: ~100 of the 255 registers); at 32768 it would be 64 each and spill.
``benchmarks/kernels_bench.py`` times both paths, and the warp counts, at 16384x4096 bf16.

This module imports triton at the top: it lives under ``gpuadvisor.kernels``, which ``import gpuadvisor``
and the CLI never import.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["rmsnorm", "rmsnorm_reference", "MAX_SINGLE_PASS_N", "CHUNK_N"]

# Widest row kept whole in registers (see the module docstring for the per-thread arithmetic).
MAX_SINGLE_PASS_N = 16384
# Slice width of the two-pass path: 4096 fp32 values over 16 warps is 8 per thread per live tile.
CHUNK_N = 4096

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    x_row_stride,
    y_row_stride,
    n_cols,
    eps,
    BLOCK_N: tl.constexpr,
    SINGLE_PASS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    if SINGLE_PASS:
        cols = tl.arange(0, BLOCK_N)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def num_warps_for(block_n: int) -> int:
    """Warps per row program: the block-size table Liger-Kernel's ``calculate_settings`` uses."""
    if block_n >= 32768:
        return 32
    if block_n >= 8192:
        return 16
    if block_n >= 2048:
        return 8
    return 4


def check_row_input(name: str, t: object) -> None:
    """Raise ValueError unless ``t`` is a non-empty-row tensor of a supported dtype with unit last stride."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} has dtype {t.dtype}; supported: float32, float16, bfloat16")
    if t.dim() < 1 or t.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last dimension, got shape {tuple(t.shape)}")
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must have contiguous rows (last-dim stride 1), got strides {t.stride()}")


def check_weight(weight: object, n_cols: int, device: torch.device) -> None:
    """Raise ValueError unless ``weight`` is a 1-D tensor of ``n_cols`` supported floats on ``device``."""
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if weight.dim() != 1 or weight.shape[0] != n_cols:
        raise ValueError(f"weight must have shape ({n_cols},), got {tuple(weight.shape)}")
    if weight.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"weight has dtype {weight.dtype}; supported: float32, float16, bfloat16")
    if weight.device != device:
        raise ValueError(f"weight is on {weight.device}, input is on {device}")
    if weight.stride(0) != 1 and n_cols > 1:
        raise ValueError(f"weight must be contiguous, got stride {weight.stride(0)}")


def check_eps(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a non-negative number, got {eps!r}")
    return float(eps)


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as [rows, N]; copies only when the leading dimensions cannot be merged."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 or rows.shape[-1] == 1 else rows.contiguous()


def _launch(
    x: torch.Tensor, weight: torch.Tensor, eps: float, chunk_n: int | None = None, num_warps: int | None = None
) -> torch.Tensor:
    x_rows = as_rows(x)
    n_rows, n_cols = x_rows.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return y.reshape(x.shape)
    if chunk_n is None and n_cols <= MAX_SINGLE_PASS_N:
        block_n, single_pass = triton.next_power_of_2(n_cols), True
    else:
        block_n, single_pass = triton.next_power_of_2(chunk_n or CHUNK_N), False
    _rmsnorm_kernel[(n_rows,)](
        x_rows,
        weight,
        y,
        x_rows.stride(0),
        y.stride(0),
        n_cols,
        eps,
        BLOCK_N=block_n,
        SINGLE_PASS=single_pass,
        num_warps=num_warps or num_warps_for(block_n),
    )
    return y.reshape(x.shape)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of ``x`` ([..., N], float32/float16/bfloat16) over its last dimension, times ``weight`` ([N]).

    Returns ``y`` in ``x``'s dtype. Raises ValueError on a bad shape, dtype, device or eps.
    """
    check_row_input("x", x)
    check_weight(weight, x.shape[-1], x.device)
    return _launch(x, weight, check_eps(eps))


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The same in plain PyTorch and float64 (returns float64): the yardstick for the kernel's error."""
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()

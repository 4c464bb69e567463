"""Decode-shape linear layers as Triton kernels: ``y = x @ W.T`` for x with few rows (``MAX_ROWS`` = 16).

Why: at LLM decode (batch 1) every linear layer reads its whole weight to produce one row, so the layer is
bound by memory bandwidth alone, and the kernel must keep every SM streaming. Nsight Compute on an H200
puts 85% of an eager Llama decode step's GPU time in cuBLAS kernels whose grid is under one wave of the
132 SMs, at ~50% of memory throughput. The kernels here split the output rows (N) over many programs
and, where N is small, split K as well, so the weight is streamed once by many CTAs; the goal is >= 80%
of the device-to-device copy bandwidth (4.24 TB/s, bytes read + written, measured on the H200).

What one program does: it owns ``BLOCK_N`` output columns and one slice of K. It loads ``[BLOCK_N,
BLOCK_K]`` weight tiles (rows of W, contiguous along K: 16-byte vector loads) and the matching
``[rows, BLOCK_K]`` slice of x (tiny, served from L2), in one of two formulations:

- ``use_dot=False`` (one row of x only): ``acc[BLOCK_N, BLOCK_K] += w * x`` elementwise in fp32 registers,
  summed over K once after the loop. One FMA per weight element; no shared memory. Triton does not
  software-pipeline these loads (no cp.async in the sm_90 PTX at any num_stages), so ``unroll=2`` issues
  two tiles' loads per loop step: twice the bytes in flight for the same accumulator registers.
- ``use_dot=True`` (any rows): x padded to 16 rows (the smallest ``tl.dot`` M) and
  ``acc[16, BLOCK_N] = tl.dot(x, w.T, acc)`` on tensor cores, fp32 accumulation. Padding M=1 to 16 costs
  16x the math, which is free here (2 bytes of weight per multiply-add); it is the path for 2..16 rows,
  where one FMA per row per weight element would no longer be.

Weight-only FP8: a ``torch.float8_e4m3fn`` weight with one float32 ``scale`` per output row is loaded as
bytes (half the traffic of bf16) and upcast in registers; e4m3 values are exact in bf16, fp16 and fp32,
so the products are exact and only fp32 accumulation rounds. The row scale multiplies the fp32 sum
(``sum_k x*w8 * scale``, the same value as ``x @ (w8 * scale).T``).

Split-K reduction, deterministic: with ``split_k > 1`` each program writes its fp32 partial sums to a
workspace ``[split, weights, rows, N]`` (``torch.empty`` per call, from the caching allocator) and a second
small kernel adds the partials in a fixed order, adds the bias (and applies SwiGLU), and rounds once to x's
dtype. Results are bitwise reproducible run to run. The cost: one more launch (a few microseconds in eager
mode; in a CUDA graph ~0.33 us per kernel, GA101's figure from the H200 decode step, plus the small
kernel's own run) and ``2 * split * rows * N * 4`` workspace bytes written and read (64 KiB for split 4
at N=2048, rows 1: under 1% of the 8 MiB weight). fp32 ``atomic_add`` into a zeroed
workspace would need the same extra launches (a memset before; a cast after, unless y is fp32) and makes
the summation order, so the result bits, vary between runs; it saves nothing here.

Launch settings come from ``config_for(rows, n, k, weight_dtype)``, a pure function of shapes and dtype,
not from Triton's autotuner: every launch is CUDA-graph capturable (no host syncs, no data-dependent host
logic; the outputs and the workspace are ``torch.empty`` from the caching allocator, which graph capture
supports). ``benchmarks/decode_linear_bench.py`` sweeps block sizes, split counts, warps and stages on the
decode shapes of a Llama-style model (d=2048, MLP 5632, vocab 32000) and records all of them in
``benchmarks/results/decode_linear_bench.json``: the table in ``config_for`` is to be set from it.

Triton versions: the kernels use only what triton 3.6 (the H200) and 3.9 (the CPU interpreter) both have.
One interpreter workaround: triton 3.9's interpreter evaluates ``tl.dot`` of bfloat16 tiles as a numpy
matmul of their uint16 storage (``create_dot`` in triton/runtime/interpreter.py; wrong by ~1e10 on a
3x20 @ 20x17 test), so on CPU tensors bf16 dot operands are upcast to fp32 first. bf16 x bf16 products
are exact in fp32, so this changes only the accumulation order, not the math. Loading float8_e4m3fn and
converting it works in the interpreter (exact on every value tried), so the FP8 path is tested on CPU.
Every configuration the benchmark sweeps compiles for sm_90 with triton 3.9 (ptxas, no GPU needed): 16-byte
vector loads of the weight on both paths, cp.async pipelining on the tl.dot path, and no register spills
except fp8 gate_up tl.dot tiles of 32x512 and 16x1024 (16 to 656 bytes of stack).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

__all__ = [
    "MAX_ROWS",
    "DecodeLinearConfig",
    "config_for",
    "decode_linear",
    "decode_gate_up_swiglu",
    "quantize_fp8_rows",
    "decode_linear_reference",
    "decode_gate_up_swiglu_reference",
]

# Most rows of x: 16 is the smallest M of tl.dot, so up to 16 rows cost one padded tile. Beyond that
# the layer is no longer a pure weight stream and cuBLAS (or a regular GEMM) is the better tool.
MAX_ROWS = 16
# Largest finite float8_e4m3fn value: the per-row scale maps each row's amax onto it.
FP8_E4M3_MAX = 448.0
# A row whose amax is below this gets this amax instead (so an all-zero row gets scale 1e-12 / 448, not 0).
FP8_MIN_AMAX = 1e-12
# Columns per program of the split-K reduction: 512 fp32 over 4 warps = one 16-byte vector per thread.
REDUCE_BLOCK_N = 512

ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8_DTYPE = torch.float8_e4m3fn


@dataclass(frozen=True)
class DecodeLinearConfig:
    """Launch settings of one decode_linear call.

    ``block_n`` output columns per program (>= 16 when ``use_dot``); ``block_k`` weight elements per row
    per loop step (a power of two >= 16); ``split_k`` K slices (a second, reduction kernel when > 1; the
    launch uses ``ceil(K / k_per_split)`` slices, so never an empty one); ``use_dot`` tensor cores with x
    padded to 16 rows (required for more than one row); ``unroll`` 1 or 2 K-tiles loaded per loop step.
    """

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    use_dot: bool = False
    unroll: int = 1


def _pow2_at_least(value: int, floor: int) -> int:
    return max(floor, triton.next_power_of_2(max(1, value)))


@functools.lru_cache(maxsize=512)  # called on every launch: a decode step asks for the same few shapes
def config_for(rows: int, n: int, k: int, weight_dtype: torch.dtype, *, gate_up: bool = False) -> DecodeLinearConfig:
    """Launch settings for ``rows`` x ``k`` times a ``[n, k]`` weight of ``weight_dtype`` (pure; no device query).

    ``gate_up`` is for ``decode_gate_up_swiglu``, whose programs stream two weights. Set from the sweep in
    benchmarks/results/decode_linear_bench.json (H200, triton 3.6; CUDA-graph replays over weights 4x the L2,
    163 configs per case), where these rules land within 6% of each case's best config:

    - one row, bf16/fp16 or fp8 weights: the FMA path, 4 warps, two tiles per loop step (unroll 2), no split.
      Wide layers (N >= 4096: qkv 6144, gate/up 5632, logits 32000) take 8 x 512 tiles in bf16 (7.95 / 8.27 /
      30.6 us; best 7.44 / 7.86 / 30.6) and 16 x 512 in fp8 (5.69 / 5.62 / 20.2 us; best 5.69 / 5.62 / 19.3);
      narrow ones (N = 2048: out-proj, down) 4 x 1024 tiles: bf16 4.29 / 9.04 us (best 4.29 / 8.82), fp8
      3.49 / 5.79 us (best 3.49 / 5.74). Fused gate/up: 8 x 512 bf16 (12.7 us, the best: 88% of copy
      bandwidth) and 4 x 512 fp8 (8.67 us, the best). Split-K won nothing at one row on these shapes: it is
      kept only for grids under one wave (132 programs), where loads in flight run short;
    - one row, fp32 weights (not swept): 8192 fp32 accumulators per program, BLOCK_K = 1 KiB of a row;
    - more rows: tl.dot with x padded to 16 rows and 32 x 256 tiles (num_stages 4 bf16, 3 fp8; fp8 gate/up
      32 x 128: the two upcast 32 x 256 fp8 tiles spill), split-K only for K > 4096 (down-proj: split 8 took
      10.4 us at M=16 against 11.2 without; out-proj at K=2048 was fastest unsplit, 6.2 against 6.9 us).
    """
    element_bytes = weight_dtype.itemsize
    weights = 2 if gate_up else 1
    unroll = 1
    if rows <= 1:
        use_dot = False
        if element_bytes <= 2:
            fp8 = element_bytes == 1
            if gate_up:
                block_n, block_k = (4, 512) if fp8 else (8, 512)
            elif n >= 4096:
                block_n, block_k = (16, 512) if fp8 else (8, 512)
            else:
                block_n, block_k = 4, 1024
            block_n = min(block_n, _pow2_at_least(n, 1))
            block_k = min(block_k, _pow2_at_least(k, 16))
            unroll = 2 if k > block_k else 1
        else:
            block_k = min(1024 // element_bytes, _pow2_at_least(k, 16))
            block_n = min(8192 // weights // block_k, 64, _pow2_at_least(n, 1))
        split_from = 132
    else:
        use_dot = True
        block_n = 32
        block_k = 128 if (gate_up and element_bytes == 1) else 256
        block_k = min(_pow2_at_least(block_k, 16), _pow2_at_least(k, 16))
        if element_bytes == 4:
            block_k = min(block_k, 64)  # fp32 ieee dot runs on FMA units: keep the [16, BLOCK_N, BLOCK_K] work small
        split_from = 264 if k > 4096 else 0
    programs = triton.cdiv(n, block_n)
    k_steps = triton.cdiv(k, block_k * unroll)
    split_k = 1
    while programs * split_k < split_from and k_steps // (split_k * 2) >= 2 and split_k < 8:
        split_k *= 2
    # num_stages: Triton pipelines (cp.async) only the tl.dot path's loads; for the FMA path it changes nothing
    # (sm_90 PTX from triton 3.9 has no cp.async at 1, 2 or 3), so 1 there; 4 for bf16 tl.dot (9.37 against
    # 10.67 us for the M=16 qkv), 3 for fp8 and fp32.
    stages = (4 if element_bytes == 2 else 3) if use_dot else 1
    return DecodeLinearConfig(block_n, block_k, split_k, num_warps=4, num_stages=stages, use_dot=use_dot, unroll=unroll)


@triton.jit
def _load_tiles(
    x_rows,
    w_rows,
    w2_rows,
    row_mask,
    k0,
    k_end,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    MAY_BE_PAST_END: tl.constexpr,
    GATE_UP: tl.constexpr,
):
    """x [BLOCK_M, BLOCK_K] and weight tiles [BLOCK_N, BLOCK_K] at K offset k0; zeros past k_end."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if EVEN_K:
        # K is a multiple of BLOCK_K, so a tile is wholly in range or wholly past the end: at most a scalar
        # mask, constant along K, which keeps the 16-byte vector loads that a per-element mask would split.
        if MAY_BE_PAST_END:
            in_range = (k0 + tl.zeros([1, BLOCK_K], dtype=tl.int32)) < k_end  # a splat: constant along K
            x = tl.load(x_rows + offs_k[None, :], mask=row_mask & in_range, other=0.0)
            w = tl.load(w_rows + offs_k[None, :], mask=in_range, other=0.0, eviction_policy="evict_first")
            w2 = w
            if GATE_UP:
                w2 = tl.load(w2_rows + offs_k[None, :], mask=in_range, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(x_rows + offs_k[None, :], mask=row_mask, other=0.0)
            w = tl.load(w_rows + offs_k[None, :], eviction_policy="evict_first")
            w2 = w
            if GATE_UP:
                w2 = tl.load(w2_rows + offs_k[None, :], eviction_policy="evict_first")
    else:
        k_mask = offs_k[None, :] < k_end
        x = tl.load(x_rows + offs_k[None, :], mask=row_mask & k_mask, other=0.0)
        w = tl.load(w_rows + offs_k[None, :], mask=k_mask, other=0.0, eviction_policy="evict_first")
        w2 = w
        if GATE_UP:
            w2 = tl.load(w2_rows + offs_k[None, :], mask=k_mask, other=0.0, eviction_policy="evict_first")
    return x, w, w2


@triton.jit
def _accumulate(
    acc,
    acc2,
    x,
    w,
    w2,
    USE_DOT: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    GATE_UP: tl.constexpr,
):
    """acc += x @ w.T (tl.dot, acc [BLOCK_M, BLOCK_N]) or w * x (FMA, acc [BLOCK_N, BLOCK_K]); acc2 with w2."""
    if USE_DOT:
        if UPCAST_DOT:
            x = x.to(tl.float32)
            acc = tl.dot(x, tl.trans(w.to(tl.float32)), acc, input_precision=DOT_PRECISION)
            if GATE_UP:
                acc2 = tl.dot(x, tl.trans(w2.to(tl.float32)), acc2, input_precision=DOT_PRECISION)
        else:
            acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision=DOT_PRECISION)
            if GATE_UP:
                acc2 = tl.dot(x, tl.trans(w2.to(x.dtype)), acc2, input_precision=DOT_PRECISION)
    else:
        x = x.to(tl.float32)
        acc += w.to(tl.float32) * x
        if GATE_UP:
            acc2 += w2.to(tl.float32) * x
    return acc, acc2


# rows only masks x loads and stores: not specializing it (on == 1 or % 16) lets 1..16 rows share one binary.
@triton.jit(do_not_specialize=["rows"])
def _decode_linear_kernel(
    x_ptr,
    w_ptr,
    w2_ptr,
    scale_ptr,
    scale2_ptr,
    bias_ptr,
    out_ptr,
    rows,
    n,
    k,
    k_per_split,
    x_row_stride,
    w_row_stride,
    w2_row_stride,
    out_split_stride,
    out_half_stride,
    out_row_stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UNROLL: tl.constexpr,
    USE_DOT: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATE_UP: tl.constexpr,
    WRITE_PARTIAL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Columns past n load the last weight row instead (never stored): weight loads need no mask.
    offs_n_load = tl.minimum(offs_n, n - 1).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, k)

    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * x_row_stride
    row_mask = offs_m[:, None] < rows
    w_rows = w_ptr + offs_n_load[:, None] * w_row_stride
    w2_rows = w2_ptr + offs_n_load[:, None] * w2_row_stride
    if USE_DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)

    # UNROLL = 2 issues the loads of two K-tiles before their math: twice the bytes in flight per program
    # with the same accumulator registers (Triton's pipeliner does not pipeline the FMA path's loads).
    for k0 in range(k_start, k_end, BLOCK_K * UNROLL):
        x, w, w2 = _load_tiles(x_rows, w_rows, w2_rows, row_mask, k0, k_end, BLOCK_K, EVEN_K, False, GATE_UP)
        if UNROLL == 2:
            x_b, w_b, w2_b = _load_tiles(
                x_rows, w_rows, w2_rows, row_mask, k0 + BLOCK_K, k_end, BLOCK_K, EVEN_K, True, GATE_UP
            )
            acc, acc2 = _accumulate(acc, acc2, x, w, w2, USE_DOT, UPCAST_DOT, DOT_PRECISION, GATE_UP)
            acc, acc2 = _accumulate(acc, acc2, x_b, w_b, w2_b, USE_DOT, UPCAST_DOT, DOT_PRECISION, GATE_UP)
        else:
            acc, acc2 = _accumulate(acc, acc2, x, w, w2, USE_DOT, UPCAST_DOT, DOT_PRECISION, GATE_UP)

    if USE_DOT:
        out = acc
        out2 = acc2
    else:
        out = tl.sum(acc, axis=1)[None, :]
        out2 = tl.sum(acc2, axis=1)[None, :]
    if HAS_SCALE:
        out = out * tl.load(scale_ptr + offs_n_load)[None, :]
        if GATE_UP:
            out2 = out2 * tl.load(scale2_ptr + offs_n_load)[None, :]

    out_mask = row_mask & (offs_n[None, :] < n)
    out_ptrs = out_ptr + offs_m[:, None] * out_row_stride + offs_n[None, :]
    if WRITE_PARTIAL:
        out_ptrs += pid_k * out_split_stride
        tl.store(out_ptrs, out, mask=out_mask)
        if GATE_UP:
            tl.store(out_ptrs + out_half_stride, out2, mask=out_mask)
    else:
        if HAS_BIAS:
            out += tl.load(bias_ptr + offs_n_load).to(tl.float32)[None, :]
        if GATE_UP:
            out = out * tl.sigmoid(out) * out2
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _split_k_reduce_kernel(
    ws_ptr,
    bias_ptr,
    out_ptr,
    n,
    n_splits,
    ws_split_stride,
    ws_half_stride,
    ws_row_stride,
    out_row_stride,
    BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATE_UP: tl.constexpr,
):
    row = tl.program_id(1)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs_n < n
    ws_row = ws_ptr + row * ws_row_stride + offs_n
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    total2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    # A fixed summation order (split 0, 1, ...): the same bits on every run.
    for split in range(0, n_splits):
        total += tl.load(ws_row + split * ws_split_stride, mask=mask, other=0.0)
        if GATE_UP:
            total2 += tl.load(ws_row + split * ws_split_stride + ws_half_stride, mask=mask, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs_n, mask=mask, other=0.0).to(tl.float32)
    if GATE_UP:
        total = total * tl.sigmoid(total) * total2
    tl.store(out_ptr + row * out_row_stride + offs_n, total.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(
    x_rows: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    config: DecodeLinearConfig,
    weight2: torch.Tensor | None = None,
    scale2: torch.Tensor | None = None,
) -> torch.Tensor:
    """y [rows, N] for validated inputs (x_rows [rows, K] with unit last stride); ``weight2``: the SwiGLU up weight.

    Host logic depends on shapes, strides and dtypes only, so the call is CUDA-graph capturable.
    """
    rows, k = x_rows.shape
    n = weight.shape[0]
    gate_up = weight2 is not None
    y = torch.empty((rows, n), dtype=x_rows.dtype, device=x_rows.device)
    if rows == 0 or n == 0:
        return y
    if config.use_dot and config.block_n < 16:
        raise ValueError(f"block_n must be >= 16 with use_dot (tl.dot's smallest N), got {config.block_n}")
    if rows > 1 and not config.use_dot:
        raise ValueError(f"{rows} rows need use_dot=True (the FMA path handles one row)")
    block_k = config.block_k
    if config.unroll not in (1, 2):
        raise ValueError(f"unroll must be 1 or 2, got {config.unroll}")
    step_k = block_k * config.unroll  # K per loop iteration; every K slice but the last is a multiple of it
    k_per_split = triton.cdiv(triton.cdiv(k, step_k), max(1, config.split_k)) * step_k
    n_splits = triton.cdiv(k, k_per_split)
    block_m = 16 if config.use_dot else 1
    # On CPU (the interpreter) a bf16 tl.dot multiplies raw uint16 storage (see the module docstring).
    upcast_dot = x_rows.device.type == "cpu" and x_rows.dtype == torch.bfloat16
    precision = "ieee" if (x_rows.dtype == torch.float32 or upcast_dot) else "tf32"  # "tf32" is ignored for 16-bit
    if n_splits > 1:
        halves = 2 if gate_up else 1
        out = torch.empty((n_splits, halves, rows, n), dtype=torch.float32, device=x_rows.device)
        out_strides = (out.stride(0), out.stride(1), out.stride(2))
    else:
        out = y
        out_strides = (0, 0, y.stride(0))
    grid = (triton.cdiv(n, config.block_n), n_splits)
    _decode_linear_kernel[grid](
        x_rows,
        weight,
        weight2 if gate_up else weight,
        scale if scale is not None else weight,
        scale2 if scale2 is not None else weight,
        bias if bias is not None else weight,
        out,
        rows,
        n,
        k,
        k_per_split,
        x_rows.stride(0),
        weight.stride(0),
        (weight2 if gate_up else weight).stride(0),
        *out_strides,
        BLOCK_M=block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=block_k,
        UNROLL=config.unroll,
        USE_DOT=config.use_dot,
        UPCAST_DOT=upcast_dot,
        DOT_PRECISION=precision,
        EVEN_K=k % block_k == 0,
        HAS_SCALE=scale is not None,
        HAS_BIAS=bias is not None,
        GATE_UP=gate_up,
        WRITE_PARTIAL=n_splits > 1,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if n_splits > 1:
        _split_k_reduce_kernel[(triton.cdiv(n, REDUCE_BLOCK_N), rows)](
            out,
            bias if bias is not None else out,
            y,
            n,
            n_splits,
            out.stride(0),
            out.stride(1),
            out.stride(2),
            y.stride(0),
            BLOCK_N=REDUCE_BLOCK_N,
            HAS_BIAS=bias is not None,
            GATE_UP=gate_up,
            num_warps=4,
        )
    return y


def _check_x(x: object) -> torch.Tensor:
    """x viewed as [rows, K] with unit last stride (copied only if needed: x is at most 16 rows)."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"x has dtype {x.dtype}; supported: float32, float16, bfloat16")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension K, got shape {tuple(x.shape)}")
    rows = x.numel() // x.shape[-1]
    if rows > MAX_ROWS:
        raise ValueError(
            f"x has {rows} rows (product of leading dims of {tuple(x.shape)}); decode kernels take at most "
            f"{MAX_ROWS}: use torch.nn.functional.linear"
        )
    x_rows = x.reshape(rows, x.shape[-1])
    return x_rows if x_rows.stride(-1) == 1 else x_rows.contiguous()


def _check_weight(
    name: str, weight: object, scale: object, scale_name: str, x: torch.Tensor, n: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Validate a [N, K] weight (x's dtype, or float8_e4m3fn with a float32 [N] scale); returns (weight, scale)."""
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(weight).__name__}")
    k = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"{name} must have shape (N, {k}) to match x's last dimension, got {tuple(weight.shape)}")
    if n is not None and weight.shape[0] != n:
        raise ValueError(f"{name} has {weight.shape[0]} rows, expected {n}")
    if weight.device != x.device:
        raise ValueError(f"{name} is on {weight.device}, x is on {x.device}")
    if weight.dtype == FP8_DTYPE:
        if scale is None:
            raise ValueError(f"a float8_e4m3fn {name} needs {scale_name}: float32 of shape ({weight.shape[0]},)")
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
            raise ValueError(f"{scale_name} must be a float32 tensor, got {getattr(scale, 'dtype', type(scale))}")
        if scale.shape != (weight.shape[0],):
            raise ValueError(f"{scale_name} must have shape ({weight.shape[0]},), got {tuple(scale.shape)}")
        if scale.device != x.device:
            raise ValueError(f"{scale_name} is on {scale.device}, x is on {x.device}")
        scale = scale.contiguous()
    elif weight.dtype != x.dtype:
        raise ValueError(f"{name} has dtype {weight.dtype}; expected x's dtype {x.dtype} or torch.float8_e4m3fn")
    elif scale is not None:
        raise ValueError(f"{scale_name} is only for float8_e4m3fn weights; {name} is {weight.dtype}")
    # A per-call copy of a weight would double the traffic this kernel exists to save: refuse instead.
    if weight.stride(1) != 1 and k > 1:
        raise ValueError(f"{name} must be contiguous along K (stride 1 in dim 1), got strides {weight.stride()}")
    return weight, scale


def _check_bias(bias: object, n: int, x: torch.Tensor) -> torch.Tensor | None:
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor) or bias.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"bias must be a float32, float16 or bfloat16 tensor, got {getattr(bias, 'dtype', bias)}")
    if bias.shape != (n,):
        raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    if bias.device != x.device:
        raise ValueError(f"bias is on {bias.device}, x is on {x.device}")
    return bias.contiguous()


def decode_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` for x [..., K] with at most ``MAX_ROWS`` rows (product of the leading dims).

    ``weight`` [N, K] has x's dtype (float32, float16 or bfloat16), or is ``torch.float8_e4m3fn`` with
    ``scale`` [N] float32 per output row (``y = x @ (weight.float() * scale[:, None]).T``, e.g. from
    ``quantize_fp8_rows``). fp32 accumulation; ``bias`` [N] is added in fp32; returns [..., N] in x's dtype.
    Raises ValueError (one line) on too many rows, mismatched K, bad dtypes, shapes or devices.
    """
    x_rows = _check_x(x)
    weight, scale = _check_weight("weight", weight, scale, "scale", x)
    bias = _check_bias(bias, weight.shape[0], x)
    rows, k = x_rows.shape
    config = config_for(rows, weight.shape[0], k, weight.dtype)
    return _launch(x_rows, weight, scale, bias, config).reshape(*x.shape[:-1], weight.shape[0])


def decode_gate_up_swiglu(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    scale_gate: torch.Tensor | None = None,
    scale_up: torch.Tensor | None = None,
) -> torch.Tensor:
    """``silu(x @ w_gate.T) * (x @ w_up.T)`` in one kernel: the gate/up half of a SwiGLU MLP at decode shapes.

    Both weights ([N, K], the same dtype rules as ``decode_linear``; fp8 ones each with their own scale)
    are streamed by the same programs; silu runs in fp32 on the fp32 sums and the product is rounded once
    to x's dtype. Returns [..., N]. Raises ValueError (one line) on bad input.
    """
    x_rows = _check_x(x)
    w_gate, scale_gate = _check_weight("w_gate", w_gate, scale_gate, "scale_gate", x)
    w_up, scale_up = _check_weight("w_up", w_up, scale_up, "scale_up", x, n=w_gate.shape[0])
    if w_up.dtype != w_gate.dtype:
        raise ValueError(f"w_up has dtype {w_up.dtype}, w_gate has {w_gate.dtype}")
    rows, k = x_rows.shape
    n = w_gate.shape[0]
    config = config_for(rows, n, k, w_gate.dtype, gate_up=True)
    y = _launch(x_rows, w_gate, scale_gate, None, config, weight2=w_up, scale2=scale_up)
    return y.reshape(*x.shape[:-1], n)


def quantize_fp8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-row dynamic FP8 scaling of a [N, K] weight: returns (float8_e4m3fn [N, K], float32 scale [N]).

    ``scale = amax(|row|) / 448`` (448: e4m3's largest finite value), with amax clamped up to
    ``FP8_MIN_AMAX`` so an all-zero row divides by a tiny number instead of 0; ``w_fp8 = w / scale``,
    clamped to +-448 against rounding just past it. ``w_fp8.float() * scale[:, None]`` approximates
    ``weight`` to e4m3's 3-bit mantissa (relative error <= 2**-4 per element, for values not subnormal).
    """
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D tensor, got {getattr(weight, 'shape', type(weight).__name__)}")
    if not weight.is_floating_point() or weight.dtype == FP8_DTYPE:
        raise ValueError(f"weight must be float32, float16 or bfloat16 to quantize, got {weight.dtype}")
    w = weight.float()
    amax = w.abs().amax(dim=1) if w.shape[1] > 0 else torch.zeros(w.shape[0], device=w.device)
    scale = amax.clamp(min=FP8_MIN_AMAX) / FP8_E4M3_MAX
    w_fp8 = (w / scale[:, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)
    return w_fp8, scale.contiguous()


def decode_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The same in plain PyTorch and float64 (returns float64 [..., N]): the yardstick for the kernel's error."""
    w = weight.double()
    if scale is not None:
        w = w * scale.double()[:, None]
    y = x.double() @ w.T
    return y + bias.double() if bias is not None else y


def decode_gate_up_swiglu_reference(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    scale_gate: torch.Tensor | None = None,
    scale_up: torch.Tensor | None = None,
) -> torch.Tensor:
    """``silu(x @ w_gate.T) * (x @ w_up.T)`` in float64 (returns float64 [..., N])."""
    gate = decode_linear_reference(x, w_gate, scale_gate)
    return torch.nn.functional.silu(gate) * decode_linear_reference(x, w_up, scale_up)

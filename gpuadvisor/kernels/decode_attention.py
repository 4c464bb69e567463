"""Decode attention over a static KV cache, split over the cache (flash-decoding), as two Triton kernels.

For queries ``q`` [B, H, S, hd] (S new tokens, S <= 16), caches ``k_cache``/``v_cache`` [B, KVH, T, hd] and the
queries' cache slots ``input_pos`` [S]::

    out[b, s, h*hd:(h+1)*hd] = softmax(scale * q[b, h, s] @ k_cache[b, g, :p+1]^T) @ v_cache[b, g, :p+1]
    with p = input_pos[s], g = h // (H / KVH)

which is what ``examples/llama_decode.py`` computes with ``F.scaled_dot_product_attention`` and the causal
mask ``causal_mask[None, None, input_pos]``, followed by ``y.transpose(1, 2).reshape(B, S, H * hd)``: the
output comes in that [B, S, H * hd] layout, ready for the output projection, so no transpose kernel follows.
Grouped-query attention: a cache with KVH heads, KVH dividing H (transformers' Qwen2, Llama with fewer KV
heads), is read in place by the H / KVH query heads of each group (head h reads cache head h // (H / KVH), as
``repeat_kv`` does), so the repeated keys and values are never materialized; KVH = H is plain multi-head.
Scores, softmax and the weighted sum run in fp32 whatever the cache dtype (exponentials as exp2 of
log2(e)-scaled scores); the output is rounded once to q's dtype. Slots after ``input_pos[s]`` are never read:
each program's loop stops at the query's position, so a chunk wholly past it loads nothing, and the eager
path's read of the whole masked cache (all T slots at every step) goes away.

Why split: at batch 1 a decoder has B * H * S = 16 (query, head) pairs, and one program each would occupy 16
of the H200's 132 SMs while each streams T * hd * 2 values. So kernel 1 gives each program a chunk of
``chunk`` slots of one (b, h, s): it keeps a running max and sum of its exponentials (online softmax) and
writes its partial max, sum and unnormalized [hd] output in fp32. Kernel 2, one program per (b, h, s),
merges the partials of the chunks that hold any slot <= input_pos[s] (rescaling each by exp2(m_c - m)) and
divides. The partials are a few KiB, allocated per call with ``torch.empty`` (inside a CUDA graph they come
from the graph's pool).

Chunk size: :func:`chunk_for` is a pure function of (B, H, S, T): the smallest power of two in [16, 512]
that keeps the grid at about ``TARGET_PROGRAMS`` programs or fewer. ``TARGET_PROGRAMS`` = 512 (about four
programs per SM of the H200's 132) gives B=1, H=16, S=1, T=1024 chunk 32 (32 chunks, 512 programs, 16 KiB
of K and V each in bf16 at hd=128), with 2 warps per program: in ``benchmarks/decode_attention_bench.py``'s
sweep on the H200 (benchmarks/results/decode_attention_bench.json, 8 layers replayed in one CUDA graph)
that took 9.2 us per layer at position 1023 and 7.4 at 512, against 12.1 / 9.8 for chunk 64 with 4 warps,
the first choice; chunk 16 with 1 warp was 10.2 / 7.3. Within a chunk the program walks tiles of
``tile_for(hd)`` slots (32 at hd=128), so a large chunk does not spill registers.

No host syncs: positions are read on the device, so the call can be captured in a CUDA graph. Positions
must be in [0, T) (not checked: that would need a sync); a query whose position is negative attends to
nothing and gets NaN (0/0), as a fully masked row does in the eager softmax; one past the end is clamped to
T - 1.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpuadvisor.kernels.rope_cache import SUPPORTED_DTYPES, check_cache, check_positions

__all__ = ["decode_attention", "decode_attention_reference", "chunk_for", "tile_for", "kv_heads_of"]

# Programs per launch the chunk size aims at: about 4 per SM of the H200's 132 (module docstring: measured).
TARGET_PROGRAMS = 512
MIN_CHUNK = 16
MAX_CHUNK = 512
# Warps per split program: 2 (a [32, 128] fp32 tile in 64 registers per thread) beat 4 and 8 at chunk 32 in
# the H200 sweep (9.3 / 11.1 / 12.6 us per layer at position 1023).
NUM_WARPS = 2
# Partials merged per step of kernel 2's loop (at T=1024 and chunk 32 there are 32: two steps).
COMBINE_BLOCK = 16
LOG2_E = 1.4426950408889634


def chunk_for(batch: int, n_heads: int, seq: int, n_slots: int) -> int:
    """Cache slots per split program: the smallest power of two in [MIN_CHUNK, MAX_CHUNK] whose grid
    (``batch * n_heads * seq * ceil(n_slots / chunk)`` programs) is at most TARGET_PROGRAMS."""
    rows = batch * n_heads * seq
    chunk = MIN_CHUNK
    while chunk < MAX_CHUNK and rows * triton.cdiv(n_slots, chunk) > TARGET_PROGRAMS:
        chunk *= 2
    return chunk


def tile_for(head_dim: int, chunk: int) -> int:
    """Slots per loop step inside a chunk: 4096 fp32 values per [tile, hd] tile, at least 16, at most chunk."""
    block_d = triton.next_power_of_2(head_dim)
    return max(16, min(chunk, 4096 // block_d))


@triton.jit
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_acc_ptr,
    q_stride_b,
    q_stride_h,
    q_stride_s,
    k_stride_b,
    k_stride_h,
    k_stride_t,
    v_stride_b,
    v_stride_h,
    v_stride_t,
    n_slots,
    n_chunks,
    qk_scale_log2,
    SEQ: tl.constexpr,
    N_HEADS: tl.constexpr,
    GROUPS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
    TILE: tl.constexpr,
):
    chunk = tl.program_id(0)
    row = tl.program_id(1)  # (b * N_HEADS + h) * SEQ + s
    s = row % SEQ
    h = (row // SEQ) % N_HEADS
    b = (row // (SEQ * N_HEADS)).to(tl.int64)
    pos = tl.load(pos_ptr + s).to(tl.int32)
    end = tl.minimum(pos + 1, n_slots)  # one past the last slot this query attends to
    start = chunk * CHUNK
    stop = tl.minimum(start + CHUNK, end)

    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q = tl.load(q_ptr + b * q_stride_b + h * q_stride_h + s * q_stride_s + d, mask=d_mask, other=0.0)
    q = q.to(tl.float32) * qk_scale_log2  # scores come out in log2 units: exp2 below
    kv = h // GROUPS  # the cache head of this query head's group (grouped-query attention; GROUPS = 1: h)
    k_base = k_ptr + b * k_stride_b + kv * k_stride_h
    v_base = v_ptr + b * v_stride_b + kv * v_stride_h

    running_max = float("-inf")
    running_sum = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for t0 in range(start, stop, TILE):  # no iterations for a chunk wholly past the position
        t = t0 + tl.arange(0, TILE)
        t_mask = t < stop
        tile_mask = t_mask[:, None] & d_mask[None, :]
        t64 = t.to(tl.int64)
        k = tl.load(k_base + t64[:, None] * k_stride_t + d[None, :], mask=tile_mask, other=0.0).to(tl.float32)
        scores = tl.sum(k * q[None, :], axis=1)
        scores = tl.where(t_mask, scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=0))
        rescale = tl.exp2(running_max - new_max)
        p = tl.exp2(scores - new_max)
        v = tl.load(v_base + t64[:, None] * v_stride_t + d[None, :], mask=tile_mask, other=0.0).to(tl.float32)
        acc = acc * rescale + tl.sum(p[:, None] * v, axis=0)
        running_sum = running_sum * rescale + tl.sum(p, axis=0)
        running_max = new_max

    part = row.to(tl.int64) * n_chunks + chunk
    tl.store(part_max_ptr + part, running_max)
    tl.store(part_sum_ptr + part, running_sum)
    tl.store(part_acc_ptr + part * BLOCK_D + d, acc)


@triton.jit
def _combine_kernel(
    pos_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_acc_ptr,
    out_ptr,
    n_slots,
    n_chunks,
    SEQ: tl.constexpr,
    N_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0)  # (b * N_HEADS + h) * SEQ + s
    s = row % SEQ
    h = (row // SEQ) % N_HEADS
    b = (row // (SEQ * N_HEADS)).to(tl.int64)
    pos = tl.minimum(tl.load(pos_ptr + s).to(tl.int32), n_slots - 1)
    # Chunks holding any slot <= pos; the rest wrote nothing worth reading. (pos >= 0 keeps // off negatives,
    # where the interpreter's numpy floors and compiled Triton truncates.)
    n_used = tl.where(pos >= 0, pos // CHUNK + 1, 0)
    n_used = tl.minimum(n_used, n_chunks)

    d = tl.arange(0, BLOCK_D)
    base = row.to(tl.int64) * n_chunks
    running_max = float("-inf")
    running_sum = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for c0 in range(0, n_used, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        c_mask = c < n_used
        part = base + c
        part_max = tl.load(part_max_ptr + part, mask=c_mask, other=float("-inf"))
        part_sum = tl.load(part_sum_ptr + part, mask=c_mask, other=0.0)
        part_acc = tl.load(part_acc_ptr + part[:, None] * BLOCK_D + d[None, :], mask=c_mask[:, None], other=0.0)
        new_max = tl.maximum(running_max, tl.max(part_max, axis=0))
        rescale = tl.exp2(running_max - new_max)
        weight = tl.exp2(part_max - new_max)  # every used chunk has >= 1 slot, so a finite max
        acc = acc * rescale + tl.sum(weight[:, None] * part_acc, axis=0)
        running_sum = running_sum * rescale + tl.sum(weight * part_sum, axis=0)
        running_max = new_max

    out = acc / running_sum
    out_row = out_ptr + (b * SEQ + s) * (N_HEADS * HEAD_DIM) + h * HEAD_DIM
    tl.store(out_row + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def kv_heads_of(k_cache: object, n_heads: int) -> int:
    """The cache's head count when it divides ``n_heads`` (grouped-query attention), else ``n_heads`` (so a bad
    cache is reported against the multi-head shape)."""
    if isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4 and 0 < k_cache.shape[1] <= n_heads:
        if n_heads % k_cache.shape[1] == 0:
            return int(k_cache.shape[1])
    return n_heads


def _check_inputs(q, k_cache, v_cache, input_pos, scale) -> float:
    """Validate shapes, dtypes and devices on the host (never values); return the softmax scale."""
    if not isinstance(q, torch.Tensor):
        raise ValueError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q has dtype {q.dtype}; supported: float32, float16, bfloat16")
    if q.dim() != 4 or 0 in q.shape:
        raise ValueError(f"q must have a non-empty shape (B, H, S, head_dim), got {tuple(q.shape)}")
    if q.stride(-1) != 1:
        raise ValueError(f"q must have a unit last-dim stride, got strides {q.stride()}")
    batch, n_heads, seq, head_dim = q.shape
    kv_heads = kv_heads_of(k_cache, n_heads)
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_cache(name, cache, (batch, kv_heads, head_dim), q, "q")
        if cache.shape[2] == 0:
            raise ValueError(f"{name} has no slots (T = 0)")
    if v_cache.shape[2] != k_cache.shape[2]:
        raise ValueError(f"v_cache has {v_cache.shape[2]} slots, k_cache has {k_cache.shape[2]}")
    check_positions(input_pos, seq, q.device)
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")
    return float(scale)


def _launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    input_pos: torch.Tensor,
    scale: float,
    chunk: int | None = None,
    num_warps: int = NUM_WARPS,
) -> torch.Tensor:
    batch, n_heads, seq, head_dim = q.shape
    n_slots = k_cache.shape[2]
    chunk = chunk or chunk_for(batch, n_heads, seq, n_slots)
    n_chunks = triton.cdiv(n_slots, chunk)
    block_d = triton.next_power_of_2(head_dim)
    rows = batch * n_heads * seq
    part_max = torch.empty((rows, n_chunks), dtype=torch.float32, device=q.device)
    part_sum = torch.empty((rows, n_chunks), dtype=torch.float32, device=q.device)
    part_acc = torch.empty((rows, n_chunks, block_d), dtype=torch.float32, device=q.device)
    out = torch.empty((batch, seq, n_heads * head_dim), dtype=q.dtype, device=q.device)
    _split_kernel[(n_chunks, rows)](
        q,
        k_cache,
        v_cache,
        input_pos,
        part_max,
        part_sum,
        part_acc,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        n_slots,
        n_chunks,
        scale * LOG2_E,
        SEQ=seq,
        N_HEADS=n_heads,
        GROUPS=n_heads // k_cache.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        CHUNK=chunk,
        TILE=tile_for(head_dim, chunk),
        num_warps=num_warps,
    )
    _combine_kernel[(rows,)](
        input_pos,
        part_max,
        part_sum,
        part_acc,
        out,
        n_slots,
        n_chunks,
        SEQ=seq,
        N_HEADS=n_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        CHUNK=chunk,
        BLOCK_C=COMBINE_BLOCK,
        num_warps=1 if block_d <= 128 else 2,  # a [16, 128] fp32 tile: 64 values per thread of one warp
    )
    return out


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    input_pos: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of ``q`` [B, H, S, hd] over cache slots ``t <= input_pos[s]``; returns [B, S, H * hd] in q's dtype.

    ``k_cache``/``v_cache``: [B, KVH, T, hd] in q's dtype (float32/float16/bfloat16), unit last stride, with
    KVH dividing H (KVH < H: grouped-query attention, query head h reads cache head h // (H / KVH));
    ``input_pos``: [S] int64/int32 on q's device, each in [0, T) (not checked on the host); ``scale``: the
    softmax scale, 1/sqrt(hd) by default. Raises ValueError on a bad shape, dtype, device or scale.
    Two launches, no host sync: CUDA-graph capturable.
    """
    scale = _check_inputs(q, k_cache, v_cache, input_pos, scale)
    return _launch(q, k_cache, v_cache, input_pos, scale)


def decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    input_pos: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """The same in float64 PyTorch (returns float64 [B, S, H * hd]): masked softmax over all T slots (a grouped
    cache's heads repeated to H first, as transformers' ``repeat_kv`` does)."""
    batch, n_heads, seq, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    groups = n_heads // k_cache.shape[1]
    k_cache, v_cache = (cache.repeat_interleave(groups, dim=1) for cache in (k_cache, v_cache))
    scores = torch.einsum("bhsd,bhtd->bhst", q.double(), k_cache.double()) * scale
    slots = torch.arange(k_cache.shape[2], device=q.device)
    allowed = slots[None, :] <= input_pos.long()[:, None]  # [S, T]: the causal mask's rows at input_pos
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.einsum("bhst,bhtd->bhsd", torch.softmax(scores, dim=-1), v_cache.double())
    return out.transpose(1, 2).reshape(batch, seq, n_heads * head_dim)

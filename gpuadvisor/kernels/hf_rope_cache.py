"""transformers-style rotary embedding of q and k plus the static-cache write of one decode step, one Triton kernel.

For the fused projection ``qkv = [q | k | v]`` of shape [B, S, (H + 2 * KVH) * hd] (q with H heads, k and v
with KVH heads each: grouped-query attention when KVH < H), the rotary rows ``cos``/``sin`` of shape
[B or 1, S, hd] (what a transformers model passes its attention layers as ``position_embeddings``) and a
static cache layer's write counter ``start`` (transformers' ``StaticLayer.cumulative_length``, a 0-dim int
tensor on the device)::

    q, k, v = qkv.split([H * hd, KVH * hd, KVH * hd], dim=-1)    # viewed as [B, S, heads, hd]
    q = q * cos + rotate_half(q) * sin                            # rotate_half(x) = cat(-x[hd/2:], x[:hd/2])
    k = k * cos + rotate_half(k) * sin
    k_cache[:, :, start + s] = k^T;  v_cache[:, :, start + s] = v^T      # in place, [B, KVH, T, hd]
    return q^T ([B, H, S, hd], contiguous), positions = start + arange(S) (int64 [S])

which is what transformers' ``apply_rotary_pos_emb`` followed by ``StaticLayer.update`` computes (rotary
pairs are i and i + hd/2, not interleaved). The counter is read on the device and never advanced here (the
caller advances it, as the library does): no ``.item()``, so the call can be captured in a CUDA graph. The
positions come out for the attention kernel, so no arange/add kernels run for them.

Rounding: the rotation is computed in fp32 from the loaded values and rounded once to qkv's dtype. In
float32 that is bit-exact with the library's eager code (each product rounded to fp32, then the sum: the
kernel is launched with ``enable_fp_fusion=False`` so no multiply-add is contracted into an FMA, as in
rope_cache.py). In bf16/fp16 the library rounds each product and the sum to the model dtype; one rounding
is more accurate, and differs from it by about one ulp.

One program per (batch, position, head) over H + KVH heads: a q head is rotated into the output, a k head
is rotated into the cache together with its v head's copy. Slots outside [0, T) are not written (masked),
where ``index_copy_`` would raise a device-side assert; a counter that has run past the cache is the
caller's bug, as it is in the library.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gpuadvisor.kernels.rope_cache import SUPPORTED_DTYPES, check_caches

__all__ = ["hf_rope_kv_update", "hf_rope_kv_update_reference"]


@triton.jit
def _hf_rope_kv_update_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    start_ptr,
    k_cache_ptr,
    v_cache_ptr,
    q_out_ptr,
    pos_out_ptr,
    qkv_stride_b,
    qkv_stride_s,
    cos_stride_b,
    cos_stride_s,
    sin_stride_b,
    sin_stride_s,
    k_stride_b,
    k_stride_h,
    k_stride_t,
    v_stride_b,
    v_stride_h,
    v_stride_t,
    n_slots,
    SEQ: tl.constexpr,
    N_HEADS: tl.constexpr,
    N_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    bs = tl.program_id(0)
    head = tl.program_id(1)  # [0, N_HEADS): a q head; [N_HEADS, N_HEADS + N_KV_HEADS): a k (and v) head
    b = (bs // SEQ).to(tl.int64)
    s = bs % SEQ
    pos = tl.load(start_ptr).to(tl.int64) + s
    half = HEAD_DIM // 2

    i = tl.arange(0, BLOCK_HALF)
    i_mask = i < half
    cos_row = cos_ptr + b * cos_stride_b + s * cos_stride_s
    sin_row = sin_ptr + b * sin_stride_b + s * sin_stride_s
    c1 = tl.load(cos_row + i, mask=i_mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_row + half + i, mask=i_mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_row + i, mask=i_mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_row + half + i, mask=i_mask, other=0.0).to(tl.float32)

    # q heads, then k heads, then v heads, each HEAD_DIM wide: head * HEAD_DIM is this program's q or k head.
    row = qkv_ptr + b * qkv_stride_b + s * qkv_stride_s + head * HEAD_DIM
    x1 = tl.load(row + i, mask=i_mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + half + i, mask=i_mask, other=0.0).to(tl.float32)
    # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1): the same products and sums as the library.
    r1 = x1 * c1 - x2 * s1
    r2 = x2 * c2 + x1 * s2

    if head < N_HEADS:
        q_out = q_out_ptr + ((b * N_HEADS + head) * SEQ + s) * HEAD_DIM
        out_ty = q_out_ptr.dtype.element_ty
        tl.store(q_out + i, r1.to(out_ty), mask=i_mask)
        tl.store(q_out + half + i, r2.to(out_ty), mask=i_mask)
        if head == 0:
            if bs < SEQ:  # batch 0 writes the positions, once each
                tl.store(pos_out_ptr + s, pos)
    else:
        kv = head - N_HEADS
        # The slot test as a vector: a scalar bool mask broadcast into a store trips Triton's interpreter.
        slot = pos + tl.zeros([BLOCK_HALF], dtype=tl.int64)
        write = i_mask & (slot >= 0) & (slot < n_slots)
        k_slot = k_cache_ptr + b * k_stride_b + kv * k_stride_h + pos * k_stride_t
        k_ty = k_cache_ptr.dtype.element_ty
        tl.store(k_slot + i, r1.to(k_ty), mask=write)
        tl.store(k_slot + half + i, r2.to(k_ty), mask=write)
        v_row = row + N_KV_HEADS * HEAD_DIM
        v1 = tl.load(v_row + i, mask=i_mask, other=0.0)
        v2 = tl.load(v_row + half + i, mask=i_mask, other=0.0)
        v_slot = v_cache_ptr + b * v_stride_b + kv * v_stride_h + pos * v_stride_t
        v_ty = v_cache_ptr.dtype.element_ty
        tl.store(v_slot + i, v1.to(v_ty), mask=write)
        tl.store(v_slot + half + i, v2.to(v_ty), mask=write)


def _check_rotary(name: str, table: object, batch: int, seq: int, head_dim: int, like: torch.Tensor) -> None:
    if not isinstance(table, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(table).__name__}")
    if table.dim() != 3 or table.shape[0] not in (1, batch) or table.shape[1:] != (seq, head_dim):
        raise ValueError(f"{name} must have shape ({batch} or 1, {seq}, {head_dim}), got {tuple(table.shape)}")
    if table.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} has dtype {table.dtype}; supported: float32, float16, bfloat16")
    if table.device != like.device:
        raise ValueError(f"{name} is on {table.device}, qkv is on {like.device}")
    if table.stride(-1) != 1:
        raise ValueError(f"{name} must have a unit last-dim stride, got strides {table.stride()}")


def _check_inputs(qkv, cos, sin, start, k_cache, v_cache, n_heads, n_kv_heads) -> int:
    """Validate everything on the host (shapes, dtypes, devices; never values); return head_dim."""
    if not isinstance(qkv, torch.Tensor):
        raise ValueError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"qkv has dtype {qkv.dtype}; supported: float32, float16, bfloat16")
    for name, value in (("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if n_heads % n_kv_heads != 0:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
    width = n_heads + 2 * n_kv_heads
    if qkv.dim() != 3 or qkv.shape[0] == 0 or qkv.shape[1] == 0 or qkv.shape[2] % width != 0:
        raise ValueError(
            f"qkv must have shape (B, S, ({n_heads} + 2 * {n_kv_heads}) * head_dim), got {tuple(qkv.shape)}"
        )
    if qkv.stride(-1) != 1:
        raise ValueError(f"qkv must have a unit last-dim stride, got strides {qkv.stride()}")
    batch, seq, _ = qkv.shape
    head_dim = qkv.shape[2] // width
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even for rotary halves, got {head_dim}")
    _check_rotary("cos", cos, batch, seq, head_dim, qkv)
    _check_rotary("sin", sin, batch, seq, head_dim, qkv)
    if not isinstance(start, torch.Tensor):
        raise ValueError(f"start must be a torch.Tensor, got {type(start).__name__}")
    if start.dtype not in (torch.int64, torch.int32) or start.numel() != 1:
        raise ValueError(f"start must be one int64/int32 value, got dtype {start.dtype} shape {tuple(start.shape)}")
    if start.device != qkv.device:
        raise ValueError(f"start is on {start.device}, qkv is on {qkv.device}")
    check_caches(k_cache, v_cache, (batch, n_kv_heads, head_dim), qkv)
    return head_dim


def hf_rope_kv_update(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    start: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k (rotate_half style), write k and v into the caches at slots ``start + s`` (in place).

    ``qkv``: [B, S, (n_heads + 2 * n_kv_heads) * hd] (float32/float16/bfloat16, unit last stride);
    ``cos``/``sin``: [B or 1, S, hd], unit last stride (any of those dtypes: upcast exactly); ``start``: one
    int64/int32 value on qkv's device (the first slot to write; not advanced); ``k_cache``/``v_cache``:
    [B, n_kv_heads, T, hd] in qkv's dtype with a unit last stride. Returns ``(q, positions)``: rotated q
    [B, n_heads, S, hd] contiguous in qkv's dtype and the slots written, int64 [S]. Raises ValueError on a bad
    shape, dtype or device. No host sync: CUDA-graph capturable.
    """
    head_dim = _check_inputs(qkv, cos, sin, start, k_cache, v_cache, n_heads, n_kv_heads)
    batch, seq, _ = qkv.shape
    q_out = torch.empty((batch, n_heads, seq, head_dim), dtype=qkv.dtype, device=qkv.device)
    positions = torch.empty((seq,), dtype=torch.int64, device=qkv.device)
    _hf_rope_kv_update_kernel[(batch * seq, n_heads + n_kv_heads)](
        qkv,
        cos,
        sin,
        start,
        k_cache,
        v_cache,
        q_out,
        positions,
        qkv.stride(0),
        qkv.stride(1),
        cos.stride(0) if cos.shape[0] > 1 else 0,
        cos.stride(1),
        sin.stride(0) if sin.shape[0] > 1 else 0,
        sin.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        k_cache.shape[2],
        SEQ=seq,
        N_HEADS=n_heads,
        N_KV_HEADS=n_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        num_warps=1 if head_dim <= 128 else 2,  # hd/2 = 64 values per half: 2 per thread of one warp
        enable_fp_fusion=False,  # no FMA contraction: the same roundings as eager PyTorch (module docstring)
    )
    return q_out, positions


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_rope_kv_update_reference(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    start: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    n_heads: int,
    n_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same in eager PyTorch, as transformers does it (``apply_rotary_pos_emb`` in qkv's dtype, then
    ``StaticLayer.update``'s ``index_copy_`` at ``start + arange(S)``; ``start`` is not advanced)."""
    batch, seq, width = qkv.shape
    head_dim = width // (n_heads + 2 * n_kv_heads)
    q, k, v = qkv.split([n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim], dim=-1)
    q = q.reshape(batch, seq, n_heads, head_dim).transpose(1, 2)
    k = k.reshape(batch, seq, n_kv_heads, head_dim).transpose(1, 2)
    v = v.reshape(batch, seq, n_kv_heads, head_dim).transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q = (q * cos + _rotate_half(q) * sin).to(qkv.dtype)
    k = (k * cos + _rotate_half(k) * sin).to(qkv.dtype)
    positions = torch.arange(seq, device=qkv.device) + start.reshape(()).long()
    k_cache.index_copy_(2, positions, k)
    v_cache.index_copy_(2, positions, v)
    return q.contiguous(), positions

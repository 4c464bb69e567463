"""Rotary embedding of q and k plus the KV-cache write of one decode step, as one Triton kernel.

For the fused projection ``qkv = wqkv(x)`` of shape [B, S, 3 * H * hd] (q, k and v side by side, as in
``examples/llama_decode.py``), the rotary table rows ``rope = rope_table[input_pos]`` of shape [S, hd/2, 2]
(cos, sin; float32, or the model dtype: ``model.to(torch.bfloat16)`` turns the example's table into bf16,
and eager PyTorch then promotes it to fp32 in the products, as the kernel does on load) and the cache slots
``input_pos`` [S]::

    q, k, v = qkv.split(H * hd, dim=-1)                # viewed as [B, S, H, hd]
    q, k = apply_rotary(q, rope), apply_rotary(k, rope) # pairs (x0, x1) -> (x0*c - x1*s, x1*c + x0*s) in fp32
    k_cache[:, :, input_pos] = k^T;  v_cache[:, :, input_pos] = v^T      # in place, [B, H, T, hd]
    return q^T                                          # [B, H, S, hd], contiguous

The eager version of this (the example's ``apply_rotary`` twice, the transposes and two ``index_copy_``)
launches a kernel per elementwise step (the fp32 cast, four multiplies, an add, a subtract, the stack, the
cast back; for q and again for k) plus the cache copies; ``benchmarks/decode_attention_bench.py`` counts
them with the profiler (``gpu_ops_per_layer``). Here it is one launch that reads qkv once and writes q and
the new k and v slots once: 3 * B * S * H * hd elements each way, 12 KiB at B=1, S=1, H=16, hd=128 in bf16.

Rounding matches the eager code exactly: each product is rounded to fp32, then the sum, then the result
to qkv's dtype (round to nearest even). The kernel is launched with ``enable_fp_fusion=False`` so the
compiler does not contract ``x0*c - x1*s`` into a fused multiply-add (one rounding fewer, so a result 1 ulp
away from eager PyTorch's): compiled for sm_90 by triton 3.6 and 3.9, its PTX has no ``fma.rn.f32``. That
costs nothing measurable at a few hundred FLOPs per program. In Triton's CPU interpreter fp32 -> bf16
truncates instead of rounding (triton/runtime/interpreter.py, ``_convert_float``), so there bf16 results may
be 1 ulp below eager's; fp32 and fp16 are bit-exact there too.

One program handles one (batch, position, head): hd/2 pairs of q and of k and hd values of v. The grid is
B * S * H programs (16 at B=1, S=1, H=16): it is a latency-bound kernel and nothing here is worth tuning.

Positions are read on the device (no ``.item()``, so the call can be captured in a CUDA graph). They must
be distinct and in [0, T); that is not checked, as checking would need a host sync. A slot outside
[0, T) is not written (the write is masked, so a bad position cannot corrupt memory), where ``index_copy_``
would raise a device-side assert.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["rope_kv_update", "rope_kv_update_reference"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _rope_kv_update_kernel(
    qkv_ptr,
    rope_ptr,
    pos_ptr,
    k_cache_ptr,
    v_cache_ptr,
    q_out_ptr,
    qkv_stride_b,
    qkv_stride_s,
    rope_stride_s,
    rope_stride_pair,
    cache_k_stride_b,
    cache_k_stride_h,
    cache_k_stride_t,
    cache_v_stride_b,
    cache_v_stride_h,
    cache_v_stride_t,
    n_slots,
    SEQ: tl.constexpr,
    N_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    bs = tl.program_id(0)
    head = tl.program_id(1)
    b = (bs // SEQ).to(tl.int64)
    s = bs % SEQ
    pos = tl.load(pos_ptr + s).to(tl.int64)

    pair = tl.arange(0, BLOCK_HALF)
    pair_mask = pair < HEAD_DIM // 2
    # The slot test as a vector: a scalar bool mask broadcast into a store trips Triton's interpreter.
    slot = pos + tl.zeros([BLOCK_HALF], dtype=tl.int64)
    in_cache = (slot >= 0) & (slot < n_slots)
    even = 2 * pair
    odd = even + 1
    rope_row = rope_ptr + s * rope_stride_s + pair * rope_stride_pair
    cos = tl.load(rope_row, mask=pair_mask, other=0.0).to(tl.float32)
    sin = tl.load(rope_row + 1, mask=pair_mask, other=0.0).to(tl.float32)

    row = qkv_ptr + b * qkv_stride_b + s * qkv_stride_s + head * HEAD_DIM
    q_row = row
    k_row = row + N_HEADS * HEAD_DIM
    v_row = row + 2 * N_HEADS * HEAD_DIM

    # q -> [B, H, S, hd] contiguous.
    q0 = tl.load(q_row + even, mask=pair_mask, other=0.0).to(tl.float32)
    q1 = tl.load(q_row + odd, mask=pair_mask, other=0.0).to(tl.float32)
    q_out = q_out_ptr + ((b * N_HEADS + head) * SEQ + s) * HEAD_DIM
    out_ty = q_out_ptr.dtype.element_ty
    tl.store(q_out + even, (q0 * cos - q1 * sin).to(out_ty), mask=pair_mask)
    tl.store(q_out + odd, (q1 * cos + q0 * sin).to(out_ty), mask=pair_mask)

    # Rotated k into k_cache[b, head, pos, :].
    k0 = tl.load(k_row + even, mask=pair_mask, other=0.0).to(tl.float32)
    k1 = tl.load(k_row + odd, mask=pair_mask, other=0.0).to(tl.float32)
    k_slot = k_cache_ptr + b * cache_k_stride_b + head * cache_k_stride_h + pos * cache_k_stride_t
    k_ty = k_cache_ptr.dtype.element_ty
    k_mask = pair_mask & in_cache
    tl.store(k_slot + even, (k0 * cos - k1 * sin).to(k_ty), mask=k_mask)
    tl.store(k_slot + odd, (k1 * cos + k0 * sin).to(k_ty), mask=k_mask)

    # v unchanged into v_cache[b, head, pos, :] (as two halves, even and odd, like q and k).
    v_slot = v_cache_ptr + b * cache_v_stride_b + head * cache_v_stride_h + pos * cache_v_stride_t
    v0 = tl.load(v_row + even, mask=pair_mask, other=0.0)
    v1 = tl.load(v_row + odd, mask=pair_mask, other=0.0)
    tl.store(v_slot + even, v0, mask=k_mask)
    tl.store(v_slot + odd, v1, mask=k_mask)


def check_cache(name: str, cache: object, expected: tuple, like: torch.Tensor, like_name: str = "qkv") -> None:
    """A [B, H, T, hd] KV cache with (B, H, hd) = ``expected``, ``like``'s dtype and device, unit last stride."""
    if not isinstance(cache, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(cache).__name__}")
    if cache.dim() != 4 or (cache.shape[0], cache.shape[1], cache.shape[3]) != expected:
        b, h, hd = expected
        raise ValueError(f"{name} must have shape ({b}, {h}, T, {hd}), got {tuple(cache.shape)}")
    if cache.dtype != like.dtype:
        raise ValueError(f"{name} has dtype {cache.dtype}, {like_name} has {like.dtype}")
    if cache.device != like.device:
        raise ValueError(f"{name} is on {cache.device}, {like_name} is on {like.device}")
    if cache.stride(-1) != 1:
        raise ValueError(f"{name} must have a unit last-dim stride, got strides {cache.stride()}")


def check_caches(k_cache: object, v_cache: object, expected: tuple, like: torch.Tensor) -> None:
    """Both caches as :func:`check_cache` wants them, with as many slots each."""
    check_cache("k_cache", k_cache, expected, like)
    check_cache("v_cache", v_cache, expected, like)
    if v_cache.shape[2] != k_cache.shape[2]:
        raise ValueError(f"v_cache has {v_cache.shape[2]} slots, k_cache has {k_cache.shape[2]}")


def check_positions(input_pos: object, seq: int, device: torch.device) -> None:
    """Raise ValueError unless ``input_pos`` is a 1-D int32/int64 tensor of ``seq`` positions on ``device``."""
    if not isinstance(input_pos, torch.Tensor):
        raise ValueError(f"input_pos must be a torch.Tensor, got {type(input_pos).__name__}")
    if input_pos.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_pos has dtype {input_pos.dtype}; supported: int64, int32")
    if input_pos.shape != (seq,):
        raise ValueError(f"input_pos must have shape ({seq},), got {tuple(input_pos.shape)}")
    if input_pos.device != device:
        raise ValueError(f"input_pos is on {input_pos.device}, the query is on {device}")


def _check_inputs(qkv, rope, input_pos, k_cache, v_cache, n_heads) -> int:
    """Validate everything on the host (shapes, dtypes, devices; never values); return head_dim."""
    if not isinstance(qkv, torch.Tensor):
        raise ValueError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"qkv has dtype {qkv.dtype}; supported: float32, float16, bfloat16")
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")
    if qkv.dim() != 3 or qkv.shape[0] == 0 or qkv.shape[1] == 0 or qkv.shape[2] % (3 * n_heads) != 0:
        raise ValueError(f"qkv must have shape (B, S, 3 * {n_heads} * head_dim), got {tuple(qkv.shape)}")
    if qkv.stride(-1) != 1:
        raise ValueError(f"qkv must have a unit last-dim stride, got strides {qkv.stride()}")
    batch, seq, width = qkv.shape
    head_dim = width // (3 * n_heads)
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even for rotary pairs, got {head_dim}")
    if not isinstance(rope, torch.Tensor):
        raise ValueError(f"rope must be a torch.Tensor, got {type(rope).__name__}")
    if rope.shape != (seq, head_dim // 2, 2):
        raise ValueError(f"rope must have shape ({seq}, {head_dim // 2}, 2), got {tuple(rope.shape)}")
    if rope.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"rope has dtype {rope.dtype}; supported: float32, float16, bfloat16")
    if rope.device != qkv.device:
        raise ValueError(f"rope is on {rope.device}, qkv is on {qkv.device}")
    if rope.stride(-1) != 1:
        raise ValueError(f"rope must have a unit last-dim stride, got strides {rope.stride()}")
    check_positions(input_pos, seq, qkv.device)
    check_caches(k_cache, v_cache, (batch, n_heads, head_dim), qkv)
    return head_dim


def rope_kv_update(
    qkv: torch.Tensor,
    rope: torch.Tensor,
    input_pos: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    n_heads: int,
) -> torch.Tensor:
    """Rotate q and k, write k and v into the caches at ``input_pos`` (in place); return rotated q [B, H, S, hd].

    ``qkv``: [B, S, 3 * n_heads * hd] (float32/float16/bfloat16, unit last stride); ``rope``: [S, hd/2, 2]
    (cos, sin for each new position; float32, or a float16/bfloat16 table, upcast exactly); ``input_pos``: [S]
    int64/int32 cache slots (distinct, in [0, T): not checked on the host); ``k_cache``/``v_cache``:
    [B, n_heads, T, hd] in qkv's dtype with a unit last stride. Raises ValueError on a bad shape, dtype or
    device. No host sync: CUDA-graph capturable.
    """
    head_dim = _check_inputs(qkv, rope, input_pos, k_cache, v_cache, n_heads)
    batch, seq, _ = qkv.shape
    q_out = torch.empty((batch, n_heads, seq, head_dim), dtype=qkv.dtype, device=qkv.device)
    _rope_kv_update_kernel[(batch * seq, n_heads)](
        qkv,
        rope,
        input_pos,
        k_cache,
        v_cache,
        q_out,
        qkv.stride(0),
        qkv.stride(1),
        rope.stride(0),
        rope.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        k_cache.shape[2],
        SEQ=seq,
        N_HEADS=n_heads,
        HEAD_DIM=head_dim,
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        num_warps=1 if head_dim <= 128 else 2,  # hd/2 = 64 pairs: 2 per thread of one warp
        enable_fp_fusion=False,  # no FMA contraction: the same roundings as eager PyTorch (module docstring)
    )
    return q_out


def _apply_rotary(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x: [B, S, H, hd]; rope: [S, hd/2, 2]. The same operations as examples/llama_decode.py's apply_rotary."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    rope = rope.view(1, pairs.size(1), 1, pairs.size(3), 2)
    rotated = torch.stack(
        [
            pairs[..., 0] * rope[..., 0] - pairs[..., 1] * rope[..., 1],
            pairs[..., 1] * rope[..., 0] + pairs[..., 0] * rope[..., 1],
        ],
        dim=-1,
    )
    return rotated.flatten(3).type_as(x)


def rope_kv_update_reference(
    qkv: torch.Tensor,
    rope: torch.Tensor,
    input_pos: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    n_heads: int,
) -> torch.Tensor:
    """The same in eager PyTorch, as examples/llama_decode.py's Attention does it (split, apply_rotary,
    transpose, ``index_copy_`` into the caches in place). Returns q as [B, H, S, hd], contiguous."""
    batch, seq, width = qkv.shape
    head_dim = width // (3 * n_heads)
    q, k, v = qkv.split(n_heads * head_dim, dim=-1)
    q = _apply_rotary(q.reshape(batch, seq, n_heads, head_dim), rope)
    k = _apply_rotary(k.reshape(batch, seq, n_heads, head_dim), rope)
    v = v.reshape(batch, seq, n_heads, head_dim)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k_cache.index_copy_(2, input_pos.long(), k)
    v_cache.index_copy_(2, input_pos.long(), v)
    return q.contiguous()

"""One decode step of a Llama-style decoder in plain, eager PyTorch (gpt-fast style).

8 layers, d_model 2048, 16 heads (no GQA), SwiGLU MLP 5632, vocab 32000, bf16, batch 1: about 542 M
parameters, random weights, no downloads. Each layer keeps a static KV cache of 1024 slots, written
in place with ``index_copy_`` at a position tensor; attention reads all 1024 slots through a mask.
The step has fixed shapes and no host syncs, so it can be captured in a CUDA graph as it is.

Batch 1 makes every kernel small, and the eager step spends most of its time launching them (436
kernels per step on the H200 with torch 2.11; each RMSNorm is eight of them). Expect gpuadvisor to find the step
launch-bound (GA1xx: the GPU waits for Python), most kernels latency-bound (grids under one wave
of the 132 SMs), the unfused RMSNorm and residual-add chains memory-bound (GA2xx), and
`apply --fix graphs` to pay (shared/GPU.md: a decoder of this size went from 5856 to 815 us per step
when captured in one CUDA graph by hand).
Without CUDA it runs a tiny configuration on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

TOKENS_PER_STEP = 1  # batch 1, one new token per step


@dataclass(frozen=True)
class LlamaConfig:
    n_layers: int = 8
    d_model: int = 2048
    n_heads: int = 16
    mlp_hidden: int = 5632
    vocab_size: int = 32000
    max_seq_len: int = 1024  # KV cache slots
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


GPU_CONFIG = LlamaConfig()
CPU_CONFIG = LlamaConfig(n_layers=2, d_model=64, n_heads=4, mlp_hidden=176, vocab_size=256, max_seq_len=32)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return h.to(x.dtype) * self.weight


class KVCache(nn.Module):
    def __init__(self, n_heads: int, max_seq_len: int, head_dim: int):
        super().__init__()
        shape = (1, n_heads, max_seq_len, head_dim)
        # Random contents stand in for an earlier prompt, so attention never runs on zeros.
        self.register_buffer("k_cache", torch.randn(shape), persistent=False)
        self.register_buffer("v_cache", torch.randn(shape), persistent=False)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        # In place at a position tensor: no host sync, same shapes every step.
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        return self.k_cache, self.v_cache


def rotary_table(config: LlamaConfig) -> torch.Tensor:
    """(max_seq_len, head_dim // 2, 2): cos and sin of each position's rotation angles."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_base ** (torch.arange(0, half, dtype=torch.float32) / half))
    angles = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float32), inv_freq)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rotary(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim); rope: (seq, head_dim // 2, 2)."""
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


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_heads, self.head_dim, self.d_model = config.n_heads, config.head_dim, config.d_model
        self.wqkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.wo = nn.Linear(config.d_model, config.d_model, bias=False)
        self.kv_cache = KVCache(config.n_heads, config.max_seq_len, config.head_dim)

    def forward(self, x, input_pos, rope, mask):
        batch, seq, _ = x.shape
        q, k, v = self.wqkv(x).split(self.d_model, dim=-1)
        q = apply_rotary(q.view(batch, seq, self.n_heads, self.head_dim), rope)
        k = apply_rotary(k.view(batch, seq, self.n_heads, self.head_dim), rope)
        v = v.view(batch, seq, self.n_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        k, v = self.kv_cache.update(input_pos, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(batch, seq, self.d_model))


class FeedForward(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(config.d_model, config.mlp_hidden, bias=False)
        self.w3 = nn.Linear(config.d_model, config.mlp_hidden, bias=False)
        self.w2 = nn.Linear(config.mlp_hidden, config.d_model, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, input_pos, rope, mask):
        h = x + self.attention(self.attention_norm(x), input_pos, rope, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.register_buffer("rope", rotary_table(config), persistent=False)
        causal = torch.tril(torch.ones(config.max_seq_len, config.max_seq_len, dtype=torch.bool))
        self.register_buffer("causal_mask", causal, persistent=False)

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """tokens: (batch, seq) int64; input_pos: (seq,) int64 cache slots. Returns logits (batch, seq, vocab)."""
        rope = self.rope[input_pos]
        mask = self.causal_mask[None, None, input_pos]  # (1, 1, seq, max_seq_len): every slot, masked
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, input_pos, rope, mask)
        return self.output(self.norm(x))


def build_model(config: LlamaConfig = GPU_CONFIG, device: str = "cuda", dtype: torch.dtype = torch.bfloat16):
    """A Transformer with random weights (seed 0) for inference: eval mode, no gradients."""
    torch.manual_seed(0)
    with torch.device(device):
        model = Transformer(config)
        for module in model.modules():
            if isinstance(module, RMSNorm):
                # Weights other than 1, so a fused norm kernel that ignores them fails the numerics guard.
                nn.init.normal_(module.weight, mean=1.0, std=0.1)
    return model.to(dtype).eval().requires_grad_(False)


def decode_inputs(config: LlamaConfig, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """One token at the last cache slot, so attention reads the whole cache every step."""
    generator = torch.Generator().manual_seed(1)
    token = torch.randint(0, config.vocab_size, (1, 1), generator=generator).to(device)
    input_pos = torch.tensor([config.max_seq_len - 1], device=device)
    return token, input_pos


def build():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = GPU_CONFIG if device == "cuda" else CPU_CONFIG
    return build_model(config, device), decode_inputs(config, device)

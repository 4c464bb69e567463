"""One decode step of transformers' own ``Qwen2ForCausalLM`` with the library's ``StaticCache``.

A second decoder family beside hf_llama_decode.py, with the same recipe: Qwen2 adds biases to the q, k and
v projections and uses grouped-query attention. Full size (a CUDA machine): 8 layers, hidden 2048, 16
heads, 4 KV heads (head dim 128), SwiGLU MLP 5504, vocab 32000, bf16, batch 1: about 486 M parameters
with random weights (seed 0), nothing downloaded. The cache is a ``transformers.StaticCache`` of 1024
slots (4 KV heads per layer, a quarter of Llama's); ``build()`` runs a 100-token prompt into it, and the
step decodes one token at position 100. The inputs are ``(input_ids [1, 1], cache_position [1], cache)``.

Since transformers 5 a static cache layer writes where its own ``cumulative_length`` counter points (a
0-dim tensor on the device, advanced in place), not at a position passed to ``forward``. A profiler
repeats the step hundreds of times, and the counter would run past the 1024 slots after 924 of them, so
the step first sets each layer's counter to ``cache_position`` (one small copy per layer, no host sync)
and passes the same position as ``position_ids``: every step writes slot 100 again and reads slots
0..100, and two steps on the same inputs give the same logits.

What a performance engineer would expect on an H200: host-bound like the Llama decode, with three bias
adds more per layer and the key/value heads repeated for the 4:1 grouped-query attention. Measured there
with torch 2.11 and transformers 5.17: 435 kernels and about 1.1 ms of GPU work per step, about 11 ms per
eager step, no host sync. The weights are about 0.97 GB, so the memory-bound floor is near 0.2 ms per
token; a CUDA graph of the step is the fix that pays.

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration (float32 on the CPU,
the same dtype as above on a GPU): 2 layers, hidden 64, 4 heads, 2 KV heads, MLP 176, vocab 256, a
32-slot cache, a 10-token prompt.
"""

from __future__ import annotations

import torch
from _real import QWEN2_CONFIGS, build_decode, decode_step, real_size
from transformers import Qwen2Config, Qwen2ForCausalLM

KIND = "decode"
TOKENS_PER_STEP = 1  # batch 1, one new token per step


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # bf16 is slow on the CPU

FULL = dict(
    config=QWEN2_CONFIGS["full"],
    cache_len=1024,
    prompt_len=100,
)
SMALL = dict(
    config=QWEN2_CONFIGS["small"],
    cache_len=32,
    prompt_len=10,
)
SIZES = FULL if SIZE == "full" else SMALL


def build():
    torch.manual_seed(0)
    config = Qwen2Config(**SIZES["config"])
    return build_decode(
        Qwen2ForCausalLM,
        config,
        cache_len=SIZES["cache_len"],
        prompt_len=SIZES["prompt_len"],
        device=DEVICE,
        dtype=DTYPE,
    )


step = decode_step  # writes this step's keys and values at cache_position, whatever earlier steps wrote

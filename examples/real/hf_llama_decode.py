"""One decode step of transformers' own ``LlamaForCausalLM`` with the library's ``StaticCache``.

Full size (a CUDA machine): 8 layers, hidden 2048, 16 heads, 16 KV heads (no GQA), SwiGLU MLP 5632,
vocab 32000, bf16, batch 1: about 542 M parameters with random weights (seed 0), nothing downloaded. The
cache is a ``transformers.StaticCache`` of 1024 slots; ``build()`` runs a 100-token prompt into it, and the
step decodes one token at position 100. The inputs are ``(input_ids [1, 1], cache_position [1], cache)``:
the cache object travels in the inputs, as in a user's own generation loop, not inside the model.

Since transformers 5 a static cache layer writes where its own ``cumulative_length`` counter points (a
0-dim tensor on the device, advanced in place), not at a position passed to ``forward``. A profiler
repeats the step hundreds of times, and the counter would run past the 1024 slots after 924 of them, so
the step first sets each layer's counter to ``cache_position`` (one small copy per layer, no host sync)
and passes the same position as ``position_ids``: every step writes slot 100 again and reads slots
0..100, and two steps on the same inputs give the same logits.

What a performance engineer would expect on an H200: the same model as examples/llama_decode.py, but
through the library's code path (its attention dispatch, mask creation, rotary embedding, output
dataclasses), and host-bound. Measured there with torch 2.11 and transformers 5.17: 419 kernels and about
1.0 ms of GPU work per step, but about 12 ms per eager step, so the GPU idles most of the step waiting for
Python; no host sync; the GEMVs are grids far below one wave of the SMs, and the RMSNorms (in float32),
rotary embedding and SiLU-mul run as chains of small memory-bound kernels. The weights are about 1.08 GB,
so the memory-bound floor is near 0.25 ms per token. A CUDA graph of the step (or torch.compile) is the
fix that pays.

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration (float32 on the CPU,
the same dtype as above on a GPU): 2 layers, hidden 64, 4 heads, MLP 176, vocab 256, a 32-slot cache, a
10-token prompt.
"""

from __future__ import annotations

import torch
from _real import LLAMA_CONFIGS, build_decode, decode_step, real_size
from transformers import LlamaConfig, LlamaForCausalLM

KIND = "decode"
TOKENS_PER_STEP = 1  # batch 1, one new token per step


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # bf16 is slow on the CPU

FULL = dict(
    config=LLAMA_CONFIGS["full"],
    cache_len=1024,
    prompt_len=100,
)
SMALL = dict(
    config=LLAMA_CONFIGS["small"],
    cache_len=32,
    prompt_len=10,
)
SIZES = FULL if SIZE == "full" else SMALL


def build():
    torch.manual_seed(0)
    config = LlamaConfig(**SIZES["config"])
    return build_decode(
        LlamaForCausalLM,
        config,
        cache_len=SIZES["cache_len"],
        prompt_len=SIZES["prompt_len"],
        device=DEVICE,
        dtype=DTYPE,
    )


step = decode_step  # writes this step's keys and values at cache_position, whatever earlier steps wrote

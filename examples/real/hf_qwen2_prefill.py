"""One prefill forward of transformers' own ``Qwen2ForCausalLM``: a 64-token prompt, no cache.

The same model as hf_qwen2_decode.py (q, k and v projections with biases, grouped-query attention).
Full size (a CUDA machine): 8 layers, hidden 2048, 16 heads, 4 KV heads, SwiGLU MLP 5504, vocab 32000,
bf16, batch 1: about 486 M parameters with random weights (seed 0), nothing downloaded. The step is one
``forward`` of ``input_ids [1, 64]`` with ``use_cache=False`` under ``torch.no_grad()``, and returns the
logits ``[1, 64, 32000]``.

What a performance engineer would expect on an H200: GEMMs with M = 64 (about 62 GFLOP per step), bound by
reading the 0.97 GB of bf16 weights (about 0.2 ms) more than by the math, and the library's elementwise
chains (RMSNorm in float32, rotary embedding, bias adds, SiLU-mul, residual adds) unfused. Measured there
with torch 2.11 and transformers 5.17: 352 kernels and about 1.1 ms of GPU work per step, but 7 to 10 ms
per eager step: host-bound, with one host sync in transformers' mask creation (masking_utils
``find_packed_sequence_indices``: ``(...).all()`` on the position ids it built itself). A CUDA graph pays
once that sync is gone; fusion pays on the GPU time.

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration (float32 on the CPU,
the same dtype as above on a GPU): 2 layers, hidden 64, 4 heads, 2 KV heads, MLP 176, vocab 256, a
16-token prompt.
"""

from __future__ import annotations

import torch
from _real import QWEN2_CONFIGS, build_prefill, prefill_step, real_size
from transformers import Qwen2Config, Qwen2ForCausalLM

KIND = "prefill"


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # bf16 is slow on the CPU

FULL = dict(
    config=QWEN2_CONFIGS["full"],
    prompt_len=64,
)
SMALL = dict(
    config=QWEN2_CONFIGS["small"],
    prompt_len=16,
)
SIZES = FULL if SIZE == "full" else SMALL
TOKENS_PER_STEP = SIZES["prompt_len"]  # batch 1


def build():
    torch.manual_seed(0)
    config = Qwen2Config(**SIZES["config"])
    return build_prefill(Qwen2ForCausalLM, config, prompt_len=SIZES["prompt_len"], device=DEVICE, dtype=DTYPE)


step = prefill_step

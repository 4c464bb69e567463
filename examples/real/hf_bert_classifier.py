"""Batched inference of transformers' own ``BertForSequenceClassification`` (bert-base sizes) in fp16.

Full size (a CUDA machine): 12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522, 512 positions, two
labels: about 109 M parameters with random weights (seed 0), nothing downloaded, cast to fp16. The step
classifies a batch of 8 sequences of 128 tokens, ``(input_ids [8, 128], attention_mask [8, 128])`` with
an all-ones mask, in eval mode under ``torch.no_grad()``, and returns the logits ``[8, 2]``.

What a performance engineer would expect on an H200: 1024 tokens per step make the projections real
GEMMs (M = 1024, about 0.2 TFLOP per step, a fraction of a millisecond at the fp16 peak), beside the
encoder's unfused bias adds, GELUs, residual adds and LayerNorms, memory-bound and one kernel each; the
attention goes through PyTorch's SDPA. Measured there with torch 2.11 and transformers 5.17: 170 kernels
and about 0.8 ms of GPU work per step (GEMMs about 0.6 ms), but about 4.4 ms per eager step: host-bound.
The step has one host sync: transformers checks whether the padding mask is all ones, to drop it
(masking_utils ``_ignore_bidirectional_mask_sdpa``: ``padding_mask.all()``). A CUDA graph pays once
that sync is gone (pass no mask when nothing is padded).

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration (float32 on the CPU,
the same dtype as above on a GPU): 2 layers, hidden 64, 4 heads, FFN 128, vocab 256, 64 positions, a
batch of 2 sequences of 16 tokens.
"""

from __future__ import annotations

import torch
from _real import real_size
from transformers import BertConfig, BertForSequenceClassification

KIND = "infer"


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float16 if DEVICE == "cuda" else torch.float32  # fp16 is slow on the CPU

FULL = dict(
    config=dict(
        num_hidden_layers=12,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        vocab_size=30522,
        max_position_embeddings=512,
    ),
    batch=8,
    seq_len=128,
)
SMALL = dict(
    config=dict(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=256,
        max_position_embeddings=64,
    ),
    batch=2,
    seq_len=16,
)
SIZES = FULL if SIZE == "full" else SMALL
TOKENS_PER_STEP = SIZES["batch"] * SIZES["seq_len"]


def build():
    torch.manual_seed(0)
    config = BertConfig(**SIZES["config"], num_labels=2)
    with torch.device(DEVICE):
        model = BertForSequenceClassification(config)
    model = model.to(DTYPE).eval()

    shape = (SIZES["batch"], SIZES["seq_len"])
    input_ids = torch.randint(0, config.vocab_size, shape, device=DEVICE)
    # The largest id in the vocabulary: inputs drawn at random in [0, max + 1) then cover all of it.
    input_ids[0, -1] = config.vocab_size - 1
    attention_mask = torch.ones(shape, dtype=torch.long, device=DEVICE)
    return model, (input_ids, attention_mask)


def step(model, inputs):
    input_ids, attention_mask = inputs
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask).logits

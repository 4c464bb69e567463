"""One fine-tuning step of transformers' own ``BertForSequenceClassification`` with bf16 autocast and AdamW.

Full size (a CUDA machine): bert-base sizes, 12 layers, hidden 768, 12 heads, FFN 3072, vocab 30522, two
labels: about 109 M parameters with random weights (seed 0), nothing downloaded, kept in float32. The
model is in train mode, so dropout is on (``hidden_dropout_prob`` and ``attention_probs_dropout_prob``
0.1, the defaults). The step is the usual mixed-precision loop: ``zero_grad()``, the forward and the
library's own loss (``labels=``) under ``torch.autocast(device_type, dtype=torch.bfloat16)``,
``backward()`` outside it, ``AdamW(lr=2e-5)`` with no ``fused`` argument, and it returns the loss
(detached). A batch of 16 sequences of 128 tokens: ``(input_ids, attention_mask, labels)`` with an
all-ones mask. The model returned by ``build()`` is a ``TrainState`` holding the module and its optimizer.

What a performance engineer would expect on an H200: 2048 tokens per step give GEMMs big enough for the
tensor cores (about 1.1 TFLOP forward and backward, under 2 ms at the bf16 peak), but autocast adds a
cast kernel in front of each of them (fp32 weights to bf16), dropout adds its own mask kernels, the
LayerNorms, GELUs and residual adds run unfused, and AdamW (its default ``foreach`` implementation on
CUDA) reads the weights, gradients and both moments of 201 fp32 tensors and writes three of them, about
3 GB of traffic per step. Measured there with torch 2.11 and transformers 5.17: 1173 kernels and about 9
ms of GPU work (the GEMMs about 2.6 ms of it; some 420 copy and cast kernels), but about 40 ms per eager
step: host-bound. One host sync: transformers checks whether the padding mask is all ones (masking_utils
``_ignore_bidirectional_mask_sdpa``: ``padding_mask.all()``). ``fused=True`` for AdamW, fewer casts
(bf16 weights or torch.compile) and a CUDA graph once the sync is gone all pay.

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration, under the same bf16
autocast: 2 layers, hidden 64, 4 heads, FFN 128, vocab 256, 64 positions, a batch of 2 sequences of 16
tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from _real import real_size
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

KIND = "train"


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

FULL = dict(
    config=dict(
        num_hidden_layers=12,
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        vocab_size=30522,
        max_position_embeddings=512,
    ),
    batch=16,
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


@dataclass
class TrainState:
    model: nn.Module
    optimizer: torch.optim.Optimizer


def build():
    torch.manual_seed(0)
    config = BertConfig(**SIZES["config"], num_labels=2)
    with torch.device(DEVICE):
        model = BertForSequenceClassification(config)
    model = model.train()  # dropout on, as in fine-tuning
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    state = TrainState(model=model, optimizer=optimizer)

    shape = (SIZES["batch"], SIZES["seq_len"])
    input_ids = torch.randint(0, config.vocab_size, shape, device=DEVICE)
    # The largest id and label: inputs drawn at random in [0, max + 1) then cover every one and stay in range.
    input_ids[0, -1] = config.vocab_size - 1
    attention_mask = torch.ones(shape, dtype=torch.long, device=DEVICE)
    labels = torch.randint(0, config.num_labels, (SIZES["batch"],), device=DEVICE)
    labels[-1] = config.num_labels - 1
    return state, (input_ids, attention_mask, labels)


def step(state, inputs):
    input_ids, attention_mask, labels = inputs
    state.optimizer.zero_grad()
    with torch.autocast(device_type=input_ids.device.type, dtype=torch.bfloat16):
        loss = state.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    loss.backward()
    state.optimizer.step()
    return loss.detach()

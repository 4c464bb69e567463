"""One training step of transformers' own ``GPT2LMHeadModel`` with an AdamW that runs one parameter at a time.

Full size (a CUDA machine): GPT-2 small's shape, 12 layers, d_model 768, 12 heads, 1024 positions, vocab
50257: about 124 M parameters in 148 tensors, random weights (seed 0), nothing downloaded, kept in float32,
in train mode (dropout 0.1, the default). The step is a plain language-model loop: ``zero_grad()``, the
forward and the library's loss (``labels=input_ids``) under ``torch.autocast(device_type,
dtype=torch.bfloat16)``, ``backward()``, then ``AdamW(lr=3e-4, weight_decay=0.1, foreach=False)``; it returns
the loss (detached). ``foreach=False`` is what code written to save optimizer memory, or copied from such
code, passes: PyTorch then runs AdamW's update as a Python loop over the parameters, eight small kernels for
each of the 148 tensors (1,184 per step in an H200 trace, torch 2.11). A batch of 4 sequences of 256 tokens.

What a performance engineer would expect: the forward and backward are GEMM work big enough for the
tensor cores, but the optimizer launches its small kernels one after another; ``foreach=True`` (a few
multi-tensor kernels) or ``fused=True`` (one kernel per group of tensors) removes almost all of them.
Measured on the H200 through ``apply --fix auto`` (benchmarks/results/real_models_auto.json): 57,798 µs per
eager step, 41,340 µs with ``fused=True`` (1.40x).

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration: 2 layers, d_model 64, 4
heads, 64 positions, vocab 256, a batch of 2 sequences of 16 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from _real import real_size
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

KIND = "train"


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

FULL = dict(
    config=dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257),
    batch=4,
    seq_len=256,
)
SMALL = dict(
    config=dict(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=256, bos_token_id=255, eos_token_id=255),
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
    config = GPT2Config(**SIZES["config"])
    with torch.device(DEVICE):
        model = GPT2LMHeadModel(config)
    model = model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, foreach=False)
    input_ids = torch.randint(0, config.vocab_size, (SIZES["batch"], SIZES["seq_len"]), device=DEVICE)
    input_ids[0, -1] = config.vocab_size - 1  # the largest id: fresh inputs drawn in [0, max + 1) cover the vocabulary
    return TrainState(model=model, optimizer=optimizer), (input_ids,)


def step(state, inputs):
    (input_ids,) = inputs
    state.optimizer.zero_grad()
    with torch.autocast(device_type=input_ids.device.type, dtype=torch.bfloat16):
        loss = state.model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    state.optimizer.step()
    return loss.detach()

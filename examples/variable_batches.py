"""Inference over batches of growing length: the pattern that fragments PyTorch's caching allocator.

A bf16 MLP block (d=4096, hidden 16384) runs, in one step, over eight inputs whose token counts grow from
2,048 to 16,384, as a server sees requests of rising length or a trainer sees length-bucketed batches in
ascending order. Each length's activations are a little larger than any block the allocator has cached from
the shorter ones, so (with the default allocator) it reserves a new segment each time and keeps the old ones
cached: reserved memory grows to roughly the sum of the lengths' working sets while at most one of them is
live. ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` lets one segment grow in place instead, and the
reserved peak falls to about the largest working set. Rule GA601 reads that gap off the allocator's
statistics (``profile``), and ``benchmarks/fragmentation_check.py`` measures both settings on the GPU.

On a CPU (no CUDA) the same code runs at d=64 in float32; the allocator figures are CUDA-only.
"""

from __future__ import annotations

import torch
from torch import nn

CUDA = torch.cuda.is_available()
D, HIDDEN = (4096, 16384) if CUDA else (64, 256)
LENGTHS = tuple(2048 * k for k in range(1, 9)) if CUDA else (4, 8, 12, 16)
TOKENS_PER_STEP = sum(LENGTHS)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def build():
    torch.manual_seed(0)
    device = "cuda" if CUDA else "cpu"
    dtype = torch.bfloat16 if CUDA else torch.float32
    model = Block().to(device=device, dtype=dtype).eval().requires_grad_(False)
    inputs = tuple(torch.randn(n, D, device=device, dtype=dtype) for n in LENGTHS)
    return model, (inputs,)


def step(model, inputs):
    (batches,) = inputs
    # The lengths in rising order, each through the block; only the last output is kept.
    out = None
    for x in batches:
        out = model(x)
    return out

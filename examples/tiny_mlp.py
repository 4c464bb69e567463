"""A tiny MLP for CI and smoke tests: one forward pass, a few milliseconds on a CPU.

It demonstrates the model.py contract in its smallest form (build() plus TOKENS_PER_STEP, the
default step ``model(*inputs)``). It is too small for any GPU finding to matter; on a GPU expect
little more than a launch-bound step (GA1xx) made of a handful of tiny kernels.
"""

from __future__ import annotations

import torch
from torch import nn

BATCH = 16
TOKENS_PER_STEP = BATCH  # one row per "token", so CI exercises the tokens/s line of the report


def build():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).eval().requires_grad_(False)
        x = torch.randn(BATCH, 32)
    return model, (x,)

"""A GPU-bound step for checking the CI gate: eight bf16 4096x4096 matmuls, plus a planted slowdown.

``GPUADVISOR_EXAMPLE_EXTRA`` (a fraction, default 0) adds one more matmul whose row count is that
fraction of the eight matmuls' rows, i.e. about that fraction of the step's GPU time: 0.10 plants a
10% slowdown as a real extra kernel (measured, not edited numbers). ``GPUADVISOR_EXAMPLE_GROW`` (a
fraction) instead gives the activations that many more rows, so every matmul does that much more work
with the same kernels: 0.02 plants a 2% slowdown that leaves the kernel count alone. The kernels are large
(about 175 us each on an H200), so the step is GPU-bound and its timing is steady between runs.
Without CUDA it runs a tiny version on the CPU.
"""

from __future__ import annotations

import os

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SIZE, LAYERS = (4096, 8) if DEVICE == "cuda" else (64, 2)


def build():
    torch.manual_seed(0)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    weights = [torch.randn(SIZE, SIZE, device=DEVICE, dtype=dtype) / SIZE**0.5 for _ in range(LAYERS)]
    rows = round(SIZE * (1 + float(os.environ.get("GPUADVISOR_EXAMPLE_GROW", "0"))))
    x = torch.randn(rows, SIZE, device=DEVICE, dtype=dtype)
    extra_rows = round(float(os.environ.get("GPUADVISOR_EXAMPLE_EXTRA", "0")) * LAYERS * SIZE)
    extra = torch.randn(extra_rows, SIZE, device=DEVICE, dtype=dtype) if extra_rows > 0 else None
    return weights, (x, extra)


def step(weights, inputs):
    x, extra = inputs
    for w in weights:
        x = x @ w
    if extra is not None:
        extra @ weights[0]
    return x

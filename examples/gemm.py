"""Large matrix multiplications: compute-bound kernels, and an FP32 GEMM that misses the tensor cores.

Each step runs three bf16 8192 x 8192 x 8192 GEMMs (a chain of bias-free Linear layers, 1.1 TFLOP
each) and one fp32 4096 x 4096 x 4096 GEMM with TF32 switched off
(``torch.backends.cuda.matmul.allow_tf32 = False``), which runs on the CUDA cores.

On the H200 (shared/GPU.md) torch reaches 786 TFLOP/s on the bf16 GEMM: expect gpuadvisor to class
those kernels compute-bound near the roof, to flag the fp32 GEMM as full-precision work that TF32 or
bf16 would speed up (GA3xx), and `apply --fix fp8` to be applicable to the bf16 Linear layers
(1451 TFLOP/s measured for fp8 at this size). Without CUDA it runs 64-wide versions on the CPU.
"""

from __future__ import annotations

import torch
from torch import nn

N_BF16_GEMMS = 3


class GemmMix(nn.Module):
    def __init__(self, bf16_size: int, fp32_size: int):
        super().__init__()
        self.bf16_layers = nn.Sequential(
            *(nn.Linear(bf16_size, bf16_size, bias=False, dtype=torch.bfloat16) for _ in range(N_BF16_GEMMS))
        )
        self.fp32_layer = nn.Linear(fp32_size, fp32_size, bias=False, dtype=torch.float32)

    def forward(self, x_bf16: torch.Tensor, x_fp32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.bf16_layers(x_bf16), self.fp32_layer(x_fp32)


def build():
    # Full fp32 precision for fp32 matmuls (no TF32): the FP32 GEMM this example is meant to show.
    torch.backends.cuda.matmul.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bf16_size, fp32_size = (8192, 4096) if device == "cuda" else (64, 32)
    torch.manual_seed(0)
    with torch.device(device):
        model = GemmMix(bf16_size, fp32_size).requires_grad_(False)
        x_bf16 = torch.randn(bf16_size, bf16_size, dtype=torch.bfloat16)
        x_fp32 = torch.randn(fp32_size, fp32_size, dtype=torch.float32)
    return model, (x_bf16, x_fp32)

"""A residual add followed by RMSNorm, written eagerly, four times per step: memory-bound kernels.

Each layer computes ``h = x + residual`` and then RMSNorm of ``h`` the way eager Llama code does it
(upcast to fp32, mean of squares, rsqrt, multiply, cast back to bf16, multiply by the weight), on a
16384 x 4096 bf16 activation (128 MB). Every one of those operators is its own kernel that reads and
writes the whole tensor, so the step is a chain of memory-bound elementwise and reduction kernels.

On the H200 (shared/GPU.md) one eager add + RMSNorm takes 952 us against a 127 us floor (bytes moved /
copy bandwidth); a single fused Triton kernel takes 133 us. Expect gpuadvisor to class the kernels
memory-bound (GA2xx), to find the unfused add + RMSNorm chain, and `apply --fix fusion` to pay.
Without CUDA it runs a tiny 64 x 256 version on the CPU.
"""

from __future__ import annotations

import torch
from torch import nn

N_LAYERS = 4


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        hf = h.float()
        variance = hf.pow(2).mean(-1, keepdim=True)
        hf = hf * torch.rsqrt(variance + self.eps)
        return hf.to(torch.bfloat16) * self.weight


class AddRMSNormChain(nn.Module):
    def __init__(self, hidden: int, n_layers: int = N_LAYERS):
        super().__init__()
        self.norms = nn.ModuleList(RMSNorm(hidden) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for norm in self.norms:
            h = x + residual
            residual = h
            x = norm(h)
        return x, residual


def build():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows, hidden = (16384, 4096) if device == "cuda" else (64, 256)
    torch.manual_seed(0)
    with torch.device(device):
        model = AddRMSNormChain(hidden)
        for norm in model.norms:
            nn.init.normal_(norm.weight, mean=1.0, std=0.1)
        model = model.to(torch.bfloat16).requires_grad_(False)
        x = torch.randn(rows, hidden, dtype=torch.bfloat16)
        residual = torch.randn(rows, hidden, dtype=torch.bfloat16)
    return model, (x, residual)

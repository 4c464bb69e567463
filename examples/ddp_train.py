"""A data-parallel training step (DDP): an MLP of residual blocks, AdamW, synthetic data of fixed shapes.

Run it on N GPUs (or N CPU processes with gloo when there is no GPU)::

    gpuadvisor profile --nproc 2 examples/ddp_train.py
    torchrun --nproc-per-node 2 -m gpuadvisor profile examples/ddp_train.py   # the same, launched by torchrun

and on one GPU as a plain workload (no process group, no DDP wrapper)::

    gpuadvisor profile examples/ddp_train.py

``step(model, inputs)`` does forward (bf16 autocast on a GPU, fp32 on the CPU), backward (DDP all-reduces the
gradients in buckets during it) and the optimizer step, and returns the loss (not synchronized: the host runs
ahead as in a real training loop). On a GPU the model has 4 blocks of d=2048 with a 4x wide hidden layer
(138 M parameters) over 16384 tokens per rank: about 13.6 TFLOP per step (6 x parameters x tokens), tens of ms
of GPU work on an H200, plus a 0.55 GB fp32 gradient all-reduce that overlaps the backward pass. The step is
sized so the GPU, not the host, sets its pace, as in real training: with 4096 tokens (about 10 ms per step on
an H200) the profiler's own host overhead stretched each profiled step to 15-17 ms, so the trace no longer
showed the step that runs without it. On the CPU the same code runs a tiny
configuration (d=64, 2 blocks, 64 tokens) so that CI can exercise the multi-rank path with gloo.

A planted straggler, to see GA702 name it: ``GPUADVISOR_EXAMPLE_STRAGGLER_RANK=r`` makes rank r sleep
``GPUADVISOR_EXAMPLE_STRAGGLER_MS`` milliseconds (default 80) on the host in every step, between the forward
pass and the backward pass. The sleep has to outlast a step of GPU work, or the host, running ahead of the
GPU, absorbs it; then the other ranks wait inside their first gradient all-reduce::

    GPUADVISOR_EXAMPLE_STRAGGLER_RANK=1 gpuadvisor profile --nproc 2 examples/ddp_train.py

The process group: under torchrun (WORLD_SIZE > 1) build() initializes it when nobody has yet (nccl on a GPU,
gloo on the CPU; gpuadvisor's rank runner leaves it to build() and only starts one itself afterwards when
build() did not) and wraps the model in DistributedDataParallel.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

STRAGGLER_RANK_ENV = "GPUADVISOR_EXAMPLE_STRAGGLER_RANK"
STRAGGLER_MS_ENV = "GPUADVISOR_EXAMPLE_STRAGGLER_MS"
DEFAULT_STRAGGLER_MS = 80.0

# (d_model, blocks, tokens per rank). GPU: about 13.6 TFLOP per step (6 x tokens x params), GPU-bound (docstring).
GPU_CONFIG = (2048, 4, 16384)
CPU_CONFIG = (64, 2, 64)
HIDDEN_MULTIPLE = 4

_on_gpu = torch.cuda.is_available()
TOKENS_PER_STEP = (GPU_CONFIG if _on_gpu else CPU_CONFIG)[2]


class Block(nn.Module):
    """Pre-norm residual MLP block: x + W2 gelu(W1 norm(x))."""

    def __init__(self, d_model: int):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, HIDDEN_MULTIPLE * d_model)
        self.down = nn.Linear(HIDDEN_MULTIPLE * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, d_model: int, blocks: int):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(d_model) for _ in range(blocks)))
        self.head = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


class _Straggler:
    """How long this rank sleeps in each step (0: not the planted straggler)."""

    sleep_s = 0.0


def _world() -> tuple[int, int, int]:
    """(rank, world size, local rank), starting the process group under torchrun when nobody has yet."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if _on_gpu else "gloo")
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    return 0, 1, 0


def build():
    rank, world_size, local_rank = _world()
    d_model, blocks, tokens = GPU_CONFIG if _on_gpu else CPU_CONFIG
    device = torch.device("cuda", local_rank) if _on_gpu else torch.device("cpu")
    if _on_gpu:
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = MLP(d_model, blocks).to(device)
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if _on_gpu else None)
    # fused AdamW: one kernel launch per parameter group instead of several per tensor.
    model.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=_on_gpu)

    generator = torch.Generator(device="cpu").manual_seed(1 + rank)  # each rank its own shard of data
    x = torch.randn(tokens, d_model, generator=generator).to(device)
    target = torch.randn(tokens, d_model, generator=generator).to(device)

    _Straggler.sleep_s = 0.0
    if os.environ.get(STRAGGLER_RANK_ENV, "").strip() == str(rank):
        _Straggler.sleep_s = float(os.environ.get(STRAGGLER_MS_ENV, DEFAULT_STRAGGLER_MS)) / 1000.0
    return model, (x, target)


def step(model, inputs):
    x, target = inputs
    model.optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda" if _on_gpu else "cpu", dtype=torch.bfloat16, enabled=_on_gpu):
        out = model(x)
    loss = F.mse_loss(out.float(), target)
    if _Straggler.sleep_s:
        time.sleep(_Straggler.sleep_s)  # the planted straggler: the others wait in the all-reduce
    loss.backward()
    model.optimizer.step()
    return loss.detach()

"""Single-image inference of transformers' own ``ViTForImageClassification`` (ViT-B/16) in float32.

The twin of torchvision_vit_b16_infer.py on the transformers implementation (which imports without
torchvision). Full size (a CUDA machine): ``ViTConfig`` at its ViT-B/16 defaults, 12 layers, hidden 768,
12 heads, MLP 3072, 16 x 16 patches of a 224 x 224 image (196 patches and a class token), and 1000
labels: about 86.6 M parameters with random weights (seed 0), nothing downloaded. The step classifies
one image, ``pixel_values [1, 3, 224, 224]`` in float32, in eval mode under ``torch.no_grad()``, and
returns the logits ``[1, 1000]`` (``[N, 1000]`` at batch N, below).

What a performance engineer would expect on an H200: batch 1 gives 197 tokens, GEMMs with M = 197 (about
35 GFLOP per step), in fp32: PyTorch does not allow TF32 for matmuls by default, so they run as SIMT
SGEMMs without the tensor cores. Measured there with torch 2.11 and transformers 5.17: 186 kernels and
about 3.5 ms of GPU work per step, nearly all of it fp32 GEMMs, in a 5.8 ms step; no host sync. The
attention goes through PyTorch's SDPA (the memory-efficient fp32 kernel).
``torch.backends.cuda.matmul.allow_tf32 = True`` cut the GPU work to about 1 ms, but not the eager step:
the host's launches are the floor, so a CUDA graph (or torch.compile) has to come with it, and a bigger
batch is what a throughput-minded user should be told.

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration: 2 layers, hidden 64, 4
heads, MLP 128, 8 x 8 patches of a 32 x 32 image, 10 labels. GPUADVISOR_REAL_BATCH=N classifies N images per step
(either size; default 1): at 32 the GPU, not the host, bounds the eager step, and a fix that only shortens
kernels (TF32, bf16) shows in the step time.
"""

from __future__ import annotations

import torch
from _real import real_batch, real_size
from transformers import ViTConfig, ViTForImageClassification

KIND = "infer"


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

FULL = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    image_size=224,
    patch_size=16,
    num_labels=1000,
)
SMALL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    image_size=32,
    patch_size=8,
    num_labels=10,
)
SIZES = FULL if SIZE == "full" else SMALL


def build():
    torch.manual_seed(0)
    config = ViTConfig(**SIZES)
    with torch.device(DEVICE):
        model = ViTForImageClassification(config)
    model = model.eval()
    pixel_values = torch.randn(real_batch(1), 3, config.image_size, config.image_size, device=DEVICE)
    return model, (pixel_values,)


def step(model, inputs):
    (pixel_values,) = inputs
    with torch.no_grad():
        return model(pixel_values=pixel_values).logits

"""Single-image inference of torchvision's ViT-B/16 in float32, as users run it by default.

Full size (a CUDA machine): ``torchvision.models.vit_b_16(weights=None)``: 12 layers, hidden 768, 12
heads, MLP 3072, 16 x 16 patches of a 224 x 224 image (196 patches and a class token), 1000 classes:
about 86.6 M parameters with random weights (seed 0), nothing downloaded. The step classifies one image,
``images [1, 3, 224, 224]`` in float32, in eval mode under ``torch.no_grad()``, and returns the logits
``[1, 1000]``.

What a performance engineer would expect on an H200: batch 1 gives 197 tokens, GEMMs with M = 197 (about
35 GFLOP per step), in fp32: PyTorch does not allow TF32 for matmuls by default, so they run as SIMT
SGEMMs without the tensor cores. Measured there with torch 2.11 and torchvision 0.26: 162 kernels and
about 3.0 ms of GPU work per step, nearly all of it fp32 GEMMs, in a 4.6 ms step; no host sync. The
encoder blocks use ``nn.MultiheadAttention``; its attention ran in the memory-efficient fp32 kernel.
``torch.backends.cuda.matmul.allow_tf32 = True`` cut the GPU work to about 1 ms, but not the eager step:
the host's launches are the floor, so a CUDA graph (or torch.compile) has to come with it, and a bigger
batch is what a throughput-minded user should be told.

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration of the same
``VisionTransformer`` class: 2 layers, hidden 64, 4 heads, MLP 128, 8 x 8 patches of a 32 x 32 image, 10
classes.
"""

from __future__ import annotations

import torch
import torchvision
from _real import real_size
from torchvision.models.vision_transformer import VisionTransformer

KIND = "infer"


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SMALL = dict(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10)


def build():
    torch.manual_seed(0)
    if SIZE == "full":
        model = torchvision.models.vit_b_16(weights=None)
    else:
        model = VisionTransformer(**SMALL)
    # torchvision starts the classification head at zeros (it is meant to be fine-tuned), so with random
    # weights every image would give all-zero logits and no check of the output could see anything; a user's
    # fine-tuned head is not zero, and a random one stands in for it.
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    model = model.to(DEVICE).eval()
    image_size = model.image_size
    images = torch.randn(1, 3, image_size, image_size, device=DEVICE)
    return model, (images,)


def step(model, inputs):
    (images,) = inputs
    with torch.no_grad():
        return model(images)

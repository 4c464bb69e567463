"""One training step of transformers' own ``ResNetForImageClassification``: SGD with momentum, fp32, NCHW.

The same training step as timm_resnet50_train.py on the transformers implementation of ResNet (which,
unlike timm, imports without torchvision). Full size (a CUDA machine): a ResNet-50 layout, ``ResNetConfig``
with a 64-channel stem, bottleneck stages of depths 3, 4, 6, 3 and widths 256, 512, 1024, 2048 and 1000
labels: about 25.6 M parameters with random weights (seed 0), nothing downloaded; a batch of 64 images of
3 x 224 x 224 in float32, channels-first; ``CrossEntropyLoss`` on the logits; ``SGD(lr=0.1,
momentum=0.9)``. The step is ``zero_grad()``, forward, loss, ``backward()``, ``optimizer.step()``, and it
returns the loss (detached). The model returned by ``build()`` is a ``TrainState`` holding the module, its
optimizer and the loss function.

What a performance engineer would expect on an H200: as for the timm model, about 1.6 TFLOP of
convolutions forward and backward in fp32, which cuDNN runs in TF32 by default, with NCHW tensors that
cuDNN transposes to NHWC around its kernels. Measured there with torch 2.11 and transformers 5.17: the
same kernels as the timm model (792 per step, about 28 ms of GPU work in a 37 ms step, no host sync):
129 ``nchwToNhwc`` transposes, BatchNorm forward and backward, residual adds and other elementwise
kernels, memory-bound, beside the convolutions. As there, ``channels_last`` and bf16 autocast shorten
the GPU work, but the step only together with a CUDA graph: the host takes longer to issue the step than
the GPU takes to run it.

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration: an 8-channel stem, one
bottleneck block per stage with widths 16, 32, 64 and 128, 10 labels, on a batch of 2 images of 32 x 32
pixels.
GPUADVISOR_REAL_BATCH=N sets the batch (either size): at 64 the H200's eager step is bound by the host as
much as by the GPU; at 192 or more its GPU time dominates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from _real import real_batch, real_size
from torch import nn
from transformers import ResNetConfig, ResNetForImageClassification

KIND = "train"


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

FULL = dict(
    config=dict(embedding_size=64, hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3], num_labels=1000),
    batch=64,
    image=224,
)
SMALL = dict(
    config=dict(embedding_size=8, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_labels=10),
    batch=2,
    image=32,
)
SIZES = {**(FULL if SIZE == "full" else SMALL)}
SIZES["batch"] = real_batch(SIZES["batch"])


@dataclass
class TrainState:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: nn.Module


def build():
    torch.manual_seed(0)
    config = ResNetConfig(layer_type="bottleneck", hidden_act="relu", **SIZES["config"])
    with torch.device(DEVICE):
        model = ResNetForImageClassification(config)
    model = model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TrainState(model=model, optimizer=optimizer, loss_fn=nn.CrossEntropyLoss())

    num_labels = config.num_labels
    images = torch.randn(SIZES["batch"], 3, SIZES["image"], SIZES["image"], device=DEVICE)
    labels = torch.randint(0, num_labels, (SIZES["batch"],), device=DEVICE)
    # The largest class: labels drawn at random in [0, max + 1) then cover every class and stay in range.
    labels[-1] = num_labels - 1
    return state, (images, labels)


def step(state, inputs):
    images, labels = inputs
    state.optimizer.zero_grad()
    logits = state.model(pixel_values=images).logits
    loss = state.loss_fn(logits, labels)
    loss.backward()
    state.optimizer.step()
    return loss.detach()

"""One training step of timm's ResNet-50: SGD with momentum, fp32, NCHW, BatchNorm in train mode.

Full size (a CUDA machine): ``timm.create_model("resnet50", pretrained=False)``, about 25.6 M parameters
with random weights (seed 0), nothing downloaded; a batch of 64 images of 3 x 224 x 224 in float32,
channels-first (NCHW, the default memory format); ``CrossEntropyLoss`` over 1000 classes;
``SGD(lr=0.1, momentum=0.9)``. The step is the textbook loop: ``zero_grad()``, forward, loss,
``backward()``, ``optimizer.step()``, and it returns the loss (detached). The model returned by
``build()`` is a ``TrainState`` holding the module, its optimizer and the loss function.

What a performance engineer would expect on an H200: about 1.6 TFLOP of convolutions forward and
backward in fp32, which PyTorch lets cuDNN run in TF32 by default; with NCHW tensors cuDNN transposes to
NHWC around its kernels. Measured there with torch 2.11: 792 kernels and about 28 ms of GPU work per
step, no host sync; 129 ``nchwToNhwc`` transposes (about 2 ms), BatchNorm forward and backward (more
than 6 ms), and the residual adds and other elementwise kernels (about 3.5 ms) run memory-bound beside
the convolutions. ``channels_last`` cut the GPU work to about 20 ms, and bf16 autocast on top of it to
about 14 ms, but the eager step stayed at 37 to 42 ms: the host issues the kernels and autograd's
bookkeeping more slowly than the GPU runs them, so those fixes pay only together with a CUDA graph of
the step (or torch.compile).

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration: the same ``resnet50``
entry point with one bottleneck block per stage, stage widths 8, 16, 32 and 64, a stem of 8 channels and
10 classes, on a batch of 2 images of 32 x 32 pixels.
GPUADVISOR_REAL_BATCH=N sets the batch (either size): at 64 the H200's eager step is bound by the host as
much as by the GPU; at 192 or more its GPU time dominates.
"""

from __future__ import annotations

from dataclasses import dataclass

import timm
import torch
from _real import real_batch, real_size
from torch import nn

KIND = "train"


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

FULL = dict(model=dict(), num_classes=1000, batch=64, image=224)
SMALL = dict(
    # Arguments of timm's ResNet, which override the resnet50 entry point's own (layers=(3, 4, 6, 3)).
    model=dict(layers=(1, 1, 1, 1), channels=(8, 16, 32, 64), stem_width=8),
    num_classes=10,
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
    model = timm.create_model("resnet50", pretrained=False, num_classes=SIZES["num_classes"], **SIZES["model"])
    model = model.to(DEVICE).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TrainState(model=model, optimizer=optimizer, loss_fn=nn.CrossEntropyLoss())

    images = torch.randn(SIZES["batch"], 3, SIZES["image"], SIZES["image"], device=DEVICE)
    labels = torch.randint(0, SIZES["num_classes"], (SIZES["batch"],), device=DEVICE)
    # The largest class: labels drawn at random in [0, max + 1) then cover every class and stay in range.
    labels[-1] = SIZES["num_classes"] - 1
    return state, (images, labels)


def step(state, inputs):
    images, labels = inputs
    state.optimizer.zero_grad()
    loss = state.loss_fn(state.model(images), labels)
    loss.backward()
    state.optimizer.step()
    return loss.detach()

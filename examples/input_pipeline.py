"""A training step fed from pageable host memory, with a loss.item() every step: transfers and syncs.

Each step copies a 64 MB batch (8192 x 2048 fp32) from an ordinary, pageable CPU tensor to the GPU
with a blocking ``.to(device)``, runs a small MLP forward and backward, steps AdamW, and reads the
loss back with ``loss.item()`` for logging. The pageable copy goes through a staging buffer at a
fraction of what pinned memory reaches, the CPU waits for it, and ``.item()`` makes the CPU wait
for the whole step, so the GPU idles while the next step is launched.

Expect gpuadvisor to report the host-to-device copy from pageable memory (GA4xx; fix: pin the batch
and copy with non_blocking=True, or prefetch on a side stream), the host sync from ``.item()``
(GA4xx; fix: accumulate the loss on the GPU and read it every N steps), naming the source lines of
both (record with stacks), and `apply --fix graphs` to refuse because of the ``.item()``.
Without CUDA it runs a tiny version on the CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BATCH, FEATURES, HIDDEN, CLASSES = (8192, 2048, 1024, 16) if DEVICE == "cuda" else (32, 16, 32, 4)


def build():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    ).to(DEVICE)
    model.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # The batch lives in ordinary (pageable, not pinned) host memory, as a dataset read from disk would.
    features = torch.randn(BATCH, FEATURES)
    labels = torch.randint(0, CLASSES, (BATCH,))
    return model, (features, labels)


def step(model, inputs):
    features, labels = inputs
    x = features.to(DEVICE)  # blocking copy from pageable memory
    y = labels.to(DEVICE)
    loss = F.cross_entropy(model(x), y)
    model.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    model.optimizer.step()
    return loss.item()  # host sync every step, for logging

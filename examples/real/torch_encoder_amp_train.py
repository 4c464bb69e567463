"""One training step of a plain-PyTorch language model: ``nn.TransformerEncoder`` under fp16 autocast, with a
``GradScaler``, gradient clipping, AdamW and a warm-up learning-rate schedule.

Full size (a CUDA machine): an ``nn.Sequential`` of an embedding (vocabulary 8,000, width 512), a 6-layer
pre-norm ``nn.TransformerEncoder`` (8 heads, feed-forward 2,048, dropout 0.1, ``batch_first=True``) and a
linear head back to the vocabulary, about 27 M parameters with random weights (seed 0), kept in float32. The
step is the loop the PyTorch AMP recipe teaches: ``zero_grad(set_to_none=True)``, the forward and the
next-token cross-entropy under ``torch.autocast(device_type, dtype=torch.float16)``,
``scaler.scale(loss).backward()``, ``scaler.unscale_(optimizer)``, ``clip_grad_norm_(..., 1.0)``,
``scaler.step(optimizer)``, ``scaler.update()``, then ``LambdaLR.step()`` (a linear warm-up over 100 steps); it
returns the loss (detached). A batch of 32 sequences of 256 token ids; the model sees the first 255 and predicts
the last 255. The model returned by ``build()`` is a ``Trainer`` holding the module, the optimizer, the scaler
and the scheduler.

What a performance engineer would expect: GEMMs of 8,160 tokens, big enough for the tensor cores; the rest is
unfused elementwise work (LayerNorm, dropout, the feed-forward ReLU, residual adds, the casts autocast
adds), a foreach AdamW over 75 tensors, and the scaler's own kernels (the inf check over every gradient, the
scale update). ``scaler.step`` reads the inf check on the host (``.item()``), one sync per step, and the
scheduler writes a new learning rate into the optimizer in Python each step: a CUDA graph of the step as written
cannot hold either. torch.compile of the model (the optimizer and scaler stay eager around it) pays; so does
``fused=True`` for AdamW (the scaler passes its inf flag to a fused optimizer).

GPUADVISOR_REAL_SIZE=small (the default without CUDA) picks a tiny configuration under the same code: width 64,
4 heads, feed-forward 128, 2 layers, vocabulary 256, a batch of 2 sequences of 16 tokens. Autocast to fp16 and
the scaler run on the CPU too.
"""

from __future__ import annotations

import torch
from _real import real_batch, real_size
from torch import nn

KIND = "train"


SIZE = real_size()
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

FULL = dict(width=512, heads=8, ffn=2048, layers=6, vocab=8000, batch=32, tokens=256)
SMALL = dict(width=64, heads=4, ffn=128, layers=2, vocab=256, batch=2, tokens=16)
SIZES = {**(FULL if SIZE == "full" else SMALL)}
SIZES["batch"] = real_batch(SIZES["batch"])


class Trainer:
    def __init__(self):
        layer = nn.TransformerEncoderLayer(
            SIZES["width"], SIZES["heads"], SIZES["ffn"], dropout=0.1, batch_first=True, norm_first=True
        )
        self.model = nn.Sequential(
            nn.Embedding(SIZES["vocab"], SIZES["width"]),
            nn.TransformerEncoder(layer, SIZES["layers"], enable_nested_tensor=False),
            nn.Linear(SIZES["width"], SIZES["vocab"]),
        ).to(DEVICE)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.scaler = torch.amp.GradScaler(DEVICE)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: min(1.0, (step + 1) / 100))


def build():
    torch.manual_seed(0)
    trainer = Trainer()
    tokens = torch.randint(0, SIZES["vocab"], (SIZES["batch"], SIZES["tokens"]), device=DEVICE)
    # The largest id in the vocabulary: ids drawn at random in [0, max + 1) then cover all of it.
    tokens[0, -1] = SIZES["vocab"] - 1
    return trainer, (tokens,)


def step(trainer, inputs):
    (tokens,) = inputs
    trainer.optimizer.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=torch.float16):
        logits = trainer.model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    trainer.scaler.scale(loss).backward()
    trainer.scaler.unscale_(trainer.optimizer)
    torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1.0)
    trainer.scaler.step(trainer.optimizer)
    trainer.scaler.update()
    trainer.scheduler.step()
    return loss.detach()

"""A transformers GPT-2 training step on a dict batch (the shape a Trainer loop hands over), AdamW at its default.

build() returns (state, {"input_ids": ..., "labels": ...}); step(state, batch) gets the dict. A 4-layer GPT-2
(d=512, 8 heads, vocab 8192), random weights, a batch of 8 x 256 tokens; on the CPU the same model, slowly.
On the H200 (2026-12-03): `gpuadvisor apply examples/dict_batch_train.py --fix fused_optimizer,graphs` applied
both (AdamW foreach -> fused, the whole step in one CUDA graph, the dict's tensors copied into the graph's
inputs) and measured 1.90x [1.84-1.98] (benchmarks/results/apply_dict_batch_train/).
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

KIND = "train"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class State:
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer


def build():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=256)
    model = GPT2LMHeadModel(config).to(DEVICE).train()
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (8, 256), device=DEVICE)
    ids[0, -1] = config.vocab_size - 1
    return State(model, optimizer), {"input_ids": ids, "labels": ids.clone()}


def step(state, batch):
    state.optimizer.zero_grad()
    loss = state.model(**batch).loss
    loss.backward()
    state.optimizer.step()
    return loss.detach()

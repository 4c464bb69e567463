import torch
from transformers import DistilBertConfig, DistilBertForMaskedLM

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class State:
    def __init__(self):
        self.model = DistilBertForMaskedLM(DistilBertConfig()).to(DEVICE).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=5e-5, weight_decay=0.01)


def build():
    torch.manual_seed(0)
    s = State()
    ids = torch.randint(1000, 30000, (16, 256), device=DEVICE)
    labels = torch.full_like(ids, -100)
    masked = torch.rand(ids.shape, device=DEVICE) < 0.15
    labels[masked] = ids[masked]
    ids = ids.masked_fill(masked, 103)  # [MASK]
    return s, (ids, torch.ones_like(ids), labels)


def step(s, batch):
    ids, mask, labels = batch
    s.opt.zero_grad(set_to_none=True)
    loss = s.model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    s.opt.step()
    return loss.detach()

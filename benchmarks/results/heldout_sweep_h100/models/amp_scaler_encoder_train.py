import torch
from torch import nn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Trainer:
    def __init__(self):
        layer = nn.TransformerEncoderLayer(512, 8, 2048, dropout=0.1, batch_first=True, norm_first=True)
        self.model = nn.Sequential(nn.Embedding(8000, 512), nn.TransformerEncoder(layer, 6), nn.Linear(512, 8000))
        self.model.to(DEVICE).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.scaler = torch.amp.GradScaler(DEVICE, enabled=DEVICE == "cuda")
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: min(1.0, (s + 1) / 100))


def build():
    torch.manual_seed(0)
    t = Trainer()
    x = torch.randint(0, 8000, (32, 256), device=DEVICE)
    return t, (x,)


def step(t, inputs):
    (x,) = inputs
    t.opt.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=torch.float16, enabled=DEVICE == "cuda"):
        logits = t.model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 8000), x[:, 1:].reshape(-1))
    t.scaler.scale(loss).backward()
    t.scaler.unscale_(t.opt)
    torch.nn.utils.clip_grad_norm_(t.model.parameters(), 1.0)
    t.scaler.step(t.opt)
    t.scaler.update()
    t.sched.step()
    return loss.detach()

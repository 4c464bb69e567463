import timm
import torch
import torch.nn.functional as F

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class State:
    def __init__(self):
        self.model = timm.create_model("convnext_tiny", pretrained=False, num_classes=100).to(DEVICE).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.05)


def build():
    torch.manual_seed(0)
    s = State()
    x = torch.randn(32, 3, 224, 224, device=DEVICE)
    y = torch.randint(0, 100, (32,), device=DEVICE)
    return s, (x, y)


def step(s, batch):
    x, y = batch
    s.opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(s.model(x), y)
    loss.backward()
    s.opt.step()
    return loss.detach()

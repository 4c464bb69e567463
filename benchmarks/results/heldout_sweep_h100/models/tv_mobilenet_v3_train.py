import torch
import torch.nn.functional as F
import torchvision

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class State:
    def __init__(self):
        self.model = torchvision.models.mobilenet_v3_large(num_classes=1000).to(DEVICE).train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=4e-5)


def build():
    torch.manual_seed(0)
    s = State()
    x = torch.randn(64, 3, 224, 224, device=DEVICE)
    y = torch.randint(0, 1000, (64,), device=DEVICE)
    return s, (x, y)


def step(s, batch):
    x, y = batch
    s.opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(s.model(x), y, label_smoothing=0.1)
    loss.backward()
    s.opt.step()
    return loss.detach()

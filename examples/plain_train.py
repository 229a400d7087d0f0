"""A plain PyTorch training script: not durable (docs/trainer-contract.md shows the diff that makes it so).

A small MLP with dropout learns three interleaved spirals it generates, from a shuffling DataLoader,
with AdamW, a warmup-then-decay LambdaLR schedule and a noise augmentation drawn from its own generator.
Run: python examples/plain_train.py examples/specs/durable.json
"""
import itertools
import json
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset


def spirals(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    label = torch.arange(n) % 3
    r = torch.linspace(0.1, 1.0, n)
    angle = r * 4.0 + label * (2.0944) + 0.2 * torch.randn(n, generator=g)
    x = torch.stack([r * torch.cos(angle), r * torch.sin(angle)], dim=1)
    return TensorDataset(x, label)


def build(cfg: dict) -> tuple:
    hidden, p = cfg.get("hidden", 32), cfg.get("dropout", 0.1)
    model = torch.nn.Sequential(torch.nn.Linear(2, hidden), torch.nn.ReLU(), torch.nn.Dropout(p),
                                torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Dropout(p),
                                torch.nn.Linear(hidden, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.get("lr", 0.01), foreach=False)
    warmup, decay = cfg.get("warmup", 5), cfg.get("decay", 0.97)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * decay ** s)
    return model, opt, sched


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    cfg, seed = spec.get("config", {}), spec.get("seed", 0)
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    data = spirals(cfg.get("n", 240), seed)
    model, opt, sched = build(cfg)
    noise = torch.Generator().manual_seed(seed + 1)
    loader = DataLoader(data, batch_size=cfg.get("batch_size", 16), shuffle=True)
    batches = itertools.chain.from_iterable(itertools.repeat(loader))  # epoch after epoch
    for _ in range(spec["steps"]):
        x, y = next(batches)
        x = x + cfg.get("noise", 0.05) * torch.randn(x.shape, generator=noise)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    print(json.dumps({"steps": spec["steps"], "final_loss": loss.item()}))

if __name__ == "__main__":
    main()

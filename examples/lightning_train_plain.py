"""A plain PyTorch Lightning script: not durable (examples/lightning_train.py is it made durable;
docs/integrations.md shows the diff).

A LightningModule (an MLP with dropout) learns three interleaved spirals generated on the spot, from a
shuffled DataLoader, with AdamW and a warmup-then-decay LambdaLR schedule stepped every step. With
``config.val_every`` N, Lightning validates on held-out spirals every N steps (``val_check_interval``) and its
``CSVLogger`` records ``val_loss`` (in ./lightning_logs).
Run: python examples/lightning_train_plain.py examples/specs/lightning.json
"""
import json
import os
import sys

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset


def spirals(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    label = torch.arange(n) % 3
    r = torch.linspace(0.1, 1.0, n)
    angle = r * 4.0 + label * 2.0944 + 0.2 * torch.randn(n, generator=g)
    return TensorDataset(torch.stack([r * torch.cos(angle), r * torch.sin(angle)], dim=1), label)


class Classifier(L.LightningModule):
    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg, hidden, p = cfg, cfg.get("hidden", 32), cfg.get("dropout", 0.1)
        self.net = torch.nn.Sequential(torch.nn.Linear(2, hidden), torch.nn.ReLU(), torch.nn.Dropout(p),
                                       torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Dropout(p),
                                       torch.nn.Linear(hidden, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        x = x + self.cfg.get("noise", 0.05) * torch.randn_like(x)  # augmentation from the global RNG
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.cfg.get("lr", 0.01), foreach=False)
        warmup, horizon = self.cfg.get("warmup", 5), self.cfg.get("schedule_steps", 100)  # not max_steps
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1 - s / horizon))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Validated(Classifier):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        x = x + self.cfg.get("noise", 0.05) * torch.randn_like(x)  # draws from the global RNG, as training does
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))


def validation(cfg: dict, seed: int) -> tuple[dict, list]:
    """With ``config.val_every`` N, Lightning validates on held-out spirals every N steps and its CSVLogger
    records ``val_loss``: the Trainer's arguments and fit's validation loaders (none without it)."""
    if not cfg.get("val_every"):
        return {"logger": False}, []
    held_out = DataLoader(spirals(cfg.get("n_val", 48), seed + 1), batch_size=cfg.get("batch_size", 16))
    return {"val_check_interval": cfg["val_every"], "check_val_every_n_epoch": None, "num_sanity_val_steps": 0,
            "logger": CSVLogger(os.getcwd())}, [held_out]


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    cfg, seed = spec.get("config", {}), spec.get("seed", 0)
    torch.set_num_threads(1)
    L.seed_everything(seed)
    data = spirals(cfg.get("n", 240), seed)
    loader = DataLoader(data, batch_size=cfg.get("batch_size", 16), shuffle=True, num_workers=cfg.get("workers", 0))
    model = (Validated if cfg.get("val_every") else Classifier)(cfg)
    checks, held_out = validation(cfg, seed)
    trainer = L.Trainer(max_steps=spec["steps"], accelerator="cpu", devices=1,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **checks)
    trainer.fit(model, loader, *held_out)


if __name__ == "__main__":
    main()

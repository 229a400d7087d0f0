"""A small Lightning trainer for tests/integrations/test_lightning_edges.py (issue 40), written as a user
would from the docs, with Lightning's defaults left on (``logger``, ``enable_checkpointing``):

- the spec's ``config.horizon``: its OneCycleLR spans ``trainer.estimated_stepping_batches`` (Lightning's
  documented pattern, the default), ``trainer.max_steps``, or ``"spec"``: the spec's ``steps`` (a
  segment's end under ``ctl train``: wrong, it runs past its last step in the next segment);
- ``config.private_rng``: the training step adds noise drawn from a ``torch.Generator`` of its own,
  registered with ``DurableCallback(track_generators=...)`` when ``config.register`` is true.
"""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from tinyllm.durable import DurableRun, DurableSampler
from tinyllm.integrations.lightning import DurableCallback, fit


class Net(L.LightningModule):
    def __init__(self, horizon: str, spec_steps: int, noise: torch.Generator | None):
        super().__init__()
        self.horizon, self.spec_steps, self.noise = horizon, spec_steps, noise
        self.net = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.noise is not None:
            x = x + 0.1 * torch.randn(x.shape, generator=self.noise)
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=0.01, foreach=False)
        total = {
            "estimated": lambda: self.trainer.estimated_stepping_batches,
            "max_steps": lambda: self.trainer.max_steps,
            "spec": lambda: self.spec_steps,
        }[self.horizon]()
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=int(total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    run = DurableRun.from_args()
    cfg = run.config
    torch.set_num_threads(1)
    noise = torch.Generator().manual_seed(7) if cfg.get("private_rng") else None
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(48, 2, generator=g), torch.arange(48) % 3)
    loader = DataLoader(data, batch_size=8, sampler=DurableSampler(len(data), seed=run.seed))
    tracked = {"noise": noise} if noise is not None and cfg.get("register") else None
    trainer = L.Trainer(
        max_steps=run.spec["steps"],
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[DurableCallback(run, track_generators=tracked)],
    )
    fit(trainer, Net(cfg.get("horizon", "estimated"), run.spec["steps"], noise), loader)


if __name__ == "__main__":
    main()

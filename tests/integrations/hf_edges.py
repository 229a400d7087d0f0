"""A small HF ``Trainer`` script for tests/integrations/test_lightning_edges.py's HF counterpart (issue 40):
a plain torch module whose forward adds noise drawn from a ``torch.Generator`` of the script's own,
registered with ``DurableTrainer(track_generators=...)`` when the spec's ``config.register`` is true.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import TrainingArguments

from tinyllm.durable import DurableRun
from tinyllm.integrations.hf import DurableTrainer


class Noisy(torch.nn.Module):
    def __init__(self, noise: torch.Generator):
        super().__init__()
        self.noise = noise
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, labels):
        x = x + 0.1 * torch.randn(x.shape, generator=self.noise)
        return {"loss": torch.nn.functional.cross_entropy(self.lin(x), labels)}


class Points(torch.utils.data.Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(1)
        self.x, self.y = torch.randn(n, 4, generator=g), torch.arange(n) % 3

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


def main() -> None:
    run = DurableRun.from_args()
    torch.set_num_threads(1)
    noise = torch.Generator().manual_seed(7)
    args = TrainingArguments(
        output_dir="hf-out",
        max_steps=run.spec["steps"],
        per_device_train_batch_size=8,
        learning_rate=0.05,
        lr_scheduler_type="constant",
        use_cpu=True,
        report_to="none",
    )
    tracked = {"noise": noise} if run.config.get("register") else None
    DurableTrainer(run, model=Noisy(noise), args=args, train_dataset=Points(48), track_generators=tracked).train()


if __name__ == "__main__":
    main()

"""A plain Hugging Face ``Trainer`` script: not durable (examples/hf_trainer.py is it made durable;
docs/integrations.md shows the diff).

A tiny GPT-2 built from a config (no download) learns a made-up token language generated on the
spot (noisy counting sequences), with dropout, AdamW, a warmup-then-cosine schedule and gradient
accumulation. Run: python examples/hf_trainer_plain.py examples/specs/hf.json
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed


class Counting(torch.utils.data.Dataset):
    """Sequences start, start+step, ... (mod vocab) with a few tokens replaced by noise."""

    def __init__(self, n: int, length: int, vocab: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        step = torch.randint(1, 4, (n, 1), generator=g)
        seq = (start + step * torch.arange(length)) % vocab
        noise = torch.rand(n, length, generator=g) < 0.1
        self.ids = torch.where(noise, torch.randint(0, vocab, (n, length), generator=g), seq)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def evaluation(cfg: dict) -> dict:
    """HF's evaluation every ``config.eval_steps`` steps (none without it)."""
    if not cfg.get("eval_steps"):
        return {}
    return {"eval_strategy": "steps", "eval_steps": cfg["eval_steps"], "per_device_eval_batch_size": 8}


def build(cfg: dict) -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(vocab_size=cfg.get("vocab", 48), n_positions=cfg.get("length", 24),
                                      n_embd=cfg.get("n_embd", 64), n_layer=cfg.get("n_layer", 2), n_head=2,
                                      bos_token_id=0, eos_token_id=0))


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    cfg, seed = spec.get("config", {}), spec.get("seed", 0)
    torch.set_num_threads(1)
    set_seed(seed)
    data = Counting(cfg.get("n", 96), cfg.get("length", 24), cfg.get("vocab", 48), seed)
    model = build(cfg)
    args = TrainingArguments(output_dir="hf-out", max_steps=spec["steps"], save_steps=spec.get("checkpoint_every", 10),
                             per_device_train_batch_size=cfg.get("batch_size", 8),
                             gradient_accumulation_steps=cfg.get("grad_accum", 2), learning_rate=cfg.get("lr", 3e-3),
                             lr_scheduler_type="cosine", warmup_steps=cfg.get("warmup", 3), save_total_limit=2,
                             logging_steps=spec.get("log_every", 10), seed=seed, use_cpu=True, report_to="none",
                             dataloader_num_workers=cfg.get("workers", 0), **evaluation(cfg))
    held_out = Counting(cfg.get("n_eval", 32), cfg.get("length", 24), cfg.get("vocab", 48), seed + 1)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      eval_dataset=held_out if cfg.get("eval_steps") else None)
    trainer.train()


if __name__ == "__main__":
    main()

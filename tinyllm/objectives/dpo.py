"""DPO: direct preference optimisation against a frozen reference built from ``init_from``.

Per pair (x, y+, y-), with log p summed over response tokens only (the completion and its ending
newline, never the prompt) and beta = ``dpo.beta``::

    r+ = beta (log pi(y+|x) - log ref(y+|x)),  r- = beta (log pi(y-|x) - log ref(y-|x))
    loss = -log sigmoid(r+ - r-)

averaged over the pairs of a batch. At step 0 (policy = reference) the loss is ln 2 and the
margins 0. ``steps`` counts optimizer updates; each reads ``batch_size`` pairs per micro-batch
(``grad_accum_steps`` of them). Held-out validation runs the same objective in inference mode
(``evaluate``) over every held-out pair once, in file order; a short last batch only has fewer
rows, so each pair weighs once.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .common import Objective, Timer, optimizer_update, pack, token_logps
from ..posttrain_data import END, JsonlFile, check_pairs_disjoint, cursor_indices, ids, load_pairs
from .init import check_same_architecture, load_frozen, load_weights


def dpo_loss(pc: torch.Tensor, pr: torch.Tensor, rc: torch.Tensor, rr: torch.Tensor, beta: float):
    """Per-pair (loss, reward_chosen, reward_rejected) from summed log-probs of policy (p*) and reference (r*)."""
    reward_chosen = beta * (pc - rc)
    reward_rejected = beta * (pr - rr)
    return -F.logsigmoid(reward_chosen - reward_rejected), reward_chosen, reward_rejected


def pair_logps(model, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed completion log-probs (chosen, rejected) and completion token counts (chosen, rejected)."""
    prompts = [ids(r["prompt"]) for r in rows] * 2
    completions = [ids(r["chosen"] + END) for r in rows] + [ids(r["rejected"] + END) for r in rows]
    x, y, mask = pack(prompts, completions)
    seq = (token_logps(model, x, y) * mask).sum(dim=1)  # (2B,)
    counts = mask.sum(dim=1)
    n = len(rows)
    return seq[:n], seq[n:], counts[:n], counts[n:]


class DPOObjective(Objective):
    name = "dpo"

    def __init__(self, spec, home: Path, log):
        self.spec, self.home, self.cfg = spec, Path(home), spec.dpo
        self.init = load_frozen(spec.init_from, self.home, "init_from")
        check_same_architecture(self.init, spec.model, spec.init_from)
        self.pairs: JsonlFile = load_pairs(self.cfg.data.path, self.home, spec.model.block_size, "dpo.data")

    def check_heldout(self, source) -> None:
        heldout = JsonlFile(source.path, source.sha256, source.pairs)
        check_pairs_disjoint(self.pairs, heldout)

    def identity(self) -> dict:
        return {
            "objective": self.name,
            "init_digest": self.init.digest,
            "ref_digest": self.init.digest,
            "tokenizer": self.init.tokenizer,
            "pairs": self.pairs.identity(),
            "beta": self.cfg.beta,
        }

    def attach(self, trainer) -> None:
        load_weights(trainer.model, self.init)
        self.ref = self.init.frozen_model()

    def train_step(self, trainer) -> dict:
        t0 = time.perf_counter()
        timer = Timer()
        spec, accum = trainer.spec, trainer.spec.grad_accum_steps
        sums = dict.fromkeys(("loss", "rc", "rr", "acc", "pc", "pr", "refc", "refr"), 0.0)
        tokens = 0
        for _ in range(accum):
            rows = [
                self.pairs.rows[i]
                for i in cursor_indices(
                    len(self.pairs.rows), spec.batch_size, trainer.cursor, spec.seed, self.cfg.data.shuffle
                )
            ]
            trainer.cursor += 1
            tr = time.perf_counter()
            with torch.no_grad():
                refc, refr, _, _ = pair_logps(self.ref, rows)
            t1 = timer.add("ref", tr)
            pc, pr, nc, nr = pair_logps(trainer.model, rows)
            losses, rew_c, rew_r = dpo_loss(pc, pr, refc, refr, self.cfg.beta)
            (losses.mean() / accum).backward()
            timer.add("policy", t1)
            tokens += int(nc.sum() + nr.sum())
            for k, v in (
                ("loss", losses),
                ("rc", rew_c),
                ("rr", rew_r),
                ("acc", (rew_c > rew_r).float()),
                ("pc", pc),
                ("pr", pr),
                ("refc", refc),
                ("refr", refr),
            ):
                sums[k] += float(v.detach().mean()) / accum
        frame = optimizer_update(trainer, None, trainer.step)
        trainer.step += 1
        trainer.loss = sums["loss"]
        dt = time.perf_counter() - t0
        return {
            "train/loss": trainer.loss,
            "train/reward_chosen": sums["rc"],
            "train/reward_rejected": sums["rr"],
            "train/reward_margin": sums["rc"] - sums["rr"],
            "train/accuracy": sums["acc"],
            "train/logp_chosen": sums["pc"],
            "train/logp_rejected": sums["pr"],
            "train/ref_logp_chosen": sums["refc"],
            "train/ref_logp_rejected": sums["refr"],
            "train/pairs": trainer.cursor * spec.batch_size,
            **frame,
            **timer.frame(),
            "timer/step_s": dt,
            "timer/tokens_per_s": tokens / dt,
        }

    def evaluate(self, model, pairs: list[dict], batch_size: int, max_samples: int | None, on_batch=None) -> dict:
        """Held-out DPO metrics (call inside ``isolated(model)``); the seed's val/* set."""
        rows = pairs[:max_samples] if max_samples is not None else pairs
        keys = ("loss", "rc", "rr", "acc", "p_err_c", "p_err_r", "r_err_c", "r_err_r", "p_raw", "r_raw")
        sums = dict.fromkeys(keys, 0.0)
        batches = 0
        for b in range(0, len(rows), batch_size):
            chunk = rows[b : b + batch_size]
            pc, pr, nc, nr = pair_logps(model, chunk)
            refc, refr, _, _ = pair_logps(self.ref, chunk)
            losses, rew_c, rew_r = dpo_loss(pc, pr, refc, refr, self.cfg.beta)
            for k, v in (
                ("loss", losses),
                ("rc", rew_c),
                ("rr", rew_r),
                ("acc", (rew_c > rew_r).double()),
                ("p_err_c", -pc / nc),
                ("p_err_r", -pr / nr),
                ("r_err_c", -refc / nc),
                ("r_err_r", -refr / nr),
                ("p_raw", -(pc + pr) / 2),
                ("r_raw", -(refc + refr) / 2),
            ):
                sums[k] += float(v.double().sum())
            batches += 1
            if on_batch is not None:
                on_batch(batches)
        n = len(rows)
        m = {k: v / n for k, v in sums.items()}
        return {
            "val/loss": m["loss"],
            "val/reward_chosen": m["rc"],
            "val/reward_rejected": m["rr"],
            "val/reward_margin": m["rc"] - m["rr"],
            "val/accuracy": m["acc"],
            "val/policy_err_chosen": m["p_err_c"],
            "val/policy_err_rejected": m["p_err_r"],
            "val/ref_err_chosen": m["r_err_c"],
            "val/ref_err_rejected": m["r_err_r"],
            "val/policy_raw_loss": m["p_raw"],
            "val/ref_raw_loss": m["r_raw"],
            "val/pair_count": n,
            "val/batch_count": batches,
        }

"""The GRPO family: group-relative advantages with the clipped policy-gradient objective.

One trainer step = one collected batch: ``batch_size`` prompts (cursor-addressed, tinyllm.
posttrain_data) x ``rl.n_generation`` rollouts from the rollout module (pinned to the current
model step), scored by the rule rewards (summed per rollout), then ``rl.n_mini`` optimizer updates
on consecutive slices of the rollouts, each followed by a weight sync of the rollout module. So
``steps`` counts batches and the public model step (optimizer updates) is ``steps x n_mini``.

Per group g of one prompt: ``A = (r - mean_g r) / (std_g r + eps)`` (population std;
``scale_rewards: none`` drops the division). Per response token, with ratio ``p = pi/pi_old``::

    loss_t = -min(p A, clip(p, 1 - eps_c, 1 + eps_c) A) + beta * (ref/pi - log(ref/pi) - 1)

averaged over the response tokens of the slice (``beta = rl.kl_beta``, default 0; the k3 KL is
always reported as train/kl against the init_from reference). With one update per batch the ratio
is 1 and nothing is clipped (dropout 0).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..errors import SpecError
from ..model import invariant_sum
from ..validation.rewards import score
from .common import Objective, Timer, optimizer_update, pack, token_logps
from ..posttrain_data import JsonlFile, check_prompts_disjoint, cursor_indices, load_prompts
from .init import check_same_architecture, load_frozen, load_weights
from .no_signal import NoSignalWatch, warning_text
from .rollout import RolloutModule, rollout_seed


def group_advantages(rewards: torch.Tensor, scale_rewards: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages relative to each prompt's group."""
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if scale_rewards == "none":
        return centered
    return centered / (rewards.std(dim=1, unbiased=False, keepdim=True) + eps)


def clipped_objective(
    new_logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, clip_ratio, mean ratio) over the masked tokens; ``adv`` broadcasts to (N, T)."""
    ratio = torch.exp(new_logp - old_logp)
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    n = invariant_sum(mask)  # sums as invariant_sum: the same bits for any thread count (tinyllm/model.py)
    loss = invariant_sum(per_token * mask) / n
    clip_ratio = invariant_sum(((ratio - clipped).abs() > 0).float() * mask) / n
    return loss, clip_ratio.detach(), (invariant_sum(ratio * mask) / n).detach()


def k3_kl(new_logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token ``ref/pi - log(ref/pi) - 1`` (>= 0, unbiased for KL(pi || ref) on pi's samples)."""
    d = ref_logp - new_logp
    return torch.exp(d) - d - 1.0


class GRPOObjective(Objective):
    name = "grpo"
    watches_signal = True  # a window of batches with zero advantages warns once (no_signal.py); OPD: False

    def __init__(self, spec, home: Path, log):
        self.spec, self.home, self.cfg = spec, Path(home), spec.rl
        self.updates_per_step = self.cfg.n_mini
        self.sampling = self.cfg.sampling.resolved(self.cfg.n_generation)
        self.init = None
        if spec.init_from is not None:
            self.init = load_frozen(spec.init_from, self.home, "init_from")
            check_same_architecture(self.init, spec.model, spec.init_from)
        d = self.cfg.data
        self.prompts: JsonlFile = load_prompts(
            d.path,
            self.home,
            d.prompt_column,
            d.response_column,
            spec.model.block_size,
            self.cfg.sampling.max_tokens,
            "rl.data",
        )
        self.build_ref = self.init is not None and (
            self.name == "grpo" or self.cfg.kl_beta > 0 or bool(spec.ref and spec.ref.build_ref)
        )
        if self.cfg.kl_beta > 0 and self.init is None:
            raise SpecError("rl.kl_beta > 0 needs a reference model, built from init_from; set init_from")

    def check_heldout(self, source) -> None:
        check_prompts_disjoint(self.prompts, source.path, source.sha256, [p["prompt"] for p in source.prompts])

    def identity(self) -> dict:
        return {
            "objective": self.name,
            "init_digest": self.init.digest if self.init else None,
            "ref_digest": self.init.digest if self.build_ref and self.init else None,
            "tokenizer": {"kind": "byte", "vocab_size": self.spec.model.vocab_size},
            "prompts": self.prompts.identity(),
            "sampling": self.sampling,
        }

    def attach(self, trainer) -> None:
        if self.init is not None:
            load_weights(trainer.model, self.init)
        self.ref = self.init.frozen_model() if self.build_ref and self.init is not None else None
        self.rollout = RolloutModule(trainer.model, version=0)
        self.watch = NoSignalWatch(trainer.total_steps) if self.watches_signal else None

    def components(self, trainer) -> dict:
        state = super().components(trainer)
        state["posttrain"]["rollout_version"] = self.rollout.version
        if self.watch is not None:
            state["posttrain"]["no_signal"] = self.watch.state()
        return state

    def on_resume(self, trainer, components: dict) -> None:
        super().on_resume(trainer, components)
        model_step = trainer.step * self.updates_per_step
        recorded = components["posttrain"].get("rollout_version")
        if recorded != model_step:
            raise SpecError(
                f"checkpoint {trainer.resumed_from}: rollout weight version {recorded} != model step "
                f"{model_step}; refusing to resume"
            )
        self.rollout.sync(trainer.model, model_step)
        if self.watch is not None:
            self.watch.restore(components["posttrain"].get("no_signal"))

    def validation_model(self):
        return self.rollout

    # -- one collected batch --------------------------------------------------------------------
    def advantages(
        self, rollouts, rewards: torch.Tensor, mask: torch.Tensor, timer: Timer
    ) -> tuple[torch.Tensor, dict]:
        """(N, 1) advantages of the batch's rollouts (N = P x G), and extra train/* metrics."""
        P, G = self.spec.batch_size, self.cfg.n_generation
        adv = group_advantages(rewards.view(P, G), self.cfg.scale_rewards, self.cfg.adv_eps)
        return adv.reshape(-1, 1).float(), {}

    def train_step(self, trainer) -> dict:
        t0 = time.perf_counter()
        timer = Timer()
        spec, cfg = trainer.spec, self.cfg
        model_step = trainer.step * self.updates_per_step
        rows = [
            self.prompts.rows[i]
            for i in cursor_indices(
                len(self.prompts.rows), spec.batch_size, trainer.cursor, spec.seed, cfg.data.shuffle
            )
        ]
        G = cfg.n_generation
        prompts = [r["prompt"] for r in rows for _ in range(G)]
        seeds = [rollout_seed(spec.seed, trainer.cursor, i, g) for i in range(len(rows)) for g in range(G)]
        ro = self.rollout.sample(prompts, seeds, self.sampling, spec.model.block_size, expected_version=model_step)
        t1 = timer.add("rollout", t0)
        rewards = torch.tensor(
            [sum(score(cfg.reward, text, rows[k // G]["response"]).values()) for k, text in enumerate(ro.texts)],
            dtype=torch.float64,
        )
        x, y, mask = pack(ro.prompts, ro.completions)
        ref_logp = None
        if self.ref is not None:
            with torch.no_grad():
                ref_logp = token_logps(self.ref, x, y)
            t1 = timer.add("ref", t1)
        adv, extra = self.advantages(ro, rewards, mask, timer)
        t1 = time.perf_counter()
        losses, clips, ratios, kls, optim = [], [], [], [], {}
        for j, idx in enumerate(torch.arange(len(prompts)).tensor_split(cfg.n_mini)):
            new = token_logps(trainer.model, x[idx], y[idx])
            m = mask[idx]
            loss, clip_ratio, ratio = clipped_objective(new, ro.old_logps[idx], adv[idx], m, cfg.clip_eps)
            if ref_logp is not None:
                kl = invariant_sum(k3_kl(new, ref_logp[idx]) * m) / invariant_sum(m)
                if cfg.kl_beta > 0:
                    loss = loss + cfg.kl_beta * kl
                kls.append(float(kl.detach()))
            losses.append(float(loss.detach()))
            clips.append(float(clip_ratio))
            ratios.append(float(ratio))
            optim = optimizer_update(trainer, loss, model_step + j)
            self.rollout.sync(trainer.model, model_step + j + 1)
        timer.add("update", t1)
        trainer.step += 1
        trainer.cursor += 1
        trainer.loss = sum(losses) / len(losses)
        group_std = rewards.view(len(rows), G).std(dim=1, unbiased=False)
        warn = self.watch.observe(rewards.view(len(rows), G).tolist()) if self.watch is not None else {}
        if warn:
            print(
                f"tinyllm: warning: {spec.name}: {warning_text({**warn, 'step': trainer.step})}",
                file=trainer.log,
                flush=True,
            )
        frame = {
            "train/loss": trainer.loss,
            "train/reward_mean": float(rewards.mean()),
            "train/reward_std": float(rewards.std(unbiased=False)),
            "train/frac_reward_zero_std": float((group_std == 0).double().mean()),
            "train/clip_ratio": sum(clips) / len(clips),
            "train/ratio_mean": sum(ratios) / len(ratios),
            **({"train/kl": sum(kls) / len(kls)} if kls else {}),
            **extra,
            "train/model_step": trainer.step * self.updates_per_step,
            "rollout/mean_length": float(mask.sum(dim=1).mean()),
            "rollout/count": len(prompts),
            "rollout/weight_version": ro.version,
            **optim,
            **warn,
        }
        dt = time.perf_counter() - t0
        return {
            **frame,
            **timer.frame(),
            "timer/step_s": dt,
            "timer/rollouts_per_s": len(prompts) / dt,
            "timer/updates_per_s": cfg.n_mini / dt,
        }

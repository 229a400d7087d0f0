"""The trainer's optimizer (tinyllm.trainer.make_optimizer, foreach=True for speed) takes bitwise the
same steps as AdamW with foreach=False (the trainer's optimizer until now, and the checkpoints it
wrote), on the real GPT with the trainer's two parameter groups; and a checkpoint's optimizer state
saved with foreach=False resumes with foreach on."""

from __future__ import annotations

import json

import pytest

import torch

from tinyllm.model import GPT
from tinyllm.spec import parse_train_spec
from tinyllm.trainer import Trainer, lr_at, make_optimizer
from tl_helpers import SMALL_SPEC


def _spec(**changes):
    data = json.loads(SMALL_SPEC.read_text())
    data.update(changes)
    return parse_train_spec(data)


def _steps(spec, build, n: int = 12):
    torch.manual_seed(spec.seed)
    model = GPT(spec.model)
    opt = build(model)
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(0, model.cfg.vocab_size, (4, spec.model.block_size), generator=gen)  # 256: no corpus, bytes
    for step in range(n):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, spec)
        _, loss = model(x, x.roll(1, dims=1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()] + [
        v.clone() for s in opt.state.values() for v in s.values()
    ]


@pytest.mark.slow
def test_trainer_optimizer_steps_equal_single_tensor_adamw_bitwise():
    spec = _spec(model={"block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32})

    def single(model):
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=lr_at(0, spec),
            betas=(spec.beta1, spec.beta2),
            foreach=False,
        )

    ours = _steps(spec, lambda m: make_optimizer(m, spec))
    reference = _steps(spec, single)
    assert len(ours) == len(reference)
    assert all(torch.equal(a, b) for a, b in zip(ours, reference))


def test_a_checkpoint_saved_with_foreach_off_resumes_with_it_on(home, monkeypatch):
    import tinyllm.trainer as trainer_module

    spec = _spec(steps=2, checkpoint_every=2)

    def foreach_off(model, spec):
        opt = make_optimizer(model, spec)
        for group in opt.param_groups:
            group["foreach"] = False  # as the trainer built it before foreach was on
        return opt

    monkeypatch.setattr(trainer_module, "make_optimizer", foreach_off)
    Trainer(spec, home).run()
    opt_file = next((home / "runs" / spec.name / "ckpt").glob("step-*/optimizer.pt"))
    assert not any(g["foreach"] for g in torch.load(opt_file, weights_only=False)["param_groups"])
    monkeypatch.undo()
    resumed = Trainer(spec.model_copy(update={"steps": 3}), home)
    resumed.run()
    assert resumed.resumed_from is not None and all(g["foreach"] for g in resumed.optimizer.param_groups)

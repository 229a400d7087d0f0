"""examples/plain_train.py made durable with tinyllm.durable (see docs/trainer-contract.md for the diff).

It follows the trainer contract, so `ctl train --spec examples/specs/durable.json` runs it as a
durable workflow and `ctl verify-resume --spec examples/specs/durable.json` proves it exact.
The spec's config may name pieces to `forget` (not track): the broken variants in
examples/specs/forget-*.json, which verify-resume catches and diagnoses.
"""
import time

import torch
from torch.utils.data import DataLoader

from plain_train import build, spirals
from tinyllm.durable import DurableRun, DurableSampler


def main() -> None:
    run = DurableRun.from_args()
    cfg, seed = run.config, run.seed
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    data = spirals(cfg.get("n", 240), seed)
    model, opt, sched = build(cfg)
    noise = torch.Generator().manual_seed(seed + 1)
    sampler = DurableSampler(len(data), seed=seed)
    loader = DataLoader(data, batch_size=cfg.get("batch_size", 16), sampler=sampler,
                        num_workers=cfg.get("workers", 0))  # run.batches() makes workers leave stops to this process
    pieces = dict(model=model, optimizer=opt, scheduler=sched, data=sampler, generators={"noise": noise})
    for piece in cfg.get("forget", []):  # the broken variants: one piece of state not tracked
        pieces.pop(piece)
    run.track(**pieces)
    batches = run.batches(loader)
    for _ in run.steps():
        x, y = batch = next(batches)
        x = x + cfg.get("noise", 0.05) * torch.randn(x.shape, generator=noise)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        run.log(loss, batch=batch)
        time.sleep(cfg.get("step_sleep_s", 0))  # a stand-in for a bigger model (the tests' kills need time)


if __name__ == "__main__":
    main()

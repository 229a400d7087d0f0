"""A torch-free trainer that follows the trainer contract (contracts/subprocess-activity.md) in a few
lines, unless its spec's ``config.bad`` names a rule to break: the tests' stand-in for a user's loop.

"Training" is arithmetic on the step (deterministic, resumable from any checkpoint); each step
sleeps ``config.step_s`` so a poller sees every step. ``config.bad``: ``short`` (exit 0 before
``steps``), ``no-result``, ``malformed``, ``not-last`` (result line), ``term-exit0`` (SIGTERM answered
with exit 0 at once), ``term-no-ckpt`` (exit 130 without a checkpoint), ``silent`` (no progress line
for ``config.silent_s`` at step 4), ``schedule-over-steps`` (the LR decays over the spec's ``steps``, which
each segment of ``ctl train`` changes, instead of over the run's ``CTL_RUN_STEPS``); the data mistakes
of real loops: ``read-ahead`` (a batch prefetched before the loop, its position saved one past it),
``plain-cursor`` (the position in a variable that is not saved), ``unregistered-shuffle`` (batches drawn
by an RNG that is not saved), ``draw-after-restore`` (the global RNG drawn once after its restore, as
DataLoader.__iter__ does when the iterator is made after the resume). ``config.metrics_at_end``: the
step records are written only after the last step's checkpoint, then it waits ``config.end_s`` before
its result line (a poller that signals on a step record sees none before the run is done).
``term-train-on`` (on SIGTERM it checkpoints the step, then trains two steps more before it exits 130:
they are lost), ``resume-cadence`` (a resume picks the newest checkpoint on the ``checkpoint_every``
cadence, not LATEST: a stop's off-cadence checkpoint is skipped, and its resume line says so).
On SIGTERM it writes the contract's ``{"event": "stopping", "step", "signal"}`` line first.
``config.stop_at``: early stopping at that step (a checkpoint there, ``stopped_early`` in the result, exit 0
before ``steps``), and at once when resumed there, as tinyllm reads its decision from the checkpoint.
"""

import argparse
import hashlib
import json
import os
import random
import signal
import sys
import time

p = argparse.ArgumentParser()
for flag in ("--spec", "--home", "--progress", "--resume"):
    p.add_argument(flag)
args = p.parse_args()
spec = json.load(open(args.spec))
cfg, name, steps, every = spec.get("config", {}), spec["name"], spec["steps"], spec.get("checkpoint_every", 3)
bad = cfg.get("bad", "")
run = os.path.join(args.home, "runs", name)
ckdir = os.path.join(run, "ckpt")
os.makedirs(ckdir, exist_ok=True)
progress = open(args.progress, "a") if args.progress else None


def emit(**line):
    if progress:
        progress.write(json.dumps({"time": time.time(), **line}) + "\n")
        progress.flush()


def loss_at(step, w):
    return 1.0 / (1.0 + step) + w * 1e-3


def save(step, w):
    extra = {"rng": list(random.getstate())}
    if bad != "plain-cursor":
        extra["pos"] = pos
    tmp, final = os.path.join(ckdir, f".tmp-{step:06d}"), os.path.join(ckdir, f"step-{step:06d}")
    os.makedirs(tmp, exist_ok=True)
    json.dump({"step": step, "w": w, **extra}, open(os.path.join(tmp, "manifest.json"), "w"))
    if os.path.exists(final):
        os.rename(final, final + ".old")
    os.rename(tmp, final)
    with open(os.path.join(ckdir, "LATEST.tmp"), "w") as f:
        f.write(f"step-{step:06d}")
    os.replace(os.path.join(ckdir, "LATEST.tmp"), os.path.join(ckdir, "LATEST"))
    emit(
        step=step,
        loss=loss_at(step, w),
        loss_hex=loss_at(step, w).hex(),
        checkpoint=f"runs/{name}/ckpt/step-{step:06d}",
    )


def result(step, w, canceled=False):
    loss = loss_at(step, w)
    early = (
        {"stopped_early": {"step": step, "best_step": step}} if cfg.get("stop_at") and step == cfg["stop_at"] else {}
    )
    return json.dumps(
        {
            "name": name,
            "steps": step,
            "checkpoint": f"runs/{name}/ckpt/step-{step:06d}",
            "final_loss": loss,
            "final_loss_hex": loss.hex(),
            "digest": hashlib.sha256(str(w).encode()).hexdigest(),
            "resumed_from": None,
            "canceled": canceled,
            **early,
        },
        sort_keys=True,
    )


step, w, pos = 0, 0.0, 0
random.seed(spec.get("seed", 0))
perm = random.Random(7).sample(range(10), 10)
data_rng = random.Random(8)  # draws the batches in unregistered-shuffle; never saved
try:
    latest = open(os.path.join(ckdir, "LATEST")).read().strip()
    if bad == "resume-cadence":
        latest = max(d for d in os.listdir(ckdir) if d.startswith("step-") and int(d[5:]) % every == 0)
    state = json.load(open(os.path.join(ckdir, latest, "manifest.json")))
    step, w, pos = state["step"], state["w"], state.get("pos", 0)
    random.setstate((state["rng"][0], tuple(state["rng"][1]), state["rng"][2]))
    if bad == "draw-after-restore":
        random.random()  # DataLoader.__iter__'s base seed, drawn from the global RNG after the restore
except OSError:
    pass


def next_batch():
    global pos
    pos += 1
    return data_rng.randrange(100) if bad == "unregistered-shuffle" else perm[(pos - 1) % 10]


nxt = next_batch() if bad == "read-ahead" else None
frames = []
try:
    frames = [ln for ln in open(os.path.join(run, "metrics.jsonl")) if json.loads(ln)["step"] <= step]
except OSError:
    pass
with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    f.writelines(frames)
metrics = open(os.path.join(run, "metrics.jsonl"), "a")
late = [] if cfg.get("metrics_at_end") else None
if step:
    emit(event="resume", step=step, resumed_from=f"runs/{name}/ckpt/step-{step:06d}")
emit(event="ready", step=step)

stop = []
if bad == "term-exit0":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
elif bad == "term-no-ckpt":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
else:
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
last = steps - 4 if bad == "short" else steps
horizon = steps if bad == "schedule-over-steps" else int(os.environ.get("CTL_RUN_STEPS", steps))
stop_at = cfg.get("stop_at") or 0
noticed = False


def notice():
    """The step boundary where the stop is seen: the contract's stopping line, before the checkpoint."""
    global noticed, last
    noticed = True
    emit(event="stopping", step=step, signal="SIGTERM")
    if bad == "term-train-on":
        save(step, w)
        last = min(last, step + 2)


while step < last and not (stop and bad != "term-train-on") and not (stop_at and step >= stop_at):
    time.sleep(cfg.get("step_s", 0.05))
    if bad == "silent" and step == 4:
        time.sleep(cfg.get("silent_s", 3.0))
    step += 1
    lr = 0.1 * (1 - (step - 1) / horizon)
    if bad == "read-ahead":
        batch, nxt = nxt, next_batch()
    else:
        batch = next_batch()
    w = w * 0.5 + step * lr + batch * 0.01 + random.random() * 1e-3
    frame = (
        json.dumps(
            {
                "step": step,
                "train/loss": loss_at(step, w),
                "train/loss_hex": loss_at(step, w).hex(),
                "optim/lr_hex": [lr.hex()],
                "data/batch": str(batch),
            }
        )
        + "\n"
    )
    if late is not None:
        late.append(frame)
    else:
        metrics.write(frame)
        metrics.flush()
    if stop and not noticed:
        notice()
        if bad == "term-train-on":
            continue
    if bad == "term-train-on" and noticed:
        emit(event="progress", step=step)
    elif step % every == 0 or step == last or stop or step == stop_at:
        save(step, w)
    else:
        emit(event="progress", step=step)
if stop and not noticed:  # it came between two steps, after the last one's check
    notice()
    save(step, w)
if late:  # some steps trained: their records now, then a wait before the result line
    metrics.writelines(late)
    metrics.flush()
    time.sleep(cfg.get("end_s", 0))
if bad == "no-result":
    sys.exit(0)
line = result(step, w, canceled=bool(stop))
if bad == "malformed":  # the loss as repr, not float.hex
    line = line.replace(loss_at(step, w).hex(), repr(loss_at(step, w)))
print(line)
if bad == "not-last":
    print("bye")
sys.exit(130 if stop else 0)

"""``ctl verify-resume``'s comparison, pure: per-step records, the first difference, and the diagnosis of
what a resume most likely did not restore (from the helper's state fingerprints, then the pattern).
"""

from __future__ import annotations

import json
from pathlib import Path

EXPLAIN = {
    "model": "the model weights",
    "optimizer": "the optimizer state (its moments)",
    "optimizer/entries": "the optimizer state (its moments)",
    "lr": "the optimizer's learning rates",
    "scheduler": "the LR scheduler",
    "scaler": "the gradient scaler",
    "data": "the data position",
    "cursor": "the data position (cursor)",
}


# how a trainer registers an RNG of its own (a torch.Generator, random.Random, numpy Generator), by the
# ``trainer`` its progress lines name (tinyllm/integrations/contract.py); the helper's otherwise
REGISTER = {
    "tinyllm.integrations.hf": "DurableTrainer(run, ..., track_generators={{'{name}': g}})",
    "tinyllm.integrations.lightning": "DurableCallback(run, track_generators={{'{name}': g}})",
}


def register_call(kind: str | None, name: str = "aug") -> str:
    """The call that registers a generator ``g`` under ``name`` for the trainer kind in use."""
    return REGISTER.get(kind or "", "run.track(generators={{'{name}': g}})").format(name=name)


def _explain(key: str) -> str:
    return EXPLAIN.get(key, f"the RNG {key[4:]}" if key.startswith("rng/") else key)


def step_records(metrics_path: Path) -> dict[int, dict]:
    """``{step: record}`` of a run's metrics.jsonl: loss bits, lr bits, batch digest, state fingerprint."""
    out: dict[int, dict] = {}
    try:
        data = metrics_path.read_bytes()
    except OSError:
        return out
    for line in data.splitlines():
        try:
            frame = json.loads(line)  # bytes: a line that is no UTF-8 is a ValueError, skipped
        except ValueError:
            continue
        if not isinstance(frame, dict) or not isinstance(frame.get("step"), int) or "train/loss" not in frame:
            continue
        rec = {"loss": frame.get("train/loss_hex") or float(frame["train/loss"]).hex()}
        if "optim/lr_hex" in frame:
            rec["lr"] = frame["optim/lr_hex"]
        elif isinstance(frame.get("optim/lr"), float):
            rec["lr"] = [frame["optim/lr"].hex()]
        if "data/batch" in frame:
            rec["batch"] = frame["data/batch"]
        if isinstance(frame.get("state"), dict):
            rec["state"] = frame["state"]
        out[frame["step"]] = rec
    return out


def tracked_and_kind(lines: list[dict]) -> tuple[list[str] | None, str | None]:
    """What the trainer's run tracks, from its ``start`` line (a framework integration registers the
    optimizer, scheduler and data only once its loop starts: its earlier ``ready`` line lists the model
    alone), and the trainer kind its lines name (an integration's ``trainer``; None: tinyllm.durable)."""
    start = next((ln for ln in lines if ln.get("event") == "start" and "tracked" in ln), None)
    if start is None:
        start = next((ln for ln in reversed(lines) if "tracked" in ln), {})
    kind = next((ln["trainer"] for ln in lines if isinstance(ln.get("trainer"), str)), None)
    return start.get("tracked"), kind


def first_difference(ref: dict[int, dict], got: dict[int, dict]) -> tuple[int | None, list[str]]:
    """The first step whose loss, lr or batch differs (or that one run lacks), and which of them."""
    for step in sorted(set(ref) | set(got)):
        a, b = ref.get(step), got.get(step)
        if a is None or b is None:
            return step, ["missing"]
        keys = [k for k in ("batch", "loss", "lr") if k in a and k in b and a[k] != b[k]]
        if keys:
            return step, keys
    return None, []


def diagnose(
    ref: dict[int, dict],
    got: dict[int, dict],
    resumes: list[tuple[int, dict | None]],
    ref_states: dict[int, dict],
    tracked: list[str] | None = None,
    kind: str | None = None,
) -> tuple[int | None, str, list[str]]:
    """(first differing step, one-paragraph diagnosis, suspected state keys); (None, "", []) when equal.
    ``kind``: the trainer its progress lines name (``tinyllm.integrations.hf``/``.lightning``; None: the
    helper's ``tinyllm.durable``), so that the fix named is a call that trainer has."""
    step, what = first_difference(ref, got)
    if step is None:
        return None, "", []
    if what == ["missing"]:
        return (
            step,
            f"step {step} is recorded by only one of the runs (the resumed run skipped or repeated steps)",
            ["steps"],
        )
    before = [r for r in resumes if r[0] < step]
    if not before:
        return (
            step,
            (
                f"step {step} differs ({', '.join(what)}) before any resume: the trainer is not deterministic "
                "from run to run (seeds, nondeterministic kernels, thread counts)"
            ),
            ["determinism"],
        )
    r_step, r_state = max(before, key=lambda r: r[0])
    if step == r_step + 1:
        head = f"step {step} is the first after the resume from step {r_step} and differs ({', '.join(what)})"
    else:
        head = (
            f"step {step} is the first that differs ({', '.join(what)}), {step - r_step} steps after the resume "
            f"from step {r_step}"
        )
    ref_state = ref_states.get(r_step)
    facts = []
    if r_step in ref and r_step in got:
        facts.append(f"step {r_step}'s loss equal")
    data_equal = None  # the tracked data position at the resume: equal, different, or not seen (None)
    if r_state is not None and ref_state is not None:
        differing = sorted(k for k in set(ref_state) | set(r_state) if ref_state.get(k) != r_state.get(k))
        if differing:
            suspects = _dedupe(differing)
            detail = ""
            if "optimizer/entries" in differing and r_state.get("optimizer/entries") == 0:
                detail = " (the resumed optimizer has no state at all: a fresh optimizer)"
            untracked = [k for k in suspects if tracked is not None and k not in tracked and not k.startswith("rng/")]
            not_tracked = f"; not tracked by the helper: {', '.join(untracked)}" if untracked else ""
            return (
                step,
                (
                    f"{head}: not restored: {', '.join(_explain(k) for k in suspects)}{detail} -- right after "
                    f"the resume these differ from the uninterrupted run's at step {r_step}: "
                    f"{', '.join(differing)}{not_tracked}"
                ),
                suspects,
            )
        facts.append(f"all the helper sees was equal at the resume: {', '.join(sorted(ref_state))}")
        if "data" in ref_state:
            data_equal = True

    def hint(piece: str) -> str:
        if tracked is None or piece in tracked or data_equal:
            return ""
        if kind is None:
            return f"; no {piece} is tracked: pass {piece}=... to run.track()"
        if kind.endswith(".lightning") and piece == "data":
            return (
                "; no data position is tracked: give the training DataLoader "
                "sampler=DurableSampler(len(dataset), seed=run.seed)"
            )
        return ""

    same = f" ({'; '.join(facts)})" if facts else ""
    if "batch" in what:
        return _batch_differs(step, head, r_step, ref, got, hint, same, kind, data_equal)
    if what == ["lr"]:
        return (
            step,
            (
                f"{head}: the LR scheduler was not restored (the learning rate after step {step} differs "
                f"while its loss is equal){hint('scheduler')}{same}"
            ),
            ["scheduler"],
        )
    if step == r_step + 1:
        if "batch" in ref.get(step, {}) and "batch" in got.get(step, {}):
            if kind is not None:  # the integrations restore every global RNG and make the loader's iterator themselves
                return (
                    step,
                    (
                        f"{head}: an RNG the integration does not see was not restored (step {step}'s batch "
                        f"is equal): a generator of your own (torch.Generator, random.Random, a NumPy "
                        f"Generator) drawn in the training step: register it: {register_call(kind)}"
                        f"{same}"
                    ),
                    ["rng"],
                )
            return (
                step,
                (
                    f"{head}: an RNG the helper does not see was not restored (step {step}'s batch is equal; "
                    f"register it: {register_call(kind, '...')}), or a global RNG was drawn after the restore, "
                    f"before the step (a DataLoader iterator made after the resume draws its base seed from "
                    f"torch's global RNG in DataLoader.__iter__: make the iterator before the restore, or give "
                    f"the DataLoader its own generator= and register it){same}"
                ),
                ["rng"],
            )
        return step, f"{head}: the data position or an RNG was not restored{same}", ["data", "rng"]
    return (
        step,
        (
            f"{head}: the update after the resume differed: the optimizer state (moments) or the LR "
            f"schedule was not restored{same}"
        ),
        ["optimizer", "scheduler"],
    )


def _batches(records: dict[int, dict], first: int, n: int = 3) -> list | None:
    out = [records.get(s, {}).get("batch") for s in range(first, first + n)]
    return out if all(b is not None for b in out) else None


def _batch_differs(
    step: int,
    head: str,
    r_step: int,
    ref: dict[int, dict],
    got: dict[int, dict],
    hint,
    same: str,
    kind: str | None = None,
    data_equal: bool | None = None,
) -> tuple[int, str, list[str]]:
    """The batch after a resume differs: read ahead (the resumed batches are the reference's k steps later),
    restarted from the beginning (a position kept in a plain variable), or another order (an RNG that
    draws the data was not restored). ``data_equal``: the tracked data position was equal at the resume,
    so the batches' contents, not the position, differ."""
    seen = _batches(got, step)
    register = register_call(kind, "data")
    if seen is not None:
        for k in (1, 2, 3):
            if _batches(ref, step + k) == seen:
                return (
                    step,
                    (
                        f"{head}: the loader reads {k} batch(es) ahead of the step: the resumed run's batches "
                        f"from step {step} are the uninterrupted run's from step {step + k}, so the data position "
                        f"saved with step {r_step} was already {k} batch(es) past that step's batch (a batch "
                        f"prefetched before the loop, accelerate's DataLoaderShard): take each batch inside the "
                        f"step (batch = next(batches) in the loop), or save the position of the batch in use"
                        f"{same}"
                    ),
                    ["data/read-ahead"],
                )
        if step > 1 and _batches(ref, 1) == seen:
            own = (
                "keep it in run.cursor (saved and restored), or pass data=... (a sampler with state_dict) to "
                "run.track(); or"
                if kind is None
                else "or"
            )
            return (
                step,
                (
                    f"{head}: the data position was not restored: it restarted from the beginning at the "
                    f"resume (step {step}'s batches are steps 1.. of the uninterrupted run): a position kept in "
                    f"a plain variable (i = 0; batch = data[i]) is not saved: {own} an RNG that "
                    f"draws the data (DataLoader(shuffle=True, generator=g), a sampler's own generator) started "
                    f"again from its seed: register it: {register}{same}"
                ),
                ["cursor", "rng/data"],
            )
    if data_equal:
        return (
            step,
            (
                f"{head}: the data position was restored (the tracked data state was equal at the resume), "
                f"yet step {step}'s batch differs: an RNG that draws the data was not restored: one that "
                f"shuffles it (DataLoader(shuffle=True, generator=g), a sampler's own generator): register it: "
                f"{register}; or one drawn while loading an item (a random augmentation in __getitem__ or the "
                f"collate function, which the loader runs ahead of the step): derive it from the item "
                f"(torch.Generator().manual_seed(seed * len(data) + index)), which no resume can change"
                f"{same}"
            ),
            ["rng/data"],
        )
    position = "a position of the loop's own: run.cursor" if kind is None else "a sampler: DurableSampler"
    return (
        step,
        (
            f"{head}: the data position was not restored (step {step}'s batch differs): if an RNG draws the "
            f"data (DataLoader(shuffle=True, generator=g), a sampler's own generator), register it: "
            f"{register}; {position}{hint('data')}{same}"
        ),
        ["data"],
    )


def _dedupe(keys: list[str]) -> list[str]:
    out = []
    for k in keys:
        k = "optimizer" if k == "optimizer/entries" else k
        if k == "lr" and "optimizer" in keys:
            continue  # the learning rates live in the optimizer state
        if k not in out:
            out.append(k)
    return out

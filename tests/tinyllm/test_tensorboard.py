"""The TensorBoard sink, read back from its event files: the same names and values as
metrics.jsonl, one event per frame, and a run resumed from an older checkpoint continuing the
same step axis without duplicates (the resumed steps' figures are metrics.jsonl's, whose
bitwise equality with an uninterrupted run tests/tinyllm/test_resume.py proves)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader  # noqa: E402
from tensorboard.compat.proto.event_pb2 import Event  # noqa: E402

from tinyllm.sinks.tensorboard_sink import event_files  # noqa: E402
from tl_helpers import run_tinyllm, write_spec  # noqa: E402

pytestmark = pytest.mark.slow  # real tinyllm train runs

TINY = dict(batch_size=4, checkpoint_every=4, model={"block_size": 32, "n_layer": 1, "n_head": 2, "n_embd": 32})


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every event file of ``log_dir``, in file order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in event_files(log_dir):
        for record in RawEventFileLoader(str(path)).Load():
            e = Event.FromString(record)
            if e.HasField("summary"):
                for v in e.summary.value:
                    out.setdefault(v.tag, []).append((e.step, v.simple_value))
    return out


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def frames(home: Path) -> list[dict]:
    return [json.loads(x) for x in (home / "runs/small/metrics.jsonl").read_text().splitlines()]


def test_resumed_run_continues_the_step_axis_without_duplicates(home: Path) -> None:
    p = run_tinyllm(home, "train", "--spec", str(write_spec(home / "a.json", steps=8, **TINY)))
    assert p.returncode == 0, p.stderr
    assert [s for s, _ in read_scalars(home / "runs/small/tensorboard")["train/loss"]] == list(range(1, 9))
    (first,) = event_files(home / "runs/small/tensorboard")
    events = [e for r in RawEventFileLoader(str(first)).Load() if (e := Event.FromString(r)).HasField("summary")]
    assert [e.step for e in events] == list(range(1, 9))  # one event per frame, all of its scalars in it
    assert {v.tag for v in events[0].summary.value} == {k for k in frames(home)[0] if k not in ("step", "time")}
    # resume from the older checkpoint at step 4: the events of steps 5..8 are written again
    p = run_tinyllm(
        home,
        "train",
        "--spec",
        str(write_spec(home / "b.json", steps=10, **TINY)),
        "--resume",
        str(home / "runs/small/ckpt/step-000004"),
    )
    assert p.returncode == 0, p.stderr
    scalars = read_scalars(home / "runs/small/tensorboard")
    jsonl = frames(home)
    assert [f["step"] for f in jsonl] == list(range(1, 11))
    for tag in ("train/loss", "optim/lr", "optim/grad_norm", "timer/tokens_per_s"):
        assert [s for s, _ in scalars[tag]] == list(range(1, 11)), tag  # no duplicate, no gap
        assert [v for _, v in scalars[tag]] == [f32(f[tag]) for f in jsonl], tag  # the same figures
    assert len(event_files(home / "runs/small/tensorboard")) == 2  # one per invocation, the first cut back

"""The real workflow functions on a real Temporal dev server, over the fake activities of
tests/workflows/wf_fakes.py (the trainer is not the point here; test_tmp_ctl.py runs the real one).

The hand example of the seed (section 3) gives the same commands, results and evaluations on
Temporal as on the embedded engine; a worker restart during the durable wait neither repeats the
evaluation before it nor the wait; a failed attempt resumes from the checkpoint its heartbeat
recorded (``activity.info().heartbeat_details``); a bad spec fails the workflow at once,
non-retryable, before any activity.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("temporalio", reason="the [temporal] extra is not installed: pip install -e '.[temporal]'")

import workflows  # noqa: E402
from engine import VirtualClock, testing  # noqa: E402
from engine.temporal import TemporalEngine  # noqa: E402
from no_leak import raw_history  # noqa: E402
from wf_fakes import Fakes, reference_loss  # noqa: E402
from wf_world import World, hand_spec  # noqa: E402

pytestmark = pytest.mark.slow  # a real Temporal dev server (session fixture, a process)

DEADLINE_S = 180


def commands(events) -> list[str]:
    out = []
    for e in events:
        if e.type == "activity_scheduled":
            out.append(e.attrs["activity_id"])
        elif e.type == "timer_started":
            out.append(f"sleep {e.attrs['seconds']:g}s")
    return out


def kinds(events) -> list[str]:
    """Event types without the workflow-task bookkeeping (a task that timed out on a loaded machine)."""
    return [e.type for e in events if not e.type.startswith("workflow_task_")]


def hand_input(**over) -> dict:
    return {"spec": hand_spec(**over), "corpus": {"name": "default"}, "eval_suites": ["ppl"]}


def temporal(cfg, fakes: Fakes) -> TemporalEngine:
    eng = TemporalEngine(cfg)
    workflows.register(eng, activities=fakes.activities())
    return eng


def wait_for(cond, what: str, deadline_s: float = DEADLINE_S):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(0.1)  # a poll interval, not a wait for the outcome
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.ns("hand")
def test_hand_example_same_as_embedded(temporal_config, tmp_path: Path) -> None:
    # a 2 s wait instead of 30 s: Temporal's timers are real time (the dev server skips no time)
    inp = hand_input(eval_interval_seconds=2)
    clock = VirtualClock()
    world = World(home=tmp_path / "embedded", clock=clock, fakes=Fakes(home=tmp_path / "embedded", clock=clock))
    embedded = world.run("TrainRun", "train/tiny", inp)
    assert embedded.state == "completed", embedded.error
    embedded_commands = commands(world.events("train/tiny"))

    fakes = Fakes(home=tmp_path / "temporal")
    with temporal(temporal_config, fakes) as eng:
        assert eng.workflow_function("TrainRun") is workflows.train_run  # the same function objects
        assert testing.registration(world.engine, "TrainRun").fn is workflows.train_run
        eng.start("TrainRun", "train/tiny", inp)
        st = eng.run_until_complete("train/tiny", timeout_s=DEADLINE_S)
        assert st.state == "completed", st.error
        events = eng.history("train/tiny")
    world.engine.close()

    expected = [
        "corpus-default",
        "train-000500",
        "eval-000500-ppl",
        "sleep 2s",
        "train-001000",
        "eval-001000-ppl",
        "sleep 2s",
        "train-001200",
        "eval-001200-ppl",
    ]
    assert commands(events) == embedded_commands == expected
    assert st.result == embedded.result  # segments, checkpoints, losses, evaluations: all equal
    assert st.result["final_loss_hex"] == reference_loss(1200, 7).hex()
    assert fakes.steps_taken == 1200
    evals = [(c.activity_id, c.input["subjects"][0]["model"]) for c in fakes.calls if c.name == "eval"]
    assert evals == [
        ("eval-000500-ppl", "runs/tiny/ckpt/step-000500"),
        ("eval-001000-ppl", "runs/tiny/ckpt/step-001000"),
        ("eval-001200-ppl", "runs/tiny/ckpt/step-001200"),
    ]
    completed = [e.attrs["activity_id"] for e in events if e.type == "activity_completed"]
    assert sorted(completed) == sorted(expected[:2] + expected[2:3] + expected[4:6] + expected[7:])
    # the activity id is the idempotency key: Temporal's activity id, and the activity's second argument
    raw = eng_history_inputs(events)
    assert all(aid == arg for aid, arg in raw)


def eng_history_inputs(events) -> list[tuple[str, str]]:
    return [(e.attrs["activity_id"], e.attrs["options"]["id"]) for e in events if e.type == "activity_scheduled"]


@pytest.mark.ns("restart")
def test_durable_wait_not_repeated_on_worker_restart(temporal_config, tmp_path: Path) -> None:
    spec = hand_spec(steps=40, eval_every=20, checkpoint_every=5, eval_interval_seconds=4)
    inp = {"spec": spec, "corpus": {"name": "default"}, "eval_suites": ["ppl"]}
    fakes = Fakes(home=tmp_path)
    first = temporal(temporal_config, fakes)
    first.start("TrainRun", "train/tiny", inp)
    stop = threading.Event()
    serving = threading.Thread(target=first.run_forever, args=(stop,))
    serving.start()
    try:
        timer = wait_for(
            lambda: next((e for e in first.history("train/tiny") if e.type == "timer_started"), None),
            "the durable wait to start",
        )
    finally:
        stop.set()  # the worker goes away during the wait
        serving.join(timeout=DEADLINE_S)
    first.close()
    assert [c.activity_id for c in fakes.calls] == ["corpus-default", "train-000020", "eval-000020-ppl"]

    second = temporal(temporal_config, fakes)  # a new worker, after the wait's fire time or not
    with second:
        st = second.run_until_complete("train/tiny", timeout_s=DEADLINE_S)
        assert st.state == "completed", st.error
        events = second.history("train/tiny")
    assert commands(events) == [
        "corpus-default",
        "train-000020",
        "eval-000020-ppl",
        "sleep 4s",
        "train-000040",
        "eval-000040-ppl",
    ]
    assert [e.type for e in events].count("timer_fired") == 1
    assert next(e for e in events if e.type == "timer_started").attrs["fire_at"] == timer.attrs["fire_at"]
    # the evaluation before the wait ran once; nothing ran twice
    assert [c.activity_id for c in fakes.calls] == [
        "corpus-default",
        "train-000020",
        "eval-000020-ppl",
        "train-000040",
        "eval-000040-ppl",
    ]
    assert st.result["final_loss_hex"] == reference_loss(40, 7).hex()


@pytest.mark.ns("same")
def test_failed_attempt_resumes_from_heartbeated_checkpoint(temporal_config, tmp_path: Path) -> None:
    spec = hand_spec(steps=40, eval_every=0, checkpoint_every=5, eval_interval_seconds=0)
    fakes = Fakes(home=tmp_path)
    fakes.fail_train[("train-000040", 1)] = 13  # a retryable failure ("CUDA out of memory") at step 13
    seen: list = []

    def train(ctx, input):
        seen.append(ctx.last_heartbeat_details)
        return fakes.train(ctx, input)

    with TemporalEngine(temporal_config) as eng:
        workflows.register(eng, activities={**fakes.activities(), "train": train})
        eng.start("TrainRun", "train/tiny", {"spec": spec})
        st = eng.run_until_complete("train/tiny", timeout_s=DEADLINE_S)
        events = eng.history("train/tiny")
    assert st.state == "completed", st.error
    assert [(c.activity_id, c.attempt) for c in fakes.calls] == [("train-000040", 1), ("train-000040", 2)]
    assert seen[0] is None and seen[1]["checkpoint"] == "runs/tiny/ckpt/step-000010"  # the heartbeat's details
    assert fakes.resumed_from == [None, "runs/tiny/ckpt/step-000010"]  # attempt 2 from the heartbeat's checkpoint
    assert st.result["final_loss_hex"] == reference_loss(40, 7).hex()
    assert [(e.type, e.attrs.get("attempt")) for e in events if e.type.startswith("activity_")] == [
        ("activity_scheduled", None),
        ("activity_started", 2),
        ("activity_completed", 2),
    ]


@pytest.mark.ns("badspec")
def test_bad_spec_fails_fast_non_retryable(temporal_config, tmp_path: Path) -> None:
    fakes = Fakes(home=tmp_path)
    with temporal(temporal_config, fakes) as eng:
        eng.start("TrainRun", "train/bad", {"spec": {"name": "bad", "eval_every": 5}})  # no steps
        st = eng.run_until_complete("train/bad", timeout_s=DEADLINE_S)
        events = eng.history("train/bad")
        raw = raw_history(eng, "train/bad")
    assert st.state == "failed"
    assert st.error["type"] == "BadInput" and st.error["non_retryable"] is True
    assert "steps: missing" in st.error["message"]
    assert fakes.calls == []
    assert kinds(events) == ["workflow_started", "workflow_failed"]  # no activity scheduled
    failed_tasks = [ev for ev in raw.events if ev.event_type == 9]  # EVENT_TYPE_WORKFLOW_TASK_FAILED
    assert failed_tasks == []  # the workflow failed for good; its task did not fail and retry


@pytest.mark.ns("ctl")
def test_ctl_read_commands_and_cancel_on_temporal(temporal_config, tmp_path: Path) -> None:
    """train --detach, status, list, history, cancel through ctl (in process); a worker with the fakes
    then ends the run canceled before any segment, and the same train command continues it as /2."""
    import json

    from click.testing import CliRunner

    from ctl.cli import main

    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"name": "mini", "steps": 10, "eval_every": 5, "checkpoint_every": 5}))
    env = {
        "CTL_BACKEND": "temporal",
        "CTL_TEMPORAL_ADDRESS": temporal_config.address,
        "CTL_TEMPORAL_NAMESPACE": temporal_config.namespace,
        "CTL_TEMPORAL_TASK_QUEUE": temporal_config.task_queue,
    }

    def ctl(*args: str) -> tuple[int, str, str]:
        r = CliRunner().invoke(main, [*args, "--home", str(tmp_path)], env=env, catch_exceptions=False)
        return r.exit_code, r.stdout, r.stderr

    train = ("train", "--spec", str(spec), "--no-eval", "--detach", "--json")
    code, out, err = ctl(*train)
    assert code == 0 and json.loads(out)["workflow_id"] == "train/mini" and json.loads(out)["state"] == "running"
    code, out, _ = ctl("status", "train/mini", "--json")
    assert code == 0 and json.loads(out)["state"] == "running" and json.loads(out)["workflow"] == "TrainRun"
    wait_for(lambda: "train/mini" in ctl("list")[1], "the run in Temporal's list")
    code, out, _ = ctl("history", "train/mini", "--json")
    events = json.loads(out)["events"]
    assert code == 0 and events[0]["type"] == "workflow_started"
    assert events[0]["attrs"]["input"]["spec"]["name"] == "mini"
    code, out, _ = ctl("cancel", "train/mini")
    assert code == 0 and "cancel requested" in out
    code, out, _ = ctl("cancel", "train/mini")
    assert code == 0 and "cancel already requested" in out

    fakes = Fakes(home=tmp_path)
    with temporal(temporal_config, fakes) as eng:
        st = eng.run_until_complete("train/mini", timeout_s=DEADLINE_S)
    assert st.state == "canceled" and fakes.calls == []  # canceled at its first command
    code, out, _ = ctl("status", "train/mini", "--json")
    assert code == 130 and json.loads(out)["state"] == "canceled"
    code, out, err = ctl(*train)  # the same command continues the run
    assert code == 0 and json.loads(out)["workflow_id"] == "train/mini/2"
    code, out, _ = ctl("history", "train/mini/1")  # train/mini names the newest workflow of the run
    assert code == 0 and "cancel_requested" in out and "workflow_canceled" in out


@pytest.mark.ns("badspec")
def test_non_retryable_activity_failure_fails_the_run_at_once(temporal_config, tmp_path: Path) -> None:
    fakes = Fakes(home=tmp_path)
    fakes.fail_corpus = True  # NonRetryableError(type="BadInput"), as tinyllm's exit 2 becomes
    with temporal(temporal_config, fakes) as eng:
        eng.start("TrainRun", "train/nocorpus", hand_input(steps=10, eval_every=5))
        st = eng.run_until_complete("train/nocorpus", timeout_s=DEADLINE_S)
        events = eng.history("train/nocorpus")
    assert st.state == "failed" and st.error["type"] == "BadInput" and st.error["non_retryable"] is True
    assert [(c.name, c.attempt) for c in fakes.calls] == [("corpus", 1)]  # one attempt, no retry
    assert kinds(events) == [
        "workflow_started",
        "activity_scheduled",
        "activity_started",
        "activity_failed",
        "workflow_failed",
    ]


class _Deaf:
    """An activity context whose activity never sees the cancel (it finishes as if just before it)."""

    def __init__(self, ctx):
        self._ctx = ctx

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    @property
    def cancel_requested(self) -> bool:
        return False


@pytest.mark.ns("same")
def test_cancel_reaches_the_next_command_when_the_activity_completed(temporal_config, tmp_path: Path) -> None:
    """A cancel that arrives as the segment completes: the workflow ends canceled at its next command
    (no evaluation, no next segment), as on the embedded engine."""
    fakes = Fakes(home=tmp_path)
    holder: dict = {}

    def train(ctx, input):
        holder["engine"].cancel("train/late")
        wait_for(
            lambda: (ctx.heartbeat(), ctx.cancel_requested)[1],
            "the cancel to reach the activity (a heartbeat's answer)",
        )
        return fakes.train(_Deaf(ctx), input)

    with TemporalEngine(temporal_config) as eng:
        holder["engine"] = eng
        workflows.register(eng, activities={**fakes.activities(), "train": train})
        eng.start(
            "TrainRun",
            "train/late",
            {"spec": hand_spec(steps=10, eval_every=5, checkpoint_every=5), "eval_suites": ["ppl"]},
        )
        st = eng.run_until_complete("train/late", timeout_s=DEADLINE_S)
        events = eng.history("train/late")
    assert st.state == "canceled"
    assert commands(events) == ["train-000005"]
    assert [e.attrs["activity_id"] for e in events if e.type == "activity_completed"] == ["train-000005"]


@pytest.mark.ns("hand")
def test_eval_suite_and_corpus_build_workflows(temporal_config, tmp_path: Path) -> None:
    fakes = Fakes(home=tmp_path)
    inp = {"name": "final", "suites": ["ppl", "zoo"], "subjects": [{"id": "a", "model": "runs/tiny/ckpt/step-000010"}]}
    with temporal(temporal_config, fakes) as eng:
        eng.start("EvalSuite", "eval/final", inp)
        eng.start("CorpusBuild", "corpus/default", {"spec": {"name": "default"}})
        ev = eng.run_until_complete("eval/final", timeout_s=DEADLINE_S)
        co = eng.run_until_complete("corpus/default", timeout_s=DEADLINE_S)
        assert eng.result("eval/final") == ev.result
    assert ev.state == "completed" and [s["suite"] for s in ev.result["suites"]] == ["ppl", "zoo"]
    assert co.state == "completed" and co.result["name"] == "default"
    assert sorted(fakes.ids()) == ["corpus-default", "eval-ppl", "eval-zoo"]

"""The polite stop at the engine level (issue 39): ``Engine.request_stop`` and ``Preempted``.

The activities here are plain functions that raise ``Preempted`` as the subprocess runner does for a
trainer that checkpointed and exited on the stop (fakes: what is tested is the engine's bookkeeping).
Each "life" is a fresh Engine on the same file, as ``ctl train`` run again after its exit 143.
"""

from __future__ import annotations

import json

from engine import (
    Event,
    Preempted,
    RetryPolicy,
    StepOptions,
    Store,
    replay_history,
)
from engine import _history as h

import eng_golden
from eng_helpers import make_engine
from test_engine_replay import GOLDEN, recorded_commands, as_tuples

ONE = StepOptions(id="a", retry=RetryPolicy(max_attempts=1))


def one_activity(options=ONE):
    async def wf(rt, inp):
        return await rt.execute_activity("act", inp, options)

    return wf


def types(eng, wid="w"):
    return [(e.type, e.attrs.get("attempt")) for e in eng.history(wid) if e.type != h.WORKFLOW_STARTED]


def test_preemptions_use_no_retry_of_max_attempts_1(db, clock):
    """max_attempts=1 and two preemptions: the third attempt still runs (a preemption is no failure)."""
    ran = []

    def act(ctx, _):
        ran.append(ctx.attempt)
        if ctx.attempt <= 2:
            raise Preempted(
                "stopped by SIGTERM",
                signal="SIGTERM",
                checkpoint=f"ck-{ctx.attempt}",
                step=ctx.attempt,
                stopping_step=ctx.attempt,
            )
        return "done"

    for life in range(3):
        eng = make_engine(db, clock, workflows=[("w", one_activity())], activities=[("act", act)])
        eng.start("w", "w", None)
        st = eng.run_until_complete("w")
        if life < 2:
            # the trainer was stopped directly (a signal to its group): the worker stops with it, the run stays open
            assert st.state == "running" and eng.stop is not None and eng.stop.signal == "SIGTERM", (life, st)
            assert [p["attempt"] for p in eng.preempted] == [life + 1]
            eng.close()
    assert st.state == "completed" and st.result == "done" and ran == [1, 2, 3]
    assert types(eng) == [
        (h.ACTIVITY_SCHEDULED, None),
        (h.ACTIVITY_STARTED, 1),
        (h.ACTIVITY_PREEMPTED, 1),
        (h.ACTIVITY_STARTED, 2),
        (h.ACTIVITY_PREEMPTED, 2),
        (h.ACTIVITY_STARTED, 3),
        (h.ACTIVITY_COMPLETED, 3),
        (h.WORKFLOW_COMPLETED, None),
    ]
    pre = [e.attrs for e in eng.history("w") if e.type == h.ACTIVITY_PREEMPTED]
    assert [(a["step"], a["steps_lost"], a["checkpoint"]) for a in pre] == [(1, 0, "ck-1"), (2, 0, "ck-2")]
    eng.close()


def test_preemptions_leave_a_failure_its_retry_under_max_attempts_2(db, clock):
    """max_attempts=2: two preemptions, then a retryable failure (the first counted attempt) is retried, and
    the fourth attempt runs (with the preemptions counted, the failure at attempt 3 would be final)."""
    ran = []

    def act(ctx, _):
        ran.append(ctx.attempt)
        if ctx.attempt <= 2:
            raise Preempted("stopped by SIGTERM", signal="SIGTERM")
        if ctx.attempt == 3:
            raise RuntimeError("out of memory")
        return "done"

    two = StepOptions(id="a", retry=RetryPolicy(max_attempts=2, initial_interval_s=1))
    for life in range(3):
        eng = make_engine(db, clock, workflows=[("w", one_activity(two))], activities=[("act", act)])
        eng.start("w", "w", None)
        st = eng.run_until_complete("w")
        if life < 2:
            eng.close()
    failed = [e.attrs for e in eng.history("w") if e.type == h.ACTIVITY_FAILED]
    eng.close()
    assert st.state == "completed" and ran == [1, 2, 3, 4], (st, ran)
    assert [(a["attempt"], a["final"]) for a in failed] == [(3, False)], failed


class _StopAfter(Store):
    """Asks ``engine`` to stop right after the first commit labelled ``label`` (the test's signal)."""

    def __init__(self, path, label):
        self.label, self.engine, self.done = label, None, False
        super().__init__(path)

    def after_commit(self, label):
        if label == self.label and not self.done and self.engine is not None:
            self.done = True
            self.engine.request_stop("SIGUSR1")


def test_a_stop_with_a_lease_taken_but_not_started_records_it_preempted(db, clock):
    """The stop lands right after the commit that leased the activity (attempt 1 started), before it ran:
    it ends ``activity_preempted`` (not started), never ran, and runs once in the next life."""
    ran = []

    def act(ctx, _):
        ran.append(ctx.attempt)
        return "done"

    store = _StopAfter(db, "task")
    eng = make_engine(db, clock, workflows=[("w", one_activity())], activities=[("act", act)], store=store)
    store.engine = eng
    eng.start("w", "w", None)
    st = eng.run_until_complete("w")
    assert st.state == "running" and ran == [], st
    (pre,) = [e.attrs for e in eng.history("w") if e.type == h.ACTIVITY_PREEMPTED]
    assert pre["attempt"] == 1 and pre["signal"] == "SIGUSR1" and pre["message"].startswith("not started"), pre
    eng.close()
    eng = make_engine(db, clock, workflows=[("w", one_activity())], activities=[("act", act)])
    st = eng.run_until_complete("w")
    assert st.state == "completed" and ran == [2], (st, ran)


def test_a_stop_during_a_durable_wait_is_recorded_and_the_rest_waited_later(db, clock):
    async def wf(rt, _):
        await rt.execute_activity("act", None, StepOptions(id="a"))
        await rt.sleep(30)
        return rt.now()

    store = _StopAfter(db, "complete")  # right after the activity's completion started the timer
    eng = make_engine(db, clock, workflows=[("w", wf)], activities=[("act", lambda ctx, _: 1)], store=store)
    store.engine = eng
    t0 = clock.now()
    eng.start("w", "w", None)
    assert eng.run_until_complete("w").state == "running"
    (wait,) = [e for e in eng.history("w") if e.type == h.PREEMPTED]
    assert wait.attrs["waiting_on"].startswith("timer (fires at") and wait.time == t0, wait
    eng.close()
    clock.advance(10)  # ctl was away for 10 s: 20 s of the wait are left
    eng = make_engine(db, clock, workflows=[("w", wf)], activities=[("act", lambda ctx, _: 1)])
    st = eng.run_until_complete("w")
    fired = [e for e in eng.history("w") if e.type == h.TIMER_FIRED]
    assert st.state == "completed" and st.result == t0 + 30 and [e.time for e in fired] == [t0 + 30], st


def test_a_cancel_during_a_stop_ends_canceled(db, clock):
    """The workflow's cancel is recorded while its attempt is being stopped politely: the attempt ends
    canceled (not preempted, not due again) and so does the workflow."""

    def act(ctx, _):
        other = make_engine(db, clock)
        assert other.cancel("w")
        other.close()
        eng.request_stop("SIGTERM")
        raise Preempted("stopped by SIGTERM", signal="SIGTERM", checkpoint="ck", step=3)

    eng = make_engine(db, clock, workflows=[("w", one_activity())], activities=[("act", act)])
    eng.start("w", "w", None)
    st = eng.run_until_complete("w")
    hist = eng.history("w")
    assert st.state == "canceled", st
    assert not [e for e in hist if e.type == h.ACTIVITY_PREEMPTED]
    (canceled,) = [e.attrs for e in hist if e.type == h.ACTIVITY_CANCELED]
    assert canceled["reason"] == "stopped after cancel", canceled


def test_the_golden_history_with_preemptions_replays_to_the_same_result():
    """Old and new histories: the golden one with an ``activity_preempted`` (and the next attempt's start)
    after its first activity start, and a ``preempted`` during its first wait, replays as before."""
    with open(GOLDEN) as f:
        golden = json.load(f)
    events = [Event.from_json(e) for e in golden["events"]]
    out: list[Event] = []
    first_start = first_timer = True
    for e in events:
        out.append(e)
        if e.type == h.ACTIVITY_STARTED and first_start:
            first_start = False
            a = e.attrs
            out.append(
                Event(
                    0,
                    h.ACTIVITY_PREEMPTED,
                    e.time,
                    {
                        "cmd": a["cmd"],
                        "activity_id": a["activity_id"],
                        "attempt": a["attempt"],
                        "signal": "SIGTERM",
                        "step": 1,
                        "steps_lost": 0,
                        "retry_at": e.time,
                    },
                )
            )
            out.append(Event(0, h.ACTIVITY_STARTED, e.time, {**a, "attempt": a["attempt"] + 1}))
        elif e.type == h.TIMER_STARTED and first_timer:
            first_timer = False
            out.append(Event(0, h.PREEMPTED, e.time, {"signal": "SIGTERM", "waiting_on": "timer"}))
    out = [Event(i, e.type, e.time, e.attrs) for i, e in enumerate(out, 1)]
    res = replay_history(eng_golden.golden, out, workflow_id=golden["workflow_id"], input_type=eng_golden.GoldenInput)
    assert len(out) == len(events) + 3
    assert as_tuples(res.commands) == recorded_commands(events) and res.new_commands == []
    assert res.done and res.outcome == ("completed", golden["result"])


HELPER_STYLE_CHILD = r"""
import json, os, signal, sys, time
progress, pidfile = sys.argv[1], sys.argv[2]
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
newest = None
def emit(**line):
    with open(progress, "a") as f:
        f.write(json.dumps({"time": time.time(), "checkpoint": newest, **line}) + "\n")
emit(event="start", step=0)
with open(pidfile + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(pidfile + ".tmp", pidfile)
step = 0
while step < 10_000:
    time.sleep(0.05)
    step += 1
    if stop or step % 3 == 0:  # a checkpoint on the cadence, and the stop's own at the step it is at
        newest = f"runs/x/ckpt/step-{step:06d}"
        emit(event="checkpoint", step=step)
        if stop:
            print(json.dumps({"canceled": True, "steps": step}))
            sys.exit(130)
    else:
        emit(event="step", step=step)
"""


def test_a_stop_of_a_trainer_writing_the_helper_s_checkpoint_lines_records_the_step_it_saved(tmp_path, db):
    """DurableRun and the framework integrations mark their checkpoint lines ``"event": "checkpoint"`` (and carry
    the newest checkpoint on every line): the runner took only tinyllm's event-less lines as checkpoints, so a
    helper trainer that saved the step it stopped at was recorded with no checkpoint and every step lost.
    Real processes: the engine's subprocess runner and a child writing the helper's progress lines."""
    import threading
    import time
    from pathlib import Path

    from engine import SystemClock, run_subprocess

    child = tmp_path / "child.py"
    child.write_text(HELPER_STYLE_CHILD)
    pidfile, progress = tmp_path / "child.pid", tmp_path / "progress.jsonl"

    def act(ctx, _):
        res = run_subprocess(
            ctx,
            [__import__("sys").executable, str(child), str(progress), str(pidfile)],
            progress_path=str(progress),
            poll_interval_s=0.02,
        )
        return res.returncode

    opts = StepOptions(id="train-000100", heartbeat_timeout_s=300)

    async def wf(rt, _):
        return await rt.execute_activity("run", None, opts)

    eng = make_engine(
        db, SystemClock(), workflows=[("w", wf)], activities=[("run", act)], inline=False, poll_interval_s=0.02
    )
    eng.start("w", "w", None)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("st", eng.run_until_complete("w", timeout_s=120)))
    t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # past its first checkpoint (step 3)
        lines = Path(progress).read_text().splitlines() if Path(progress).exists() else []
        if any(json.loads(x).get("step", 0) >= 4 for x in lines):
            break
        time.sleep(0.02)
    eng.request_stop("SIGTERM", grace_s=30)
    t.join(120)
    assert out["st"].state == "running", out
    (pre,) = [e.attrs for e in eng.history("w") if e.type == h.ACTIVITY_PREEMPTED]
    eng.close()
    saved = [json.loads(x) for x in Path(progress).read_text().splitlines()][-1]
    assert saved["event"] == "checkpoint" and saved["step"] >= 4, saved
    assert (pre["step"], pre["checkpoint"], pre["steps_lost"]) == (saved["step"], saved["checkpoint"], 0), pre

"""A crash before or after every commit (and inside every activity), then a fresh Engine on the file.

The crash is a ``BaseException`` raised by a ``Store`` subclass from its commit
hooks (or by an activity): it must propagate out of ``run_until_complete``
untouched; the Engine object is then thrown away. Executions are counted in a
dict outside the engine.
"""

from __future__ import annotations

from collections import Counter

import pytest

from engine import ActivityError, NonRetryableError, RetryPolicy, StepOptions, Store, VirtualClock

from eng_helpers import Crash, CrashStore, make_engine

RETRY = RetryPolicy(max_attempts=4, initial_interval_s=5.0, backoff=2.0, max_interval_s=60.0)


class Fakes:
    """Activities that count their successful executions and can crash at a chosen call."""

    def __init__(self, crash_in: tuple[str, int] | None = None):
        self.done: Counter[str] = Counter()  # successful returns per activity id
        self.calls: Counter[str] = Counter()  # every call
        self.crash_in = crash_in

    def _enter(self, ctx) -> None:
        self.calls[ctx.activity_id] += 1
        if self.crash_in == (ctx.activity_id, self.calls[ctx.activity_id]):
            raise Crash(f"inside {ctx.activity_id}")

    def step(self, ctx, x):
        self._enter(ctx)
        self.done[ctx.activity_id] += 1
        return {"step": x["i"] * 10}

    def flaky(self, ctx, x):
        """Fails its first call that is not interrupted by a crash, then succeeds."""
        self._enter(ctx)
        if self.calls[ctx.activity_id] - (self.crash_in is not None and self.crash_in[0] == ctx.activity_id) == 1:
            raise RuntimeError("transient")
        self.done[ctx.activity_id] += 1
        return {"flaky": x["i"]}

    def bad(self, ctx, x):
        self._enter(ctx)
        raise NonRetryableError("bad spec", type="BadSpec")

    def beat(self, ctx, x):
        self._enter(ctx)
        ctx.heartbeat({"progress": 1})
        self.done[ctx.activity_id] += 1
        return {"beat": True}

    def activities(self):
        return [("step", self.step), ("flaky", self.flaky), ("bad", self.bad), ("beat", self.beat)]


async def sample(rt, _):
    out = {}
    out["a"] = await rt.execute_activity("step", {"i": 1}, StepOptions(id="s0", retry=RETRY))
    out["b"] = await rt.execute_activity("flaky", {"i": 2}, StepOptions(id="s1", retry=RETRY))
    await rt.sleep(30)
    try:
        await rt.execute_activity("bad", {}, StepOptions(id="s2", retry=RETRY))
    except ActivityError as e:
        out["c"] = [e.type, e.non_retryable]
    out["d"] = await rt.execute_activity("beat", {}, StepOptions(id="s3", heartbeat_timeout_s=60, retry=RETRY))
    out["e"] = await rt.execute_activity("step", {"i": 5}, StepOptions(id="s4", retry=RETRY))
    return out


SUCCEEDING = ["s0", "s1", "s3", "s4"]


def run_clean(path):
    fakes = Fakes()
    store = CrashStore(path)
    eng = make_engine(path, VirtualClock(), workflows=[("sample", sample)], activities=fakes.activities(), store=store)
    eng.start("sample", "wf/1", None)
    eng.run_until_complete("wf/1")
    return eng.result("wf/1"), store.hooks, eng.history("wf/1"), fakes


def recover(path, clock, fakes):
    eng = make_engine(path, clock, workflows=[("sample", sample)], activities=fakes.activities())
    eng.run_until_complete("wf/1")
    return eng


def test_crash_before_and_after_every_commit(tmp_path):
    expected, hooks, clean_history, clean = run_clean(str(tmp_path / "clean.db"))
    assert clean.done == Counter({a: 1 for a in SUCCEEDING})
    assert expected["c"] == ["BadSpec", True]
    assert hooks >= 2 * 10  # the sample has at least ten durable transitions
    for crash_at in range(1, hooks + 1):
        path = str(tmp_path / f"crash{crash_at}.db")
        clock = VirtualClock()
        fakes = Fakes()
        store = CrashStore(path, crash_at=crash_at)
        eng = make_engine(path, clock, workflows=[("sample", sample)], activities=fakes.activities(), store=store)
        with pytest.raises(Crash):
            eng.start("sample", "wf/1", None)
            eng.run_until_complete("wf/1")
        label, when = store.crashed
        del eng, store
        if label == "start" and when == "before":
            eng2 = make_engine(path, clock, workflows=[("sample", sample)], activities=fakes.activities())
            eng2.start("sample", "wf/1", None)  # the start was lost: the caller starts again
            eng2.run_until_complete("wf/1")
        else:
            eng2 = recover(path, clock, fakes)
        assert eng2.result("wf/1") == expected, (crash_at, label, when)
        # each activity completes once in history; it ran to success once, or twice only when the
        # crash lost its completion (before that commit)
        hist = eng2.history("wf/1")
        completed = Counter(e.attrs["activity_id"] for e in hist if e.type == "activity_completed")
        assert completed == Counter({a: 1 for a in SUCCEEDING})
        lost = 1 if (label == "complete" and when == "before") else 0
        assert sum(fakes.done.values()) == len(SUCCEEDING) + lost, (crash_at, label, when, fakes.done)
        assert max(fakes.done.values()) <= 1 + lost
        # the same commands in the same order as the uninterrupted run
        assert [e.attrs.get("activity_id") for e in hist if e.type in ("activity_scheduled", "timer_started")] == [
            e.attrs.get("activity_id") for e in clean_history if e.type in ("activity_scheduled", "timer_started")
        ]


@pytest.mark.parametrize("activity_id", ["s0", "s1", "s3", "s4"])
def test_crash_inside_an_activity_redelivers_at_once(tmp_path, activity_id):
    """The worker dies mid-activity: the next Engine redelivers attempt+1 at once (no timeout wait)."""
    expected, _, _, _ = run_clean(str(tmp_path / "clean.db"))
    path = str(tmp_path / "e.db")
    clock = VirtualClock()
    fakes = Fakes(crash_in=(activity_id, 1))
    eng = make_engine(path, clock, workflows=[("sample", sample)], activities=fakes.activities())
    eng.start("sample", "wf/1", None)
    with pytest.raises(Crash):
        eng.run_until_complete("wf/1")
    t_crash = clock.now()
    eng2 = make_engine(path, clock, workflows=[("sample", sample)], activities=fakes.activities())
    eng2.run_until_idle()
    started = [
        e for e in eng2.history("wf/1") if e.type == "activity_started" and e.attrs["activity_id"] == activity_id
    ]
    assert len(started) >= 2 and started[1].attrs["attempt"] == started[0].attrs["attempt"] + 1
    assert started[1].time == t_crash  # redelivered without waiting for any timeout
    eng2.run_until_complete("wf/1")
    assert eng2.result("wf/1") == expected
    assert fakes.done == Counter({a: 1 for a in SUCCEEDING})


def test_crash_store_is_accepted_and_counts_commits(tmp_path):
    path = str(tmp_path / "e.db")
    store = Store(path)
    fakes = Fakes()
    eng = make_engine(path, VirtualClock(), workflows=[("sample", sample)], activities=fakes.activities(), store=store)
    eng.start("sample", "wf/1", None)
    eng.run_until_complete("wf/1")
    assert store.commits == sum(store.commits_by_label.values()) > 0
    assert eng.store is store


class CrashClock(VirtualClock):
    """A clock that dies at its ``crash_at``-th reading (a crash from anywhere in engine code)."""

    def __init__(self, crash_at):
        super().__init__(start=1_000_000.0)
        self.crash_at = crash_at
        self.reads = 0

    def now(self):
        self.reads += 1
        if self.reads == self.crash_at:
            raise Crash(f"clock read {self.reads}")
        return super().now()


def test_crash_from_the_clock_anywhere_propagates_and_recovers(tmp_path):
    expected, _, _, _ = run_clean(str(tmp_path / "clean.db"))
    probe = CrashClock(crash_at=None)
    eng = make_engine(
        str(tmp_path / "probe.db"), probe, workflows=[("sample", sample)], activities=Fakes().activities()
    )
    eng.start("sample", "wf/1", None)
    eng.run_until_complete("wf/1")
    reads = probe.reads
    assert reads > 20
    for crash_at in range(1, reads + 1, 3):
        path = str(tmp_path / f"c{crash_at}.db")
        clock = CrashClock(crash_at)
        fakes = Fakes()
        eng = make_engine(path, clock, workflows=[("sample", sample)], activities=fakes.activities())
        try:
            eng.start("sample", "wf/1", None)
            eng.run_until_complete("wf/1")
            continue  # the crash point fell after the end
        except Crash:
            pass
        clock.crash_at = None
        eng2 = make_engine(path, clock, workflows=[("sample", sample)], activities=fakes.activities())
        eng2.start("sample", "wf/1", None)  # idempotent; needed only when the start itself was lost
        eng2.run_until_complete("wf/1")
        assert eng2.result("wf/1") == expected, crash_at
        assert all(n <= 2 for n in fakes.done.values()) and set(fakes.done) == set(SUCCEEDING)

"""What a simulated run must satisfy: against the spec (an oracle), and against the uninterrupted run.

The oracle is independent of the workflow code under test: the expected segment ends are the
seed's ``b_i = min(i*e, N)``, the expected final loss is the fake trainer's recurrence run
``N`` steps in a plain loop, the expected commands are section 3's list. So a workflow that is
consistently wrong (a mutant) fails even when its killed runs agree with its uninterrupted one.

Every check returns a list of mismatch lines (empty: all good).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from contracts.activity_ids import corpus_id, eval_id, step_tag, train_id
from contracts.layout import STEP_PREFIX, RunHome, checkpoint_ref, parse_step_dir, step_dir_name
from engine import testing as h  # the engine's testing door: the event kinds the oracle reads

from .fakes import FakeState, reference_state
from .ledger import Ledger
from .ledger_folds import LedgerFold, StepsFold
from .scenario import Outcome, Scenario


# --- the expected shape of a run --------------------------------------------------------------


def expected_commands(scn: Scenario) -> list[str]:
    """Section 3's command list: corpus?, then per segment train, evals, and a timer but after the last."""
    out = [corpus_id("default")] if scn.corpus else []
    ends = scn.ends()
    for i, b in enumerate(ends):
        out.append(train_id(b))
        out.extend(eval_id(step_tag(b), s) for s in scn.suites)
        if scn.eval_interval_s > 0 and i < len(ends) - 1:
            out.append(f"timer {scn.eval_interval_s:g}s")
    return out


CHECKED_EVENTS = frozenset({h.ACTIVITY_SCHEDULED, h.TIMER_STARTED, h.TIMER_FIRED})
"""The only event types ``check_completed_state`` and ``compare_with`` read, besides the first event's time:
``recorded_commands`` (scheduled, timer started), ``timer_waits`` (timer started and fired, the first
event's time) and the cadence check of ``_check_commands`` (timer started, scheduled)."""


def kept_events(events: list[h.Event]) -> list[h.Event]:
    """The events of a history those checks read (the first one and ``CHECKED_EVENTS``): they give the
    same lines on this as on the whole history, on a third of its length."""
    return [e for i, e in enumerate(events) if i == 0 or e.type in CHECKED_EVENTS]


def recorded_commands(events: list[h.Event]) -> list[str]:
    out = []
    for e in events:
        if e.type == h.ACTIVITY_SCHEDULED:
            out.append(e.attrs["activity_id"])
        elif e.type == h.TIMER_STARTED:
            out.append(f"timer {e.attrs['seconds']:g}s")
    return out


def timer_waits(events: list[h.Event], *, from_start: bool = True) -> list[tuple]:
    """Each durable timer: (seconds, fire time - its start, fired event - fire time, times fired,
    fire time relative to the workflow's start).

    The last is left out (``from_start=False``) where retries back off: a kill before a
    failure is recorded turns it into a lost worker, redelivered at once, so the time spent
    before a later timer legitimately differs (the results do not).
    """
    start = events[0].time if events else 0.0
    fired: dict[int, list[float]] = defaultdict(list)
    for e in events:
        if e.type == h.TIMER_FIRED:
            fired[e.attrs["cmd"]].append(e.time)
    out = []
    for e in events:
        if e.type == h.TIMER_STARTED:
            a = e.attrs
            times = fired[a["cmd"]]
            row = (a["seconds"], a["fire_at"] - e.time, (times[0] - a["fire_at"]) if times else None, len(times))
            out.append(row + ((a["fire_at"] - start,) if from_start else ()))
    return out


def normalized_result(result: Any) -> Any:
    """The workflow result without ``resumed_from`` (it names the attempt's resume point, by design).

    A shallow copy: only the segments' ``train`` objects that held it are copied.
    """
    if not isinstance(result, dict):
        return result
    out = dict(result)
    if isinstance(out.get("segments"), list):
        out["segments"] = [_without_resume(seg) for seg in out["segments"]]
    return out


def _without_resume(seg: Any) -> Any:
    if isinstance(seg, dict) and isinstance(seg.get("train"), dict) and "resumed_from" in seg["train"]:
        seg = {**seg, "train": {k: v for k, v in seg["train"].items() if k != "resumed_from"}}
    return seg


# --- checks against the oracle ------------------------------------------------------------------


def check_completed(o: Outcome) -> list[str]:
    """A run that must have completed: result, commands, timers, evaluations, steps, files."""
    return check_completed_state(o) + check_completed_ledger(o)


def check_completed_state(
    o: Outcome, *, file_lines: list[str] | None = None, result_lines: list[str] | None = None
) -> list[str]:
    """The part of ``check_completed`` that reads the run's outcome and files (not the ledger);
    ``file_lines``: ``final_files_lines`` of the run's final files, already made; ``result_lines``:
    ``check_result`` of this very result object, already made."""
    scn = o.scenario
    if o.state != "completed":
        err = o.error or {}
        return [f"workflow ended {o.state}, expected completed ({err.get('type')}: {err.get('message')})"]
    files = final_files_lines(o) if file_lines is None else list(file_lines)
    res = check_result(scn, o.result) if result_lines is None else list(result_lines)
    return res + _check_commands(scn, o.events) + files


def final_files_lines(o: Outcome) -> list[str]:
    """The checks of a completed run's files: every checkpoint exact, LATEST the last one."""
    return _check_files(o, final_step=o.scenario.final_step())


def check_completed_ledger(o: Outcome) -> list[str]:
    """The part of ``check_completed`` that reads the ledger: each evaluation once, no step redone."""
    if o.state != "completed":
        return []
    return check_evaluations(o.ledger, o.scenario, wf=o.workflow_id) + check_steps(o.ledger)


def check_result(scn: Scenario, result: Any) -> list[str]:
    """The result against the oracle: steps, final loss, digest, every segment's end, loss and suites."""
    spec = scn.spec()
    final = scn.final_step()
    ref = reference_state(spec, final)
    if not isinstance(result, dict):
        return [f"result is not an object: {result!r}"]
    bad = []
    if result.get("steps") != final:
        bad.append(f"result steps {result.get('steps')} != {'early stop' if scn.stop_at else 'spec'} steps {final}")
    stopped = result.get("stopped_early")
    if (stopped or {}).get("step") != (scn.stop_at or None):
        bad.append(
            f"result stopped_early {stopped!r}, expected a stop at {scn.stop_at}"
            if scn.stop_at
            else f"result stopped_early {stopped!r} though nothing stops early"
        )
    if result.get("final_loss_hex") != ref.loss.hex():
        bad.append(f"final_loss_hex {result.get('final_loss_hex')} != uninterrupted {ref.loss.hex()}")
    if result.get("digest") != ref.digest(scn.name):
        bad.append("digest differs from an uninterrupted trainer's")
    segs = result.get("segments") or []
    ends = scn.ends()
    if [s.get("until") for s in segs] != ends:
        bad.append(f"segments end at {[s.get('until') for s in segs]}, expected {ends}")
    for seg in segs:
        until, train = seg.get("until"), seg.get("train") or {}
        if not isinstance(until, int):
            continue
        end = min(until, final)  # the stopping segment ends at the stop
        want = reference_state(spec, end)
        if train.get("steps") != end or train.get("final_loss_hex") != want.loss.hex():
            bad.append(
                f"segment {until}: trainer ended at step {train.get('steps')} "
                f"loss {train.get('final_loss_hex')}, expected step {end} loss {want.loss.hex()}"
            )
        if seg.get("checkpoint") != checkpoint_ref(scn.name, end):
            bad.append(f"segment {until}: checkpoint {seg.get('checkpoint')}")
        suites = [s.get("suite") for s in ((seg.get("evals") or {}).get("suites") or [])]
        if suites != list(scn.suites) and (scn.suites or seg.get("evals")):
            bad.append(f"segment {until}: evaluated suites {suites}, expected {list(scn.suites)}")
    return bad


def _check_commands(scn: Scenario, events: list[h.Event]) -> list[str]:
    bad = []
    got, want = recorded_commands(events), expected_commands(scn)
    if got != want:
        bad.append(f"commands {got} != expected {want}")
    for secs, waited, late, fired, *_ in timer_waits(events):
        if fired != 1:
            bad.append(f"a {secs:g}s timer fired {fired} times")
        if waited != secs or late != 0:
            bad.append(f"a {secs:g}s timer fires {waited:g}s after it started and fired {late}s after that")
    # the durable cadence: each segment after a timer is scheduled no earlier than its fire time
    fire_at = None
    for e in events:
        if e.type == h.TIMER_STARTED:
            fire_at = e.attrs["fire_at"]
        elif e.type == h.ACTIVITY_SCHEDULED and fire_at is not None:
            if e.time < fire_at:
                bad.append(f"{e.attrs['activity_id']} scheduled {fire_at - e.time:g}s before its timer fired")
            fire_at = None
    return bad


def check_evaluations(ledger: Ledger, scn: Scenario, *, wf: str | None = None) -> list[str]:
    """Each (checkpoint, suite) evaluated once, on the checkpoint of its own step.

    One more execution is allowed only when the worker died during that very evaluation,
    before its completion was recorded (at-least-once delivery cannot do better): i.e. between
    its start and the kill, the ledger shows no other work. A fold (simulator/ledger_folds.py).
    """
    fold = LedgerFold(scn, wf)
    for e in ledger.entries:
        fold.ev.feed(e, e["seq"])
    return fold.ev.lines()


def check_steps(ledger: Ledger) -> list[str]:
    """No optimizer step redone beyond the last checkpoint.

    Every resumed trainer that takes steps must start from the newest checkpoint written
    before it, even when the kill fell between writing that checkpoint and recording its
    heartbeat (the redelivered attempt then resumes from LATEST, which is newer than the
    last heartbeated checkpoint). A fold (simulator/ledger_folds.py).
    """
    fold = StepsFold()
    for e in ledger.entries:
        fold.feed(e)
    return fold.lines


def _check_files(o: Outcome, *, final_step: int | None) -> list[str]:
    """Every checkpoint on disk holds exactly the uninterrupted trainer's state at its step; LATEST is valid."""
    scn = o.scenario
    run = RunHome(o.home).run(scn.name)
    ckpt_dir = run.ckpt_root
    bad = []
    if not run.latest.exists():
        return [] if final_step is None else [f"{run.latest} is missing"]
    latest = run.latest.read_text().strip()
    if not (ckpt_dir / latest / "state.json").exists():
        bad.append(f"LATEST names {latest}, which does not exist")
    if final_step is not None and latest != step_dir_name(final_step):
        bad.append(f"LATEST is {latest}, expected {step_dir_name(final_step)}")
    for d in sorted(ckpt_dir.glob(f"{STEP_PREFIX}*")):
        state = FakeState.from_json(json.loads((d / "state.json").read_text()))
        want = reference_state(scn.spec(), state.step)
        if d.name != step_dir_name(state.step) or state.loss.hex() != want.loss.hex():
            bad.append(
                f"checkpoint {d.name} holds step {state.step} loss {state.loss.hex()}, expected {want.loss.hex()}"
            )
    return bad


# --- checks against the uninterrupted run -----------------------------------------------------


def compare_with(o: Outcome, ref: Outcome) -> list[str]:
    """Same result (JSON, less ``resumed_from``), same commands, same timer waits as the uninterrupted run."""
    bad = []
    if o.state != ref.state:
        return [f"ended {o.state}, the uninterrupted run {ref.state}"]
    exact = not o.scenario.oom_at  # retry backoffs: see timer_waits
    view = ref.extra.get("compared")  # the uninterrupted run's side, made once (it is compared thousands of times)
    if view is None or view[0] is not ref.result or view[1] is not ref.events or view[2] != exact:
        view = (
            ref.result,
            ref.events,
            exact,
            normalized_result(ref.result),
            recorded_commands(ref.events),
            timer_waits(ref.events, from_start=exact),
        )
        ref.extra["compared"] = view
    _, _, _, b, ref_commands, want = view
    a = b if o.result is ref.result else normalized_result(o.result)  # a splice shares the run's result
    if a != b:
        bad.append("result differs from the uninterrupted run's: " + first_difference(a, b))
    commands = recorded_commands(o.events)
    if commands != ref_commands:
        bad.append(f"commands {commands} != uninterrupted {ref_commands}")
    got = timer_waits(o.events, from_start=exact)
    if got != want:
        bad.append(f"timer waits {got} != uninterrupted {want}")
    return bad


def first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where two JSON values first differ (``.result.path: "v0002" != "v0001"``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return first_difference(x, y, f"{path}[{i}]")
    return f"{path or '(top)'}: {json.dumps(a)[:120]} != {json.dumps(b)[:120]}"


# --- canceled runs ----------------------------------------------------------------------------------


def check_canceled(o: Outcome, *, poll_steps: int) -> list[str]:
    """A run canceled while running: ended canceled, nothing new after the cancel, checkpoints intact."""
    if not o.cancel_done:
        return check_completed(o)  # the cancel came after the end: a normal completed run
    bad = []
    if o.state == "completed":
        # the cancel lost the race with the end: the last activity finished before it saw it, and
        # no command came after it; then this must be a complete, exact run
        bad += check_completed(o)
    elif o.state != "canceled":
        err = o.error or {}
        bad.append(
            f"workflow ended {o.state} after a cancel, expected canceled ({err.get('type')}: {err.get('message')})"
        )
    after_cancel = False
    for e in o.events:
        if e.type == h.CANCEL_REQUESTED:
            after_cancel = True
        elif after_cancel and e.type in (h.ACTIVITY_SCHEDULED, h.TIMER_STARTED):
            bad.append(f"new command after the cancel: {e.type} {e.attrs.get('activity_id', '')}")
        elif after_cancel and e.type == h.ACTIVITY_STARTED and e.attrs.get("attempt", 1) > 1:
            bad.append(f"{e.attrs.get('activity_id')} redelivered (attempt {e.attrs.get('attempt')}) after the cancel")
    cancel_at = next((e["seq"] for e in o.ledger.entries if e["kind"] == "cancel" and e.get("recorded")), None)
    taken = sum(
        e["last"] - e["first"] + 1
        for e in o.ledger.entries
        if e["kind"] == "steps" and e["wf"] == o.workflow_id and cancel_at is not None and e["seq"] > cancel_at
    )
    if taken > poll_steps:
        bad.append(f"{taken} steps taken after the cancel (the trainer polls every {poll_steps})")
    bad += check_steps(o.ledger)
    bad += _check_files(o, final_step=None)
    written = {e["step"] for e in o.ledger.entries if e["kind"] == "ckpt" and e["wf"] == o.workflow_id}
    on_disk = {parse_step_dir(p) for p in RunHome(o.home).run(o.scenario.name).ckpt_root.glob(f"{STEP_PREFIX}*")}
    if written - on_disk:
        bad.append(f"checkpoints deleted: {sorted(written - on_disk)}")
    return bad


def check_failed_suite(o: Outcome) -> list[str]:
    """A suite failing for good at the first evaluation point fails the run: no later suite, no later segment."""
    scn = o.scenario
    bad = []
    if o.state != "failed":
        bad.append(f"workflow ended {o.state} though suite {scn.fail_suites[0]} failed for good, expected failed")
    first = scn.ends()[0]
    failing = next(s for s in scn.suites if s in scn.fail_suites)
    want = ([corpus_id("default")] if scn.corpus else []) + [train_id(first)]
    for s in scn.suites:
        want.append(eval_id(step_tag(first), s))
        if s == failing:
            break
    got = recorded_commands(o.events)
    if got != want:
        bad.append(f"commands {got}, expected {want} (nothing after the failed suite)")
    later = [
        e
        for e in o.ledger.entries
        if e["kind"] == "eval-start" and list(scn.suites).index(e["suite"]) > list(scn.suites).index(failing)
    ]
    if later:
        bad.append(f"suites run after {failing} failed: {sorted({e['suite'] for e in later})}")
    return bad


def check_continued(o: Outcome, canceled: Outcome, *, ledger_start: int) -> list[str]:
    """The same spec started again after a cancel: it completes exactly, from the checkpoints left.

    ``ledger_start``: where the restarted run's entries begin in the (shared) ledger.
    """
    bad = []
    if o.state != "completed":
        err = o.error or {}
        return [f"the restarted run ended {o.state} ({err.get('type')}: {err.get('message')})"]
    bad += check_result(o.scenario, o.result)
    bad += check_steps(o.ledger)
    bad += _check_files(o, final_step=o.scenario.final_step())
    # no step at or before the newest checkpoint of the canceled run is taken again
    before, after = o.ledger.entries[:ledger_start], o.ledger.entries[ledger_start:]
    newest = max((e["step"] for e in before if e["kind"] == "ckpt"), default=0)
    first = next((e for e in after if e["kind"] == "steps"), None)
    if first is not None and first["first"] <= newest:
        bad.append(f"the restarted run took step {first['first']} again (checkpoint {newest} was left)")
    return bad

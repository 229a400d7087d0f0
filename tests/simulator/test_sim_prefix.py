"""simulator/prefix.py's guard: a shared fresh replay is taken only by a database whose events 1..c are the
prefix's, byte for byte (their checksums); any other history is replayed from scratch.

A real engine on a virtual clock; the copies are made with SQLite's backup API (nothing else opens the file).
"""

from __future__ import annotations

import json
import sqlite3

from engine import Engine, StepOptions
from engine import VirtualClock
from engine.testing import event_crc
from simulator.prefix import build_prefix, use_prefix


def one(ctx, x):
    return 1


async def wf(rt, _):
    a = await rt.execute_activity("one", 0, StepOptions(id="a"))
    await rt.sleep(60)  # the cut: the code blocked on a recorded, unresolved timer
    return a + 1


def engine(path, clock) -> Engine:
    eng = Engine(str(path), clock=clock, inline_activities=True)
    eng.register_workflow("wf", wf)
    eng.register_activity("one", one)
    return eng


def copy_db(src: Engine, dst) -> None:
    out = sqlite3.connect(str(dst))
    with src.store._lock:
        src.store.conn.backup(out)
    out.close()


def _prefix_and_two_copies(tmp_path, clock):
    """A prefix of w/1 blocked on its timer, and two copies of its database: same.db as it is, other.db
    with another history (the activity's recorded result changed, its checksum made valid again)."""
    eng = engine(tmp_path / "a.db", clock)
    eng.start("wf", "w/1")
    eng.run_until_idle()  # blocked on the timer
    prefix = build_prefix(eng, "w/1", "wf")
    assert prefix is not None
    copy_db(eng, tmp_path / "same.db")
    copy_db(eng, tmp_path / "other.db")
    eng.close()
    db = sqlite3.connect(str(tmp_path / "other.db"))
    seq, typ, t, attrs = db.execute(
        "SELECT seq, type, time, attrs FROM events WHERE workflow_id='w/1' AND type='activity_completed'"
    ).fetchone()
    changed = json.dumps({**json.loads(attrs), "result": 41}, separators=(",", ":"))
    db.execute(
        "UPDATE events SET attrs=?, crc=? WHERE workflow_id='w/1' AND seq=?",
        (changed, event_crc("w/1", seq, typ, t, changed), seq),
    )
    db.commit()
    db.close()
    return prefix


def test_a_shared_replay_is_taken_only_where_the_history_is_the_prefixs(tmp_path) -> None:
    clock = VirtualClock()
    prefix = _prefix_and_two_copies(tmp_path, clock)

    other = engine(tmp_path / "other.db", clock)
    use_prefix(other, prefix)
    clock.advance(61)
    assert other.run_until_complete("w/1").result == 42  # its own history, replayed from scratch
    other.close()
    assert not prefix.used

    same = engine(tmp_path / "same.db", clock)
    use_prefix(same, prefix)
    assert same.run_until_complete("w/1").result == 2
    same.close()
    assert prefix.used  # the same history took the shared replay


def test_a_replay_from_scratch_copies_the_spines_indexes_only_where_the_history_is_the_prefixs(
    tmp_path, monkeypatch
) -> None:
    """``use_prefix``'s ``index`` (module docstring, 6.): the code replays from its start, the indexes of
    events 1..c come from the prefix, only for a database whose events 1..c have the prefix's checksums."""
    import simulator.prefix as prefix_mod

    copied: list[int] = []
    real = prefix_mod.copy_indexes
    monkeypatch.setattr(prefix_mod, "copy_indexes", lambda src, dst: (copied.append(src.last_seq), real(src, dst)))
    clock = VirtualClock()
    spine = _prefix_and_two_copies(tmp_path, clock)

    other = engine(tmp_path / "other.db", clock)
    use_prefix(other, None, index=spine)
    clock.advance(61)
    assert other.run_until_complete("w/1").result == 42  # its own events, read and folded
    other.close()
    assert copied == []

    same = engine(tmp_path / "same.db", clock)
    use_prefix(same, None, index=spine)
    assert same.run_until_complete("w/1").result == 2
    same.close()
    assert copied == [spine.seq] and not spine.used  # the indexes copied, the spine's code untouched
    assert spine.replayer.last_seq == spine.seq

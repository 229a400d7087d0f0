"""The store: refuses corrupt, foreign and newer databases without touching them; WAL; one tx helper."""

from __future__ import annotations

import sqlite3

import pytest

from engine import BadInput, Engine, Store, VirtualClock
from engine import _schema as schema

from eng_helpers import Crash, CrashStore


def _bytes(path):
    with open(path, "rb") as f:
        return f.read()


def test_not_sqlite_file_is_refused_and_left_untouched(tmp_path):
    p = tmp_path / "engine.db"
    p.write_bytes(b"this is my thesis, not a database\n" * 10)
    before = _bytes(p)
    with pytest.raises(BadInput, match="is not an SQLite database"):
        Engine(str(p))
    assert _bytes(p) == before
    assert sorted(x.name for x in tmp_path.iterdir()) == ["engine.db"]


def test_corrupt_sqlite_file_is_refused(tmp_path):
    p = tmp_path / "engine.db"
    p.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000)
    before = _bytes(p)
    with pytest.raises(BadInput, match="corrupt or unreadable"):
        Engine(str(p))
    assert _bytes(p) == before


def test_foreign_sqlite_database_is_refused_and_left_untouched(tmp_path):
    p = tmp_path / "other.db"
    c = sqlite3.connect(p)
    c.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    c.execute("INSERT INTO customers VALUES (1, 'ada')")
    c.commit()
    c.close()
    before = _bytes(p)
    with pytest.raises(BadInput, match="SQLite database of something else"):
        Engine(str(p))
    assert _bytes(p) == before


def test_newer_schema_is_refused(tmp_path):
    p = str(tmp_path / "engine.db")
    Store(p).close()
    c = sqlite3.connect(p)
    c.execute("INSERT INTO schema_version(version) VALUES (?)", (schema.VERSION + 1,))
    c.commit()
    c.close()
    with pytest.raises(BadInput, match=f"schema version {schema.VERSION + 1}"):
        Store(p)


def test_directory_path_is_refused(tmp_path):
    with pytest.raises(BadInput, match="is a directory"):
        Engine(str(tmp_path))


def test_fresh_store_is_wal_full_and_versioned(tmp_path):
    s = Store(str(tmp_path / "engine.db"))
    assert s.query_one("PRAGMA journal_mode")[0] == "wal"
    assert s.query_one("PRAGMA synchronous")[0] == 2  # FULL
    assert s.query_one("SELECT MAX(version) FROM schema_version")[0] == schema.VERSION
    s.close()
    s2 = Store(str(tmp_path / "engine.db"))  # reopening migrates nothing and keeps one version row
    assert s2.query("SELECT version FROM schema_version") == [(v,) for v, _ in schema.MIGRATIONS]


def test_crash_before_commit_rolls_back_and_after_commit_is_durable(tmp_path):
    """The crash hooks: raised before COMMIT nothing is kept; raised after, the write is durable."""
    p = str(tmp_path / "engine.db")
    clock = VirtualClock()

    async def wf(rt, _):
        return 1

    for crash_at, expect_rows in ((1, 0), (2, 1)):  # hook 1 = before the 'start' commit, 2 = after
        s = CrashStore(p, crash_at=crash_at)
        eng = Engine(store=s, clock=clock)
        eng.register_workflow("wf", wf)
        with pytest.raises(Crash):
            eng.start("wf", f"w{crash_at}", None)
        fresh = Store(p)  # the crashed connection holds no lock: a new one can write at once
        assert fresh.query_one("SELECT COUNT(*) FROM workflows WHERE id=?", (f"w{crash_at}",))[0] == expect_rows
        with fresh.transaction("probe"):
            pass
        fresh.close()


def test_migrations_apply_in_order_and_keep_data(tmp_path, monkeypatch):
    p = str(tmp_path / "engine.db")
    s = Store(p)
    with s.transaction("seed") as db:
        db.execute(
            "INSERT INTO workflows(id, name, input, state, created_at, updated_at) VALUES ('w', 'n', '1', 'running', 0, 0)"
        )
    s.close()
    extra = (schema.VERSION + 1, "ALTER TABLE workflows ADD COLUMN note TEXT; UPDATE workflows SET note = 'migrated'")
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS + [extra])
    monkeypatch.setattr(schema, "VERSION", extra[0])
    s2 = Store(p)
    assert s2.query("SELECT id, note FROM workflows") == [("w", "migrated")]
    assert [v for (v,) in s2.query("SELECT version FROM schema_version ORDER BY version")][-2:] == [
        extra[0] - 1,
        extra[0],
    ]


@pytest.mark.slow
def test_a_second_store_in_this_process_keeps_its_locks_and_another_process_keeps_the_wal(tmp_path):
    """Opening a Store never opens the file outside SQLite (defect 1 of issue 9).

    A Python open()/close() of engine.db drops every POSIX lock this process holds on it; then
    another process closing its connection believes it is the last one and deletes the WAL
    that the first connection still commits into.
    """
    import subprocess
    import sys

    p = str(tmp_path / "engine.db")
    live = Store(p)
    with live.transaction("seed") as db:
        db.execute(
            "INSERT INTO workflows(id, name, input, state, created_at, updated_at) "
            "VALUES ('w1', 'n', '1', 'running', 0, 0)"
        )
    Store(p).close()  # a second store of this process (as the old progress display opened)
    reader = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "print(c.execute('SELECT COUNT(*) FROM workflows').fetchone()[0]); c.close()"
    )
    out = subprocess.run([sys.executable, "-c", reader, p], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    assert (tmp_path / "engine.db-wal").exists(), "another process's close deleted the live WAL"
    with live.transaction("more") as db:
        db.execute(
            "INSERT INTO workflows(id, name, input, state, created_at, updated_at) "
            "VALUES ('w2', 'n', '1', 'running', 0, 0)"
        )
    out = subprocess.run([sys.executable, "-c", reader, p], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2"  # what the live connection commits reaches other processes
    live.close()


def test_a_version_2_database_migrates_and_its_workflow_goes_on(tmp_path, monkeypatch, clock):
    """Migrations 3 and 4 on a database the version-2 engine wrote: the closed activity's row goes (its
    record is its history), the open one stays, every event moves to the rowid table unchanged (the
    checksums still verify), and the workflow resumes where it stopped."""
    from engine import StepOptions

    async def two(rt, x):
        a = await rt.execute_activity("first", x, StepOptions(id="a"))
        return a + await rt.execute_activity("second", a, StepOptions(id="b"))

    p = str(tmp_path / "engine.db")
    with monkeypatch.context() as m:
        m.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:2])
        m.setattr(schema, "VERSION", 2)
        old = Engine(p, clock=clock, inline_activities=True)
        old.register_workflow("two", two)
        old.register_activity("first", lambda ctx, x: x + 1)  # "second" waits for a worker that knows it
        old.start("two", "w", 1)
        old.run_until_idle()
        with old.store.transaction("as version 2 left it") as db:  # it kept closed rows, state 'completed'
            db.execute(
                "INSERT INTO activities(workflow_id, activity_id, cmd, name, input, options, state, attempt, "
                "due_at) SELECT 'w', 'a', 0, 'first', '1', '{}', 'completed', 1, 0"
            )
        events = old.history("w")
        old.close()
    v2 = sqlite3.connect(p)
    assert v2.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == 2
    assert v2.execute("SELECT activity_id, state FROM activities ORDER BY cmd").fetchall() == [
        ("a", "completed"),
        ("b", "scheduled"),
    ]
    v2.close()

    eng = Engine(p, clock=clock, inline_activities=True)
    eng.register_workflow("two", two)
    eng.register_activity("first", lambda ctx, x: x + 1)
    eng.register_activity("second", lambda ctx, x: x * 10)
    assert eng.store.query("SELECT version FROM schema_version ORDER BY version") == [
        (v,) for v, _ in schema.MIGRATIONS
    ]
    assert eng.store.query("SELECT activity_id, state FROM activities") == [("b", "scheduled")]
    names = {n for (n,) in eng.store.query("SELECT name FROM sqlite_master")}
    assert "activities_state" not in names and "events_by_rowid" not in names
    assert eng.history("w") == events  # read through the new table, checksums verified
    assert eng.run_until_complete("w").result == 2 + 20
    assert [(a.activity_id, a.state, a.attempt) for a in eng.activities("w")] == [
        ("a", "completed", 1),
        ("b", "completed", 1),
    ]
    assert eng.store.query("SELECT COUNT(*) FROM activities") == [(0,)]
    eng.close()

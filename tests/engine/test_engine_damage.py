"""Damaged records: every event carries a crc32, so a changed byte that SQLite's integrity check
cannot see is named (database, workflow, event) and nothing is written; readable workflows are
still listed; a read-only store never writes."""

from __future__ import annotations

import sqlite3

import pytest

from engine import Engine, VirtualClock
from engine._errors import BadInput, DamagedRecord
from engine._store import Store


async def echo(rt, inp):
    return inp


def _engine(path) -> Engine:
    eng = Engine(path)
    eng.register_workflow("echo", echo)
    return eng


def _two_workflows(tmp_path):
    path = tmp_path / "engine.db"
    eng = _engine(path)
    eng.start("echo", "wf/a", {"spec": {"threads": 1, "steps": 5}})
    eng.start("echo", "wf/b", {"spec": {"threads": 2}})
    eng.run_until_complete("wf/a")
    eng.close()
    return path


def _raw(path, sql, params=()):
    conn = sqlite3.connect(path)
    conn.execute(sql, params)
    conn.commit()
    conn.close()


def test_changed_event_text_is_named_by_its_checksum(tmp_path):
    path = _two_workflows(tmp_path)
    _raw(
        path,
        "UPDATE events SET attrs = replace(attrs, '\"threads\":1', '\"thrGARBAGE\":1') "
        "WHERE workflow_id='wf/a' AND seq=1",
    )  # the crc column is left as it was
    eng = _engine(path)
    with pytest.raises(
        DamagedRecord,
        match=r"engine\.db is damaged: workflow wf/a: event 1 cannot be read "
        r"\(checksum mismatch\)",
    ) as info:
        eng.history("wf/a")
    assert info.value.workflow_id == "wf/a" and info.value.record == "event 1"
    assert eng.history("wf/b")[0].attrs["input"] == {"spec": {"threads": 2}}  # the other one reads fine
    rows, bad = eng.list_readable()
    assert [r.workflow_id for r in rows] == ["wf/a", "wf/b"] and bad == []  # rows themselves are intact
    eng.close()


def test_undecodable_row_and_event_are_damaged_and_others_listed(tmp_path):
    path = _two_workflows(tmp_path)
    _raw(path, "UPDATE workflows SET result = CAST(X'7bff' AS TEXT) WHERE id='wf/a'")
    _raw(path, "UPDATE events SET attrs = CAST(X'7b22ff' AS TEXT) WHERE workflow_id='wf/b' AND seq=1")
    eng = _engine(path)
    rows, bad = eng.list_readable()
    assert [r.workflow_id for r in rows] == ["wf/b"]
    assert len(bad) == 1 and bad[0].workflow_id == "wf/a" and "its result" in str(bad[0])
    with pytest.raises(DamagedRecord, match="workflow wf/b: event 1 cannot be read"):
        eng.history("wf/b")
    eng.close()


def test_damaged_input_stops_the_worker_without_writing(tmp_path):
    path = tmp_path / "engine.db"
    eng = _engine(path)
    eng.start("echo", "wf/c", {"x": 1})
    eng.close()
    _raw(path, "UPDATE workflows SET input = '{\"x\": 2}' WHERE id='wf/c'")  # differs from event 1
    eng = _engine(path)
    before = eng.store.commits
    with pytest.raises(DamagedRecord, match="workflow wf/c: its input cannot be read"):
        eng.run_until_complete("wf/c")
    assert eng.store.commits == before and eng.status("wf/c").state == "running"


def test_read_only_store_never_writes_and_refuses_old_schema(tmp_path):
    path = _two_workflows(tmp_path)
    store = Store(path, readonly=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly|read-only"):
        store.conn.execute("DELETE FROM events")
    store.close()
    _raw(path, "DELETE FROM schema_version WHERE version > 1")
    with pytest.raises(BadInput, match="schema version 1"):
        Store(path, readonly=True)
    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(BadInput, match="empty"):
        Store(tmp_path / "empty.db", readonly=True)


@pytest.mark.parametrize(
    "attrs, typ, time",
    [
        ('{"cmd":0}', "activity_started", 5.0),  # plain (the text read)
        (' {"cmd":0}\n', "activity_started", 5.0),  # JSON with whitespace around (json.loads' answer)
        ('{"cmd":0} x', "activity_started", 5.0),  # trailing text: not JSON
        ("[1]", "activity_started", 5.0),  # JSON, not an object
        ('{"a":' * 100000, "activity_started", 5.0),  # too deep for the decoder
        ('{"cmd":0}', 7, 5.0),  # a number in the type column
        ('{"cmd":0}', "activity_started", "later"),  # text in the time column
        ('{"cmd":0}', "activity_started", 5),  # an integer time (REAL affinity: read as 5.0)
    ],
)
def test_events_read_as_text_give_what_reading_them_as_bytes_gives(tmp_path, attrs, typ, time):
    """``read_events`` reads text columns as text and goes back to reading them as bytes where a column
    is not what it expects: both ways give the same events or the same error, for old events without a
    checksum (any text gets that far) and for events with one."""
    from engine._history import _read_events_as_bytes, event_crc, read_events

    path = _two_workflows(tmp_path)
    for with_crc in (False, True):
        crc = event_crc("wf/b", 2, str(typ), float(time), attrs) if with_crc and not isinstance(time, str) else None
        _raw(path, "DELETE FROM events WHERE workflow_id='wf/b' AND seq>=2")
        _raw(
            path,
            "INSERT INTO events(workflow_id, seq, type, time, attrs, crc) VALUES ('wf/b', 2, ?, ?, ?, ?)",
            (typ, time, attrs, crc),
        )
        conn = sqlite3.connect(path)
        got = []
        for read in (read_events, _read_events_as_bytes):
            try:
                got.append(read(conn, "wf/b", 0, -1))
            except DamagedRecord as e:
                got.append(str(e))
        conn.close()
        assert got[0] == got[1]


def test_a_damaged_schema_name_is_a_clear_refusal_not_a_traceback(tmp_path):
    """A byte of a table's name in the schema turned into one that is not UTF-8: SQLite refuses the schema
    with a message quoting that name, which Python cannot decode (a UnicodeDecodeError, found by
    tests/ctl/test_badinput_fuzz.py); both ways of opening say the database is damaged, and leave it."""
    path = tmp_path / "engine.db"
    Engine(str(path), clock=VirtualClock(start=1.0)).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    raw = bytearray(path.read_bytes())
    at = raw.index(b"tableeventsevents") + len(b"tableev")
    raw[at] = 0x80
    path.write_bytes(bytes(raw))
    for readonly in (True, False):
        with pytest.raises(BadInput, match="damaged"):
            Store(str(path), readonly=readonly)
    assert path.read_bytes() == bytes(raw)

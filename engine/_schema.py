"""The database schema: one version table and the ordered migrations, all in one place.

A database is ours when it has the ``engine_meta`` table with ``app`` equal to
``APP``. Its ``schema_version`` row says which migrations ran; opening applies
the rest in order, in one transaction. A newer version than this code knows is
refused (``BadInput``), never rewritten.
"""

from __future__ import annotations

APP = "durable-train-engine"

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE workflows (
            id               TEXT PRIMARY KEY,
            name             TEXT NOT NULL,
            input            TEXT NOT NULL,
            state            TEXT NOT NULL,           -- running | completed | failed | canceled
            result           TEXT,                    -- JSON, when completed
            error            TEXT,                    -- JSON {type, message, ...}, when failed/canceled
            created_at       REAL NOT NULL,
            updated_at       REAL NOT NULL,
            cancel_requested INTEGER NOT NULL DEFAULT 0,
            task_pending     INTEGER NOT NULL DEFAULT 1  -- a workflow task (replay step) is due
        );
        CREATE INDEX workflows_task ON workflows(task_pending) WHERE task_pending = 1;
        CREATE TABLE events (
            workflow_id TEXT NOT NULL,
            seq         INTEGER NOT NULL,
            type        TEXT NOT NULL,
            time        REAL NOT NULL,
            attrs       TEXT NOT NULL,
            PRIMARY KEY (workflow_id, seq)
        ) WITHOUT ROWID;
        CREATE TABLE activities (
            workflow_id     TEXT NOT NULL,
            activity_id     TEXT NOT NULL,
            cmd             INTEGER NOT NULL,         -- command index in the workflow
            name            TEXT NOT NULL,
            input           TEXT NOT NULL,
            options         TEXT NOT NULL,
            state           TEXT NOT NULL,            -- scheduled | running | completed | failed | canceled
            attempt         INTEGER NOT NULL DEFAULT 0,  -- last attempt started = fencing token
            lost            INTEGER NOT NULL DEFAULT 0,  -- attempts lost to a dead worker (not counted)
            due_at          REAL NOT NULL,            -- next attempt may start at
            hb_deadline     REAL,                     -- running: heartbeat timeout deadline
            close_deadline  REAL,                     -- running: start-to-close deadline
            last_hb_at      REAL,
            details         TEXT,                     -- last heartbeat details (JSON)
            owner           TEXT,                     -- JSON {host, boot, pid, pstart, instance}
            child           TEXT,                     -- JSON {pid, pstart} of a subprocess, if any
            PRIMARY KEY (workflow_id, activity_id)
        ) WITHOUT ROWID;
        CREATE INDEX activities_state ON activities(state, due_at);
        CREATE TABLE timers (
            workflow_id TEXT NOT NULL,
            cmd         INTEGER NOT NULL,
            fire_at     REAL NOT NULL,
            state       TEXT NOT NULL,                -- pending | fired | canceled
            PRIMARY KEY (workflow_id, cmd)
        ) WITHOUT ROWID;
        CREATE INDEX timers_state ON timers(state, fire_at);
        """,
    ),
    (
        2,
        """
        -- crc32 of each event as written (engine._history.event_crc), NULL for events of version 1
        ALTER TABLE events ADD COLUMN crc INTEGER;
        """,
    ),
    (
        3,
        """
        -- activities holds the open activities only (scheduled or running): closing one deletes its row
        -- (its record is its history, Engine.activities), so each transition of a chain writes one small
        -- leaf instead of the closed row's leaf, the next row's leaf and two state-index leaves
        DELETE FROM activities WHERE state NOT IN ('scheduled', 'running');
        DROP INDEX activities_state;
        """,
    ),
    (
        4,
        """
        -- events in a rowid table (appends go to the end of the table: a full leaf is followed by a new
        -- one, not rebalanced with its two siblings as in a WITHOUT ROWID b-tree), found by (workflow, seq)
        CREATE TABLE events_by_rowid (
            workflow_id TEXT NOT NULL,
            seq         INTEGER NOT NULL,
            type        TEXT NOT NULL,
            time        REAL NOT NULL,
            attrs       TEXT NOT NULL,
            crc         INTEGER,
            UNIQUE (workflow_id, seq)
        );
        INSERT INTO events_by_rowid(workflow_id, seq, type, time, attrs, crc)
            SELECT workflow_id, seq, type, time, attrs, crc FROM events ORDER BY workflow_id, seq;
        DROP TABLE events;
        ALTER TABLE events_by_rowid RENAME TO events;
        """,
    ),
]

VERSION = MIGRATIONS[-1][0]

META = """
CREATE TABLE IF NOT EXISTS engine_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
"""

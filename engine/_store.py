"""The SQLite store: one connection, one transaction helper, schema checks on open.

Every durable write of the engine goes through ``Store.transaction(label)``::

    with store.transaction("complete") as db:   # BEGIN IMMEDIATE
        db.execute(...)
    # -> before_commit(label); COMMIT (fsync, synchronous=FULL); after_commit(label)

Crash injection (the simulator): subclass ``Store`` and override
``before_commit(label)`` / ``after_commit(label)`` to raise a ``BaseException``
that is not an ``Exception``. Raised in ``before_commit`` the transaction is
rolled back (as a real crash would lose it); raised in ``after_commit`` it is
already durable. Either way it propagates out of ``Engine.run_until_idle`` /
``run_until_complete`` untouched; throw the ``Engine`` away and open a new one
on the same file. Pass the store with ``Engine(db_path, store=MyStore(db_path))``.
``commits`` counts committed transactions (``commits_by_label`` per label); ``members`` the
transactions a group commit made durable with its one COMMIT (``transaction(group=True)``).

The database is opened in WAL mode with ``synchronous=FULL`` and a busy
timeout, so several processes may share it; write transactions are
``BEGIN IMMEDIATE`` so that two workers never interleave a read-modify-write.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import urllib.parse
from collections import Counter
from typing import Literal

from . import _schema as schema
from ._errors import BadInput


class Store:
    """One SQLite connection (thread-safe behind a lock) and the single transaction helper."""

    def __init__(self, path: str | os.PathLike, *, busy_timeout_s: float = 30.0, readonly: bool = False):
        self.path = os.fspath(path)
        self.commits = 0
        self.commits_by_label: Counter[str] = Counter()
        self._lock = threading.RLock()
        self._in_tx = False
        self._group = self._member = False
        self._members = 0  # members of the open group transaction so far
        self.members = 0
        """Member transactions made durable by a group's COMMIT (``commits`` counts the COMMITs)."""
        self.readonly = readonly
        self.conn = open_readonly(self.path, busy_timeout_s, self._check) if readonly else self._open(busy_timeout_s)

    # ---- opening -------------------------------------------------------------------------

    def _open(self, busy_timeout_s: float) -> sqlite3.Connection:
        path = self.path
        if os.path.isdir(path):
            raise BadInput(f"engine database {path!r} is a directory, not a file")
        existed = os.path.exists(path) and os.path.getsize(path) > 0
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        try:
            conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise BadInput(f"cannot open engine database {path!r}: {e}") from None
        try:
            if existed:
                _refuse_foreign_file(conn, path)
            self._check(conn)
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise BadInput(f"engine database {path!r}: cannot switch to WAL mode (got {mode})")
            conn.execute("PRAGMA synchronous = FULL")
            self._migrate(conn)
        except (sqlite3.DatabaseError, UnicodeDecodeError) as e:  # (see _unreadable)
            conn.close()
            raise BadInput(
                f"engine database {path!r} is corrupt or unreadable: {_unreadable(e)} (left untouched)"
            ) from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _check(self, conn: sqlite3.Connection) -> None:
        """Refuse foreign or newer databases before anything is written."""
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not names:
            return  # a new, empty file: ours to initialise
        if "engine_meta" not in names or "schema_version" not in names:
            refuse_if_damaged(conn, self.path)
            raise BadInput(
                f"engine database {self.path!r} is an SQLite database of something else "
                f"(tables: {', '.join(sorted(names)[:5])}); refusing to touch it"
            )
        row = conn.execute("SELECT value FROM engine_meta WHERE key='app'").fetchone()
        if row is None or row[0] != schema.APP:
            refuse_if_damaged(conn, self.path)  # an unreadable meta row is damage, not another application
            raise BadInput(f"engine database {self.path!r} belongs to another application ({row and row[0]!r})")
        v = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
        if not isinstance(v, int) or v > schema.VERSION:
            refuse_if_damaged(conn, self.path)
            raise BadInput(
                f"engine database {self.path!r} has schema version {v}, this engine knows up to "
                f"{schema.VERSION}; upgrade the software"
            )

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _split(schema.META):
                conn.execute(stmt)
            conn.execute("INSERT OR IGNORE INTO engine_meta(key, value) VALUES ('app', ?)", (schema.APP,))
            v = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
            for version, sql in schema.MIGRATIONS:
                if version > v:
                    for stmt in _split(sql):
                        conn.execute(stmt)
                    conn.execute("INSERT INTO schema_version(version) VALUES (?)", (version,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    # ---- the transaction helper ------------------------------------------------------------

    def transaction(self, label: str, *, group: bool = False) -> "_Transaction":
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` on the shared connection; rolls back on any exception.

        Group commit: inside a ``group=True`` transaction, a nested ``transaction()`` of the same
        thread is a member (a SAVEPOINT): an exception rolls back that member alone, and every member
        becomes durable with the group's one COMMIT (one fsync for all). Nothing a member did may be
        acted on before that COMMIT returns (engine/_tx.py's ``Transactions`` holds members'
        acknowledgements until then). Nesting inside a plain transaction is an error."""
        return _Transaction(self, label, group)

    def before_commit(self, label: str) -> None:
        """Hook: called inside the transaction, right before COMMIT (override to inject a crash)."""

    def after_commit(self, label: str) -> None:
        """Hook: called right after COMMIT returned (override to inject a crash)."""

    # ---- reads -------------------------------------------------------------------------------

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """A read outside any write transaction (a consistent WAL snapshot)."""
        with self._lock:
            return self.conn.execute(sql, params).fetchall()

    def query_one(self, sql: str, params: tuple = ()) -> tuple | None:
        with self._lock:
            return self.conn.execute(sql, params).fetchone()

    def close(self) -> None:
        with self._lock:
            self.conn.close()


class _Transaction:
    """The context manager ``Store.transaction`` returns (a class: a generator-based one costs a tenth
    of a chained activity's Python time). The store's lock is held from enter to exit."""

    __slots__ = ("store", "label", "group", "member")

    def __init__(self, store: Store, label: str, group: bool):
        self.store, self.label, self.group, self.member = store, label, group, False

    def __enter__(self) -> sqlite3.Connection:
        st = self.store
        st._lock.acquire()
        try:
            if st._in_tx:
                if not st._group or st._member:
                    raise RuntimeError(f"nested transaction {self.label!r}")
                st.conn.execute("SAVEPOINT member")
                st._member = self.member = True
                return st.conn
            st.conn.execute("BEGIN IMMEDIATE")
            st._in_tx, st._group = True, self.group
            return st.conn
        except BaseException:
            st._lock.release()
            raise

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        st = self.store
        try:
            if self.member:
                st._member = False
                if exc_type is not None:
                    try:
                        st.conn.execute("ROLLBACK TO member")
                        st.conn.execute("RELEASE member")
                    except sqlite3.Error:
                        pass
                    return False
                st.conn.execute("RELEASE member")
                st._members += 1
                return False
            if exc_type is not None:
                self._rollback()
                return False  # the body's exception propagates
            try:
                st.before_commit(self.label)
                st.conn.execute("COMMIT")
                st._in_tx = st._group = False
                st.commits += 1
                st.commits_by_label[self.label] += 1
                st.members += st._members
                st._members = 0
            except BaseException:
                self._rollback()
                raise
            st.after_commit(self.label)
            return False
        finally:
            st._lock.release()

    def _rollback(self) -> None:
        st = self.store
        st._group, st._members = False, 0
        if st._in_tx:
            st._in_tx = False
            try:
                st.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass


def _refuse_foreign_file(conn: sqlite3.Connection, path: str) -> None:
    """A file that is not an SQLite database is refused before anything is written to it.

    The check goes through SQLite itself, never Python's ``open()``: closing any other file
    descriptor of the database drops every POSIX lock this process holds on it, after which
    another process's close believes it is the last connection and deletes the live WAL
    (sqlite.org/howtocorrupt.html, section 2.2). Reading the schema makes SQLite read the
    header; a foreign file (or one whose header is damaged) fails with "file is not a database"
    and is not modified.
    """
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        if "not a database" in str(e):
            raise BadInput(
                f"engine database {path!r} is not an SQLite database, or is corrupt or unreadable ({e}; left untouched)"
            ) from None
        raise


def damage_report(conn: sqlite3.Connection, limit: int = 5) -> list[str]:
    """SQLite's own integrity check: [] when the file is sound, else its first problems."""
    try:
        rows = conn.execute(f"PRAGMA integrity_check({int(limit)})").fetchall()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
        return [_unreadable(e)]
    problems = [str(r[0]) for r in rows]
    return [] if problems == ["ok"] else problems


def refuse_if_damaged(conn: sqlite3.Connection, path: str) -> None:
    """``BadInput`` saying the database is damaged (not foreign, not newer) when SQLite finds damage."""
    problems = damage_report(conn, limit=3)
    if problems:
        raise BadInput(
            f"engine database {path!r} is damaged (SQLite: {'; '.join(problems)[:300]}); left untouched: "
            f"restore it from a backup, or run `ctl doctor` for what each run can still use"
        )


def open_readonly(path: str, busy_timeout_s: float, check) -> sqlite3.Connection:
    """A connection that can never write: ``mode=ro``, or ``immutable=1`` where SQLite cannot make its
    shared-memory file (a read-only home) and no write-ahead log holds newer data. Only SQLite
    touches the file (``os.stat`` for sizes, never ``open()``)."""
    if os.path.isdir(path):
        raise BadInput(f"engine database {path!r} is a directory, not a file")
    if not os.path.exists(path):
        raise BadInput(f"no engine database {path!r}")
    if os.path.getsize(path) == 0:
        raise BadInput(f"engine database {path!r} is empty (0 bytes): it holds no history")
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    try:
        conn = _connect_checked(uri, busy_timeout_s)
    except sqlite3.OperationalError as e:
        wal = path + "-wal"
        if "unable to open" not in str(e) or (os.path.exists(wal) and os.path.getsize(wal) > 0):
            raise BadInput(f"cannot read engine database {path!r} read-only: {e} (left untouched)") from None
        conn = _connect_checked(uri + "&immutable=1", busy_timeout_s)  # nobody can be writing it
    except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
        raise BadInput(
            f"engine database {path!r} is not an SQLite database or is damaged: {_unreadable(e)} (left untouched)"
        ) from None
    try:
        check(conn)
        v = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
        if v != schema.VERSION:
            raise BadInput(
                f"engine database {path!r} has schema version {v}; open it once where it is writable "
                f"(any ctl train) to upgrade it to {schema.VERSION}"
            )
        conn.execute("PRAGMA query_only = 1")
    except (sqlite3.DatabaseError, UnicodeDecodeError) as e:
        conn.close()
        raise BadInput(f"engine database {path!r} is damaged: {_unreadable(e)} (left untouched)") from None
    except BaseException:
        conn.close()
        raise
    return conn


def _unreadable(e: BaseException) -> str:
    """What SQLite said; a ``UnicodeDecodeError`` is Python failing to decode SQLite's own message, which
    quotes a damaged schema entry (e.g. ``malformed database schema (ev\x80nts)``)."""
    if isinstance(e, UnicodeDecodeError):
        return "its schema is damaged (SQLite's message about it is not UTF-8 text)"
    return str(e)


def _connect_checked(uri: str, busy_timeout_s: float) -> sqlite3.Connection:
    conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


def _split(script: str) -> list[str]:
    """Statements of a migration script (no semicolons inside statements by convention)."""
    out = []
    for part in script.split(";"):
        lines = [ln.split("--")[0] for ln in part.splitlines()]
        stmt = "\n".join(lines).strip()
        if stmt:
            out.append(stmt)
    return out

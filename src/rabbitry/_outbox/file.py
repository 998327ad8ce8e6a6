"""The SQLite file of an outbox: its lock file, its connections and its schema."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from typing import Any, Protocol

from ..exceptions import OutboxCorrupt, OutboxError, OutboxLocked

try:  # POSIX; elsewhere the lock is taken by SQLite's own exclusive mode only
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "APPLICATION_ID",
    "COLUMNS",
    "SCHEMA_VERSION",
    "OutboxFile",
    "OutboxLock",
    "RowChanges",
    "StoredRow",
]

#: ``PRAGMA application_id`` of a rabbitry outbox ("RBOX").
APPLICATION_ID = 0x52424F58
#: The schema version, in ``PRAGMA user_version``.
SCHEMA_VERSION = 1

#: The columns of a stored message, in the order of :class:`StoredRow`'s fields.
COLUMNS = "id, message_id, exchange, routing_key, mandatory, properties, body, created_at"

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id TEXT NOT NULL,
    exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    mandatory INTEGER NOT NULL,
    properties BLOB NOT NULL,
    body BLOB NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT
);
CREATE TABLE IF NOT EXISTS dead (
    id INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL,
    exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    mandatory INTEGER NOT NULL,
    properties BLOB NOT NULL,
    body BLOB NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    reason TEXT NOT NULL,
    died_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('resent', 0);
PRAGMA application_id = {APPLICATION_ID};
PRAGMA user_version = {SCHEMA_VERSION};
"""
_TABLES = {"outbox", "dead", "meta", "sqlite_sequence"}


class StoredRow(Protocol):
    """A message to store (``rabbitry.outbox.OutboxRecord`` is one)."""

    id: int
    message_id: str
    exchange: str
    routing_key: str
    mandatory: bool
    properties: bytes
    body: bytes
    created_at: float


class RowChanges(Protocol):
    """The changes of one transaction (``rabbitry.outbox.OutboxBatch`` is one)."""

    @property
    def inserts(self) -> list[Any]: ...
    @property
    def deletes(self) -> list[int]: ...
    @property
    def failures(self) -> list[tuple[int, int, str]]: ...
    @property
    def deaths(self) -> list[tuple[int, str]]: ...
    @property
    def resent(self) -> int: ...


class OutboxLock:
    """Holds ``PATH.lock``, whose ``flock`` makes one publisher the owner of an outbox."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, writing this process's pid into the file.

        Raises:
            OutboxError: the lock file cannot be created.
            OutboxLocked: another process holds the lock.
        """
        if fcntl is None:  # pragma: no cover - not on Linux
            return
        lock_path = self.path + ".lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OutboxError(self.path, f"cannot create its lock file {lock_path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                holder = os.pread(fd, 32, 0).decode().strip()
            os.close(fd)
            who = f" (pid {holder})" if holder else ""
            raise OutboxLocked(
                self.path, f"in use by another publisher{who}; one outbox serves one publisher"
            ) from None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Release the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the descriptor releases the flock


class OutboxFile:
    """Opens connections to an outbox's SQLite file and checks that it holds a sound
    rabbitry outbox (creating the schema in a new, empty file)."""

    def __init__(self, path: str, busy_timeout: float) -> None:
        self.path = path
        self.busy_timeout = busy_timeout

    def connect(self, *, create: bool) -> sqlite3.Connection:
        """A new connection to the file (``create=False``: the file must exist)."""
        if not create and not os.path.exists(self.path):
            raise OutboxError(self.path, "no such file")
        try:
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
            db = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise OutboxError(self.path, f"cannot open: {exc}") from exc
        return db

    def check(self, db: sqlite3.Connection, *, create: bool) -> None:
        """Refuse anything but a sound rabbitry outbox (or an empty file, when creating)."""
        try:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            app_id = db.execute("PRAGMA application_id").fetchone()[0]
            tables = {
                row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if not tables and app_id == 0:
                if not create:
                    raise OutboxCorrupt(self.path, "empty database, not a rabbitry outbox")
                db.executescript(_SCHEMA)
                return
            if app_id != APPLICATION_ID or not _TABLES <= tables:
                raise OutboxCorrupt(
                    self.path,
                    f"not a rabbitry outbox (application_id {app_id:#x}, tables {sorted(tables)})",
                )
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                raise OutboxCorrupt(
                    self.path, f"schema version {version}, this rabbitry reads {SCHEMA_VERSION}"
                )
            problems = [row[0] for row in db.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise OutboxCorrupt(self.path, "integrity check failed: " + "; ".join(problems[:5]))
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise OutboxLocked(self.path, f"the database is locked ({exc})") from exc
            raise OutboxCorrupt(self.path, f"unreadable: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            # "file is not a database", "database disk image is malformed"
            raise OutboxCorrupt(self.path, f"unreadable: {exc}") from exc
        if mode.lower() != "wal":
            raise OutboxError(self.path, f"cannot use WAL journal mode (got {mode!r})")

    def apply(self, db: sqlite3.Connection, batch: RowChanges) -> None:
        """Apply ``batch`` in one transaction of ``db`` (see ``OutboxBatch``).

        Raises:
            OutboxError: the file cannot be written; nothing of the batch was applied.
        """
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                if batch.inserts:
                    # AUTOINCREMENT: SQLite itself remembers the highest id ever stored
                    # (sqlite_sequence), so ids are never reused after deletes.
                    self._insert(db, batch.inserts)
                if batch.deletes:
                    self._delete(db, batch.deletes)
                if batch.failures:
                    db.executemany(
                        "UPDATE outbox SET attempts = ?, last_error = ? WHERE id = ?",
                        [(attempts, error, i) for i, attempts, error in batch.failures],
                    )
                if batch.deaths:
                    now = time.time()
                    db.executemany(
                        f"INSERT OR REPLACE INTO dead ({COLUMNS}, attempts, last_error, "
                        f"reason, died_at) SELECT {COLUMNS}, attempts, last_error, ?, ? "
                        "FROM outbox WHERE id = ?",
                        [(reason, now, i) for i, reason in batch.deaths],
                    )
                    db.executemany(
                        "DELETE FROM outbox WHERE id = ?", [(i,) for i, _ in batch.deaths]
                    )
                if batch.resent:
                    db.execute(
                        "UPDATE meta SET value = value + ? WHERE key = 'resent'", (batch.resent,)
                    )
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise OutboxError(self.path, f"write failed: {exc}") from exc

    # Few statements per batch, each with many rows: sqlite3 releases the GIL around
    # every statement step, and getting it back while the event loop's thread runs can
    # take a whole switch interval (5 ms). One step per 1000 rows, not one per row.
    _ROWS_PER_INSERT = 1000

    def _insert(self, db: sqlite3.Connection, records: list[StoredRow]) -> None:
        step = self._ROWS_PER_INSERT
        for start in range(0, len(records), step):
            chunk = records[start : start + step]
            values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * len(chunk))
            args: list[Any] = []
            for r in chunk:
                args += (r.id, r.message_id, r.exchange, r.routing_key, r.mandatory,
                         r.properties, r.body, r.created_at)  # fmt: skip
            db.execute(f"INSERT INTO outbox ({COLUMNS}) VALUES {values}", args)

    @staticmethod
    def _delete(db: sqlite3.Connection, ids: list[int]) -> None:
        # Acks come mostly in id order: contiguous runs become one range each.
        ordered = sorted(ids)
        ranges: list[tuple[int, int]] = []
        low = high = ordered[0]
        for value in ordered[1:]:
            if value == high + 1:
                high = value
            else:
                ranges.append((low, high))
                low = high = value
        ranges.append((low, high))
        for start in range(0, len(ranges), 500):
            chunk = ranges[start : start + 500]
            where = " OR ".join(["id BETWEEN ? AND ?"] * len(chunk))
            db.execute(f"DELETE FROM outbox WHERE {where}", [v for pair in chunk for v in pair])

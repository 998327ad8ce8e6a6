"""Durable outbox stores: where a publisher keeps messages until the broker confirms them.

An :class:`Outbox` is storage plus the policy of the publisher that drains it (its bound,
the confirm timeout, the resend backoff). Pass one to ``connection.publisher(outbox=...)``
to get an :class:`rabbitry.AsyncOutboxPublisher` (or its sync twin): ``publish()`` then
returns once the message is stored, and the publisher delivers it with confirms in the
background, deleting it only after the broker's ack (see ``docs/outbox.md``).

Theory of operation
-------------------
A store holds two tables: ``outbox`` (messages to deliver) and ``dead`` (messages the
broker returned as unroutable, with the reason). The publisher calls the store from one
writer thread only, and hands it all the changes gathered meanwhile in one
:class:`OutboxBatch`, applied as one transaction (group commit): the inserts of every
``publish()`` waiting, the deletes of every acked row, the resends and the deaths. Row
ids are numbered by the publisher (from :meth:`Outbox.open`'s answer), so a stored
message never has to be read back to be sent; the store is read only when a publisher
starts (:meth:`Outbox.pending`) and by the ``rabbitry outbox`` command.

One outbox serves one publisher at a time: :class:`SQLiteOutbox` holds an exclusive
advisory lock on ``PATH.lock`` while open, so a second publisher on the same file gets
:class:`rabbitry.exceptions.OutboxLocked` at start instead of both sending each other's
rows. Reading the status needs no lock.

To plug in another database, subclass :class:`Outbox` and implement its abstract methods;
``apply`` must be atomic (all of the batch or none of it) and durable when it returns.
"""

from __future__ import annotations

import abc
import contextlib
import os
import sqlite3
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ._outbox.file import APPLICATION_ID as APPLICATION_ID
from ._outbox.file import COLUMNS, OutboxFile, OutboxLock
from ._outbox.file import SCHEMA_VERSION as SCHEMA_VERSION
from .exceptions import ConfigurationError, OutboxError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = [
    "DeadRecord",
    "Outbox",
    "OutboxBatch",
    "OutboxRecord",
    "OutboxStatus",
    "SQLiteOutbox",
]


@dataclass(slots=True)
class OutboxRecord:
    """One stored message.

    Attributes:
        id: its row id, numbered by the publisher (increasing).
        message_id: the AMQP ``message_id`` it is sent with (every send, every resend):
            consumers de-duplicate on it.
        exchange: the exchange to publish to.
        routing_key: the routing key.
        mandatory: published mandatory (a return moves it to the dead table).
        properties: the encoded AMQP basic properties (flags and values).
        body: the payload.
        created_at: when it was stored (seconds since the epoch).
        attempts: how many sends failed so far (nack, confirm timeout, lost channel).
        last_error: why the last send failed.
    """

    id: int
    message_id: str
    exchange: str
    routing_key: str
    mandatory: bool
    properties: bytes
    body: bytes
    created_at: float
    attempts: int = 0
    last_error: str | None = None

    @property
    def size(self) -> int:
        """The bytes it counts against the outbox's ``max_bytes``."""
        return len(self.body) + len(self.properties)


@dataclass(frozen=True, slots=True)
class DeadRecord:
    """A message the broker returned as unroutable, kept with the reason.

    Attributes:
        record: the message as it was stored.
        reason: why it died, e.g. ``"312 NO_ROUTE"``.
        died_at: when (seconds since the epoch).
    """

    record: OutboxRecord
    reason: str
    died_at: float


@dataclass(slots=True)
class OutboxBatch:
    """Changes applied by :meth:`Outbox.apply` in one transaction, in this order.

    Attributes:
        inserts: new rows.
        deletes: ids of rows the broker acked.
        failures: ``(id, attempts, error)`` of rows whose send failed and that will be
            sent again (nack, confirm timeout, channel lost).
        deaths: ``(id, reason)`` of rows to move to the dead table.
        resent: how many sends this batch counts as resends (kept as a total).
    """

    inserts: list[OutboxRecord] = field(default_factory=list)
    deletes: list[int] = field(default_factory=list)
    failures: list[tuple[int, int, str]] = field(default_factory=list)
    deaths: list[tuple[int, str]] = field(default_factory=list)
    resent: int = 0

    def __bool__(self) -> bool:
        return bool(self.inserts or self.deletes or self.failures or self.deaths or self.resent)


@dataclass(frozen=True, slots=True)
class OutboxStatus:
    """What an outbox holds.

    Attributes:
        pending: messages waiting for the broker's ack.
        pending_bytes: their size (body + properties).
        oldest_created_at: when the oldest pending message was stored, or ``None``.
        retrying: pending messages that failed at least one send.
        dead: messages in the dead table.
        resent: sends that were resends, in total over the outbox's life.
        last_id: the highest row id used (in either table).
    """

    pending: int
    pending_bytes: int
    oldest_created_at: float | None
    retrying: int
    dead: int
    resent: int
    last_id: int

    def oldest_age(self, now: float | None = None) -> float | None:
        """Seconds since the oldest pending message was stored.

        Args:
            now: the current ``time.time()`` (default: now).

        Returns:
            The age, or ``None`` when nothing is pending.
        """
        if self.oldest_created_at is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.oldest_created_at)


class Outbox(abc.ABC):
    """Storage of a durable publisher outbox, and the policy of the publisher draining it.

    A publisher calls these methods from one thread at a time (its writer thread), so
    implementations need no locking of their own; they should hold an exclusive claim
    on the storage between :meth:`open` and :meth:`close` (see the module docstring).

    Args:
        max_rows: at most this many messages stored; past it ``publish()`` waits.
        max_bytes: at most this many bytes (bodies + properties) stored.
        confirm_timeout: seconds to wait for a confirm before sending the message again.
        retry_delay: the first resend's delay after a failed send, in seconds; it doubles
            per failure of the same message (with ±25 % jitter) up to ``max_retry_delay``.
        max_retry_delay: the cap of that backoff.

    Raises:
        ConfigurationError: an invalid option.
    """

    def __init__(
        self,
        *,
        max_rows: int = 100_000,
        max_bytes: int = 256 * 1024 * 1024,
        confirm_timeout: float = 30.0,
        retry_delay: float = 0.5,
        max_retry_delay: float = 30.0,
    ) -> None:
        for name, value in (("max_rows", max_rows), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name}: must be an int >= 1, got {value!r}")
        if not confirm_timeout > 0:
            raise ConfigurationError(f"confirm_timeout: must be > 0, got {confirm_timeout!r}")
        if not retry_delay >= 0:
            raise ConfigurationError(f"retry_delay: must be >= 0, got {retry_delay!r}")
        if not max_retry_delay >= retry_delay:
            raise ConfigurationError(
                f"max_retry_delay: must be >= retry_delay ({retry_delay}), got {max_retry_delay!r}"
            )
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.confirm_timeout = float(confirm_timeout)
        self.retry_delay = float(retry_delay)
        self.max_retry_delay = float(max_retry_delay)

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """Where the outbox lives, as shown in errors (a path for a file)."""

    @abc.abstractmethod
    def open(self) -> OutboxStatus:
        """Claim and check the storage (creating it if new); returns what it holds.

        Raises:
            OutboxLocked: another publisher holds it.
            OutboxCorrupt: it is damaged or not an outbox.
            OutboxError: it cannot be opened (permissions, missing directory...).
        """

    @abc.abstractmethod
    def pending(self) -> Iterator[OutboxRecord]:
        """The stored messages (not dead), oldest first (by id)."""

    @abc.abstractmethod
    def apply(self, batch: OutboxBatch) -> None:
        """Apply ``batch`` atomically and durably (see :class:`OutboxBatch`).

        Args:
            batch: the inserts, deletes, failures and deaths to apply.

        Raises:
            OutboxError: nothing of the batch was applied.
        """

    @abc.abstractmethod
    def status(self) -> OutboxStatus:
        """What the outbox holds now (works without :meth:`open` too)."""

    @abc.abstractmethod
    def dead(self, limit: int | None = None) -> list[DeadRecord]:
        """Messages in the dead table, oldest first.

        Args:
            limit: at most this many (``None``: all).

        Returns:
            The dead messages, with why they died.
        """

    @abc.abstractmethod
    def retry_dead(self, ids: Sequence[int] | None = None) -> int:
        """Move dead messages back for delivery.

        Needs the exclusive claim (no publisher may be running on this outbox).

        Args:
            ids: the messages to move (``None``: all).

        Returns:
            How many were moved.
        """

    @abc.abstractmethod
    def purge_dead(self, ids: Sequence[int] | None = None) -> int:
        """Delete dead messages.

        Args:
            ids: the messages to delete (``None``: all).

        Returns:
            How many were deleted.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the storage (idempotent)."""


class SQLiteOutbox(Outbox):
    """An outbox in one SQLite file (standard library ``sqlite3``, WAL journal).

    Args:
        path: the database file; created with its directory's permissions when missing
            (the directory must exist). ``PATH-wal``, ``PATH-shm`` and ``PATH.lock``
            live beside it.
        synchronous: SQLite's ``synchronous`` setting. ``"FULL"`` (default) syncs the
            write-ahead log at every commit: a stored message survives a power cut.
            ``"NORMAL"`` survives a crash of the process (SIGKILL) but may lose the last
            commits on a power cut; it is faster on slow disks.
        busy_timeout: seconds to wait for SQLite's own locks (the CLI reading or purging
            at the same time).
        **policy: ``max_rows``, ``max_bytes``, ``confirm_timeout``, ``retry_delay``,
            ``max_retry_delay`` (see :class:`Outbox`).

    Raises:
        ConfigurationError: an invalid option.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout: float = 5.0,
        **policy: Any,
    ) -> None:
        super().__init__(**policy)
        if synchronous not in ("FULL", "NORMAL"):
            raise ConfigurationError(
                f"synchronous: must be 'FULL' or 'NORMAL', got {synchronous!r}"
            )
        if not busy_timeout >= 0:
            raise ConfigurationError(f"busy_timeout: must be >= 0, got {busy_timeout!r}")
        self.path = os.fspath(path)
        self.synchronous = synchronous
        self.busy_timeout = float(busy_timeout)
        self._db: sqlite3.Connection | None = None
        self._file = OutboxFile(self.path, self.busy_timeout)
        self._lock = OutboxLock(self.path)

    def __repr__(self) -> str:
        return f"<SQLiteOutbox {self.path!r} max_rows={self.max_rows} max_bytes={self.max_bytes}>"

    @property
    def name(self) -> str:
        """The file path."""
        return self.path

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> OutboxStatus:
        """Lock, check and (if new) create the outbox file; see :meth:`Outbox.open`."""
        if self._db is not None:
            raise OutboxError(self.path, "already open")
        self._lock.acquire()
        try:
            db = self._file.connect(create=True)
            try:
                self._file.check(db, create=True)
                db.execute(f"PRAGMA synchronous={self.synchronous}")
            except BaseException:
                db.close()
                raise
        except BaseException:
            self._lock.release()
            raise
        self._db = db
        return self.status()

    def close(self) -> None:
        """Close the database and release the lock (idempotent)."""
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.close()
        self._lock.release()

    def _require(self) -> sqlite3.Connection:
        if self._db is None:
            raise OutboxError(self.path, "not open")
        return self._db

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        """The open connection, or a short-lived one for the CLI (no lock needed)."""
        if self._db is not None:
            yield self._db
            return
        db = self._file.connect(create=False)
        try:
            self._file.check(db, create=False)
            yield db
        finally:
            db.close()

    # ------------------------------------------------------------------ the publisher's path

    def pending(self) -> Iterator[OutboxRecord]:
        """The stored messages, oldest first, read in pages."""
        db = self._require()
        last = 0
        while True:
            rows = db.execute(
                f"SELECT {COLUMNS}, attempts, last_error FROM outbox WHERE id > ? "
                "ORDER BY id LIMIT 1000",
                (last,),
            ).fetchall()
            if not rows:
                return
            for row in rows:
                yield _record(row)
            last = rows[-1][0]

    def apply(self, batch: OutboxBatch) -> None:
        """One transaction: inserts, deletes, failures, deaths (see :class:`OutboxBatch`).

        Args:
            batch: what to apply.

        Raises:
            OutboxError: the file cannot be written; nothing of the batch was applied.
        """
        self._file.apply(self._require(), batch)

    # ------------------------------------------------------------------ inspection (CLI)

    def status(self) -> OutboxStatus:
        """Counts and ages; opens the file read-only-ish for the moment if not open."""
        try:
            with self._reader() as db:
                pending, size, oldest, retrying = db.execute(
                    "SELECT count(*), coalesce(sum(length(body) + length(properties)), 0), "
                    "min(created_at), coalesce(sum(attempts > 0), 0) FROM outbox"
                ).fetchone()
                dead = db.execute("SELECT count(*) FROM dead").fetchone()[0]
                meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
                top = db.execute(
                    "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = "
                    "'outbox'), 0), coalesce((SELECT max(id) FROM outbox), 0), "
                    "coalesce((SELECT max(id) FROM dead), 0))"
                ).fetchone()[0]
        except sqlite3.Error as exc:
            raise OutboxError(self.path, f"read failed: {exc}") from exc
        return OutboxStatus(
            pending=pending,
            pending_bytes=size,
            oldest_created_at=oldest,
            retrying=retrying,
            dead=dead,
            resent=int(meta.get("resent", 0)),
            last_id=int(top),
        )

    def reasons(self, limit: int = 10) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """Why messages are dead and why pending ones are being retried.

        Args:
            limit: at most this many reasons of each kind.

        Returns:
            ``(dead, retrying)``: each a list of ``(reason, rows)``, most rows first, at
            most ``limit`` reasons each. ``retrying`` groups pending rows by their last
            send error.

        Raises:
            OutboxError: the file cannot be read.
        """
        try:
            with self._reader() as db:
                dead = db.execute(
                    "SELECT reason, count(*) AS n FROM dead GROUP BY reason "
                    "ORDER BY n DESC, reason LIMIT ?",
                    (limit,),
                ).fetchall()
                retrying = db.execute(
                    "SELECT last_error, count(*) AS n FROM outbox WHERE attempts > 0 "
                    "GROUP BY last_error ORDER BY n DESC, last_error LIMIT ?",
                    (limit,),
                ).fetchall()
        except sqlite3.Error as exc:
            raise OutboxError(self.path, f"read failed: {exc}") from exc
        return (
            [(str(reason), int(n)) for reason, n in dead],
            [(str(error or "unknown"), int(n)) for error, n in retrying],
        )

    def dead(self, limit: int | None = None) -> list[DeadRecord]:
        """Dead messages, oldest first.

        Args:
            limit: at most this many (``None``: all).

        Returns:
            The dead messages, with why they died.

        Raises:
            OutboxError: the file cannot be read.
        """
        try:
            with self._reader() as db:
                rows = db.execute(
                    f"SELECT {COLUMNS}, attempts, last_error, reason, died_at FROM dead "
                    "ORDER BY id LIMIT ?",
                    (-1 if limit is None else limit,),
                ).fetchall()
        except sqlite3.Error as exc:
            raise OutboxError(self.path, f"read failed: {exc}") from exc
        return [DeadRecord(_record(row[:10]), row[10], row[11]) for row in rows]

    def retry_dead(self, ids: Sequence[int] | None = None) -> int:
        """Move dead messages back into the outbox (with new ids, attempts reset).

        Takes the outbox's lock for the moment (it could not be seen by a running
        publisher, and ids would collide).

        Args:
            ids: the messages to move (``None``: all).

        Returns:
            How many were moved.

        Raises:
            OutboxLocked: a publisher runs on this outbox.
            OutboxError: there is no such file, or it cannot be written.
        """
        owned = self._db is None
        if owned:
            if not os.path.exists(self.path):
                raise OutboxError(self.path, "no such file")
            self.open()
        db = self._require()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                where, args = _id_filter(ids)
                rows = db.execute(f"SELECT id FROM dead {where} ORDER BY id", args).fetchall()
                top = self.status().last_id
                for offset, (old,) in enumerate(rows, start=1):
                    db.execute(
                        f"INSERT INTO outbox ({COLUMNS}) SELECT ?, message_id, exchange, "
                        "routing_key, mandatory, properties, body, created_at FROM dead "
                        "WHERE id = ?",
                        (top + offset, old),
                    )
                    db.execute("DELETE FROM dead WHERE id = ?", (old,))
                db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise OutboxError(self.path, f"write failed: {exc}") from exc
        finally:
            if owned:
                self.close()
        return len(rows)

    def purge_dead(self, ids: Sequence[int] | None = None) -> int:
        """Delete dead messages; safe while a publisher runs (it never reads them).

        Args:
            ids: the messages to delete (``None``: all).

        Returns:
            How many were deleted.

        Raises:
            OutboxError: the file cannot be written.
        """
        where, args = _id_filter(ids)
        try:
            with self._reader() as db:
                count = db.execute(f"DELETE FROM dead {where}", args).rowcount
        except sqlite3.Error as exc:
            raise OutboxError(self.path, f"write failed: {exc}") from exc
        return int(count)


def _record(row: Sequence[Any]) -> OutboxRecord:
    return OutboxRecord(
        id=row[0],
        message_id=row[1],
        exchange=row[2],
        routing_key=row[3],
        mandatory=bool(row[4]),
        properties=bytes(row[5]),
        body=bytes(row[6]),
        created_at=row[7],
        attempts=row[8],
        last_error=row[9],
    )


def _id_filter(ids: Sequence[int] | None) -> tuple[str, tuple[int, ...]]:
    if ids is None:
        return "", ()
    values = tuple(int(i) for i in ids)
    if not values:
        return "WHERE 0", ()
    return f"WHERE id IN ({', '.join('?' * len(values))})", values

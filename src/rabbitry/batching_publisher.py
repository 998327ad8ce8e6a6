"""Opt-in micro-batching publishers: many records per AMQP message (Spring AMQP's format).

:class:`AsyncBatchingPublisher` wraps an :class:`~rabbitry.AsyncPublisher` and
:class:`BatchingPublisher` a :class:`~rabbitry.Publisher`. ``publish(record)`` adds the
record to the open batch and returns a future for it; the batch goes out as one
envelope (format in :mod:`rabbitry.batching`) when it holds ``batch_records`` records,
when the next record would take it past ``batch_bytes``, ``linger`` seconds after its
first record, on :meth:`flush`, or when the exchange or routing key changes. A batch of
one record goes out as a plain message.

Guarantees:

* The broker confirms the envelope, so every record's future settles with the
  envelope's outcome: all succeed together, or all fail with the same exception
  (:class:`~rabbitry.Nacked`, :class:`~rabbitry.Unroutable` with ``mandatory``,
  :class:`~rabbitry.PublishRefused`, :class:`~rabbitry.PublishOutcomeUnknown`...).
* The envelope body never exceeds ``batch_bytes``, itself at most
  :data:`MAX_BATCH_BYTES`. A single record larger than that is sent alone, as a plain
  message (still bound by the connection's ``max_message_size``).
* Records keep their order within a publisher (envelopes go out in the order they were
  sealed).
* All records of an envelope share its properties (``properties``, ``persistent``,
  ``expiration`` given here) and its ``message_id``.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from ._failure_log import RateLimitedLog
from .batching import envelope_headers
from .exceptions import ConfigurationError, InvalidStateError, LocalProtocolError
from .protocol import spec
from .publisher import as_properties, port_of
from .sync._portal import ConfirmFuture
from .sync.publisher import closed_state_of, ledger_of

if TYPE_CHECKING:
    import concurrent.futures
    from collections.abc import Callable
    from datetime import timedelta

    from .publisher import AsyncPublisher, Body
    from .publishing.unobserved import UnobservedLedger
    from .sync.publisher import Publisher

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "MAX_BATCH_BYTES",
    "AsyncBatchingPublisher",
    "BatchingPublisher",
    "BatchingStats",
]

logger = logging.getLogger("rabbitry.batching")

#: Default bound of an envelope's body: 128 KiB.
DEFAULT_BATCH_BYTES: Final = 128 * 1024
#: Hard cap of ``batch_bytes`` (8 MiB): big envelopes cost memory on both ends and in
#: the queue, and a failure sends every record of one back through the retry path.
MAX_BATCH_BYTES: Final = 8 * 1024 * 1024
_MAX_RECORDS: Final = 100_000
_MAX_LINGER: Final = 60.0
_pack_length = struct.Struct(">I").pack
_PROPERTIES_CACHE: Final = 256


class BatchingStats:
    """Counters of a batching publisher.

    Attributes:
        records: records accepted by ``publish``.
        envelopes: envelopes sent (batches of two records or more).
        singles: batches of one record, sent as plain messages.
    """

    __slots__ = ("envelopes", "records", "singles")

    def __init__(self) -> None:
        self.records = 0
        self.envelopes = 0
        self.singles = 0

    def __repr__(self) -> str:
        return (
            f"BatchingStats(records={self.records}, envelopes={self.envelopes}, "
            f"singles={self.singles})"
        )


def _check_options(batch_records: object, batch_bytes: object, linger: object) -> None:
    for field, value, low, high in (
        ("batch_records", batch_records, 1, _MAX_RECORDS),
        ("batch_bytes", batch_bytes, 5, MAX_BATCH_BYTES),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigurationError(f"{field}: must be an integer in {low}..{high}, got {value!r}")
    if (
        isinstance(linger, bool)
        or not isinstance(linger, int | float)
        or not 0 <= linger <= _MAX_LINGER
    ):
        raise ConfigurationError(f"linger: must be 0..{_MAX_LINGER:g} seconds, got {linger!r}")


def _record_bytes(body: object) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    raise LocalProtocolError(
        f"record: must be bytes, bytearray, memoryview or str, got {type(body).__name__}"
    )


def _check_target(exchange: object, routing_key: object) -> tuple[str, str]:
    for field, value in (("exchange", exchange), ("routing_key", routing_key)):
        if not isinstance(value, str):
            raise LocalProtocolError(
                f"basic.publish.{field}: must be a str, got {type(value).__name__}"
            )
        if len(value) > 255 and len(value.encode("utf-8", "surrogateescape")) > 255:
            raise LocalProtocolError(f"basic.publish.{field}: shortstr longer than 255 bytes")
    return exchange, routing_key  # type: ignore[return-value]


class _Batch:
    """An open or sealed batch: its target, records (each after its length field, ready
    to be joined into an envelope body) and their futures."""

    __slots__ = ("futures", "parts", "size", "target")

    def __init__(self, target: tuple[str, str]) -> None:
        self.target = target
        self.parts: list[bytes] = []
        self.futures: list[Any] = []
        self.size = 0


class _Accumulator:
    """The batching rules without I/O: what to seal when, for both publishers."""

    def __init__(self, batch_records: int, batch_bytes: int) -> None:
        self.max_records = batch_records
        self.max_bytes = batch_bytes
        self.open: _Batch | None = None
        self.sealed: deque[_Batch] = deque()
        self.stats = BatchingStats()

    def add(self, target: tuple[str, str], body: bytes, future: Any) -> bool:
        """Add a record; True when it opened a new batch (the linger clock starts).

        The target of a batch's first record is checked (a later record with an equal
        target needs no check); a full batch is moved to ``sealed``.
        """
        size = 4 + len(body)
        batch = self.open
        opened = False
        if batch is None or batch.target != target or batch.size + size > self.max_bytes:
            if batch is not None:
                self.seal()
            _check_target(*target)
            batch = self.open = _Batch(target)
            opened = True
        parts = batch.parts
        parts.append(_pack_length(size - 4))
        parts.append(body)
        batch.futures.append(future)
        batch.size += size
        self.stats.records += 1
        if len(batch.futures) >= self.max_records or batch.size >= self.max_bytes:
            self.seal()
        return opened

    def seal(self) -> None:
        if self.open is not None:
            self.sealed.append(self.open)
            self.open = None


class _EnvelopeOptions:
    """What every envelope of a publisher is sent with."""

    def __init__(
        self,
        properties: spec.BasicProperties | Mapping[str, Any] | None,
        persistent: bool | None,
        expiration: int | timedelta | None,
        mandatory: bool | None,
        timeout: float | None,
    ) -> None:
        if properties is not None and not isinstance(properties, spec.BasicProperties):
            if not isinstance(properties, Mapping):
                raise ConfigurationError(
                    "properties: must be rabbitry.Properties or a mapping of its fields, "
                    f"got {type(properties).__name__}"
                )
            properties = as_properties(properties)
        if properties is not None and properties.message_id is not None:
            # Each envelope is one message and gets its own id from the publisher; one
            # fixed id would make a deduplicating consumer drop every envelope but one.
            raise ConfigurationError(
                "properties.message_id: must be unset; every envelope gets its own "
                f"message_id (got {properties.message_id!r} for all of them)"
            )
        base = properties if properties is not None else spec.BasicProperties()
        base.encode()  # validated now, not at the first envelope
        self.base = base
        self._by_count: dict[int, spec.BasicProperties] = {}
        self.persistent = persistent
        self.expiration = expiration
        self.mandatory = mandatory
        self.timeout = timeout

    def message(self, batch: _Batch) -> tuple[bytes, spec.BasicProperties]:
        count = len(batch.futures)
        if count == 1:
            return batch.parts[1], self.base
        props = self._by_count.get(count)
        if props is None:
            # One properties object per record count (the publisher copies it to add the
            # message_id), so an envelope costs no copy of its own.
            props = copy.copy(self.base)
            props.headers = envelope_headers(self.base.headers, count)
            if len(self._by_count) < _PROPERTIES_CACHE:
                self._by_count[count] = props
        return b"".join(batch.parts), props

    def publish_options(self, batch: _Batch, props: spec.BasicProperties) -> dict[str, Any]:
        exchange, routing_key = batch.target
        return {
            "exchange": exchange,
            "routing_key": routing_key,
            "properties": props,
            "mandatory": self.mandatory,
            "persistent": self.persistent,
            "expiration": self.expiration,
            "timeout": self.timeout,
        }


def _settle_all(futures: list[Any], ledger: UnobservedLedger, outcome: Any) -> None:
    """Give every record future the envelope future's outcome."""
    if outcome.cancelled():
        error: BaseException | None = InvalidStateError("the envelope's publish was cancelled")
    else:
        error = outcome.exception()
    for future in futures:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            ledger.fail(future, error)


def _fail_all(
    futures: list[Any], error: BaseException, ledger: UnobservedLedger | None = None
) -> None:
    """Fail every record future not done yet (through ``ledger``, when given, so that
    a failure nobody looks at is reported when the publisher ends)."""
    for future in futures:
        if future.done():
            continue
        if ledger is None:
            future.set_exception(error)
        else:
            ledger.fail(future, error)


# --------------------------------------------------------------------------- asyncio


def _envelope_failures() -> RateLimitedLog:
    """The ERROR log of envelopes the publisher refused, rate-limited with counts (by
    error type): a publisher failing every envelope logs a few lines a minute, not
    one per envelope."""
    return RateLimitedLog(logger, "batching publisher", "unsent envelopes")


def _ended_by(closed_state: Callable[[], InvalidStateError]) -> BaseException | None:
    """What closed a publisher: its connection's end (``ConnectionClosed``,
    ``RecoveryFailed``...) when that closed it, ``None`` when its owner did; read from
    the error the publisher's own calls raise once it is closed."""
    return closed_state().__cause__


def _publisher_gone(
    acc: _Accumulator, failed: int = 0, cause: BaseException | None = None
) -> InvalidStateError:
    """The publisher under a batching publisher is closed: fail what is still held.

    Every record of the open and the sealed batches fails, and one ERROR line counts
    them (with ``failed`` records whose envelope the publisher just refused): nothing
    will send them. Returns the error a :meth:`publish` now raises, chained to
    ``cause`` (what closed the publisher) as the plain publisher's own error is.
    """
    if isinstance(cause, InvalidStateError) and cause.__cause__ is not None:
        cause = cause.__cause__  # the publisher's "is closed": name the connection's end
    acc.seal()
    error = InvalidStateError(
        "the batching publisher's publisher is closed (closed by its owner, or with its "
        "connection once that ended for good): the record was not added"
    )
    error.__cause__ = cause
    envelopes = 1 if failed else 0
    while acc.sealed:
        futures = acc.sealed.popleft().futures
        lost = InvalidStateError("the envelope was not sent: the publisher is closed")
        lost.__cause__ = cause
        _fail_all(futures, lost)
        failed += len(futures)
        envelopes += 1
    if failed:
        logger.error(
            "batching publisher: its publisher is closed%s; %d records in %d envelopes "
            "were not sent (their futures failed), and publish() now raises",
            f" ({cause!r})" if cause is not None else "",
            failed,
            envelopes,
        )
    return error


class AsyncBatchingPublisher:
    """Publishes records in batch envelopes through an :class:`~rabbitry.AsyncPublisher`.

    See the module documentation for when a batch goes out and what a future means.
    Use it as ``async with`` or call :meth:`close`, which sends the open batch; the
    wrapped publisher stays open (it is the caller's).

    Args:
        publisher: the publisher that sends the envelopes (confirms on, as a rule).
        batch_records: at most this many records per envelope (1..100,000).
        batch_bytes: at most this many body bytes per envelope, 4 per record included
            (5..8 MiB, default 128 KiB).
        linger: seconds a batch may wait for more records after its first one (0 sends
            it at the next turn of the event loop).
        properties: the properties of every envelope (and so of every record).
        persistent: ``True`` sends envelopes with delivery mode 2.
        expiration: per-envelope TTL (int ms or ``timedelta``).
        mandatory: ask for envelopes no queue took to be returned (``None``: the
            publisher's default).
        timeout: the per-envelope deadline (``None``: the publisher's default).

    Raises:
        ConfigurationError: an option breaks a rule.
    """

    def __init__(
        self,
        publisher: AsyncPublisher,
        *,
        batch_records: int = 100,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        linger: float = 0.005,
        properties: spec.BasicProperties | Mapping[str, Any] | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        mandatory: bool | None = None,
        timeout: float | None = None,
    ) -> None:
        _check_options(batch_records, batch_bytes, linger)
        self.publisher = publisher
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.linger = float(linger)
        self._options = _EnvelopeOptions(properties, persistent, expiration, mandatory, timeout)
        self._acc = _Accumulator(batch_records, batch_bytes)
        self._loop = port_of(publisher).loop
        self._sender: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # Record futures that fail with nobody looking at them are reported by the
        # publisher's close(), which waits for their envelopes (this close does not).
        port = port_of(publisher)
        self._ledger = port.ledger
        self._closed_state = port.closed_state
        self._failures = _envelope_failures()

    @property
    def stats(self) -> BatchingStats:
        """Records accepted, envelopes and single messages sent."""
        return self._acc.stats

    async def __aenter__(self) -> AsyncBatchingPublisher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def publish(
        self, body: Body, *, exchange: str = "", routing_key: str = ""
    ) -> asyncio.Future[None]:
        """Add a record to the batch for ``exchange``/``routing_key``; returns its future.

        Waits only when a full batch is being handed to the publisher (whose window
        may be full), never for the confirm: waiting for each record's confirm would
        send one record per envelope. A record future that fails with nobody looking
        at it is raised by the publisher's ``close()`` as
        :class:`UnobservedPublishFailures`.

        Args:
            body: the record.
            exchange: the exchange of the envelope it goes into.
            routing_key: the routing key of that envelope.

        Returns:
            A future that resolves when the broker confirms the envelope, or fails
            with the envelope's error.

        Raises:
            LocalProtocolError: the record or target is invalid; nothing was added.
            InvalidStateError: the batching publisher is closed or closing, or its
                publisher is (closed by its owner, or with its connection once that
                ended for good); the records it still held have failed.
        """
        if self._closed:
            raise InvalidStateError("this batching publisher is closed")
        if self.publisher.is_closed:
            raise _publisher_gone(self._acc, cause=_ended_by(self._closed_state))
        if type(body) is not bytes:
            body = _record_bytes(body)
        future: asyncio.Future[None] = self._loop.create_future()
        acc = self._acc
        if acc.add((exchange, routing_key), body, future) and acc.open is not None:
            self._start_timer()
        if acc.sealed:
            if acc.open is None:
                self._cancel_timer()
            await self._drain()
        return future

    async def flush(self) -> None:
        """Send the open batch now; returns once every sealed batch was handed over."""
        self._cancel_timer()
        self._acc.seal()
        await self._drain()

    async def wait_for_confirms(self, *, timeout: float | None = None) -> None:
        """Flush, then wait until the broker has settled everything sent so far.

        Args:
            timeout: seconds to wait (``None``: no limit); the publisher's
                ``wait_for_confirms`` raises :class:`PublishTimeout` past it.
        """
        await self.flush()
        await self.publisher.wait_for_confirms(timeout=timeout)

    async def close(self) -> None:
        """Send the open batch and refuse new records (the publisher stays open).

        Records are refused from the moment ``close()`` is called: another task's
        :meth:`publish` while the last batches are handed over raises
        :class:`InvalidStateError`, so no record is accepted that nothing would send.
        A record future that fails with nobody looking at it is reported by the
        publisher's ``close()`` (:class:`UnobservedPublishFailures`), which waits for
        the envelopes still in flight.
        """
        if self._closed:
            return
        self._closed = True
        await self.flush()
        for task in list(self._tasks):
            await task
        self._failures.close()  # the summary of unsent envelopes only counted, if any

    # ------------------------------------------------------------------ internals

    def _start_timer(self) -> None:
        self._cancel_timer()
        if self.linger:
            self._timer = self._loop.call_later(self.linger, self._on_linger)
        else:
            self._timer = self._loop.call_soon(self._on_linger)  # type: ignore[assignment]

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_linger(self) -> None:
        self._timer = None
        self._acc.seal()
        task = asyncio.ensure_future(self._drain())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        """Hand sealed batches to the publisher, in order; returns once they are.

        The sending runs in one task of the batching publisher's own, which the caller
        only waits for: a caller cancelled meanwhile (``wait_for``, a task cancelled at
        shutdown) stops waiting, but the envelope, which holds other callers' records
        too, is still sent.
        """
        while self._acc.sealed:
            task = self._sender
            if task is None or task.done():
                task = self._sender = self._loop.create_task(self._send_sealed())
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            await asyncio.shield(task)

    async def _send_sealed(self) -> None:
        sealed = self._acc.sealed
        while sealed:
            await self._send(sealed.popleft())

    async def _send(self, batch: _Batch) -> None:
        options = self._options
        futures = batch.futures
        try:
            body, props = options.message(batch)
            sent = await self.publisher.send(body, **options.publish_options(batch, props))
        except BaseException as exc:
            if isinstance(exc, Exception) and self.publisher.is_closed:
                _fail_all(futures, exc, self._ledger)
                _publisher_gone(self._acc, len(futures), exc)  # one ERROR for all of them
                return
            self._failures.log(
                type(exc).__name__,
                "batching publisher: an envelope of %d records was not sent: %r",
                len(futures),
                exc,
            )
            if isinstance(exc, Exception):
                _fail_all(futures, exc, self._ledger)
                return
            # This sending task itself was cancelled (the event loop is shutting down):
            # nothing will send these records, so their futures fail now.
            _fail_all(
                futures, InvalidStateError(f"the envelope was not sent: {exc!r}"), self._ledger
            )
            raise
        if len(futures) == 1:
            self._acc.stats.singles += 1
        else:
            self._acc.stats.envelopes += 1
        sent.add_done_callback(functools.partial(_settle_all, futures, self._ledger))


# --------------------------------------------------------------------------- threads


class BatchingPublisher:
    """The thread-safe twin of :class:`AsyncBatchingPublisher`, over a
    :class:`~rabbitry.Publisher`; record futures are ``concurrent.futures.Future``.

    Any thread may publish. A batch is handed to the publisher by the thread whose
    record filled it, by :meth:`flush`, or by a linger thread (started with the first
    record) when ``linger`` passes; that thread waits while the publisher's window is
    full, and other publishing threads wait with it. Record futures are settled on the
    connection's callback thread, never on its IO thread: callbacks added to them run
    there, in order, and should be quick (other callbacks wait for them). Same options
    as the async twin.
    """

    def __init__(
        self,
        publisher: Publisher,
        *,
        batch_records: int = 100,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        linger: float = 0.005,
        properties: spec.BasicProperties | Mapping[str, Any] | None = None,
        persistent: bool | None = None,
        expiration: int | timedelta | None = None,
        mandatory: bool | None = None,
        timeout: float | None = None,
    ) -> None:
        _check_options(batch_records, batch_bytes, linger)
        self.publisher = publisher
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self.linger = float(linger)
        self._options = _EnvelopeOptions(properties, persistent, expiration, mandatory, timeout)
        self._acc = _Accumulator(batch_records, batch_bytes)
        # One lock for adding and sending: envelopes leave in the order they were sealed.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._deadline: float | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        # As in the async twin: reported by the publisher's close().
        self._ledger = ledger_of(publisher)
        self._closed_state = closed_state_of(publisher)
        self._failures = _envelope_failures()

    @property
    def stats(self) -> BatchingStats:
        """Records accepted, envelopes and single messages sent."""
        return self._acc.stats

    def __enter__(self) -> BatchingPublisher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def publish(
        self, body: Body, *, exchange: str = "", routing_key: str = ""
    ) -> concurrent.futures.Future[None]:
        """Add a record (see :meth:`AsyncBatchingPublisher.publish`).

        Args:
            body: the record.
            exchange: the exchange of the envelope it goes into.
            routing_key: the routing key of that envelope.

        Returns:
            A future that resolves when the broker confirms the envelope, or fails
            with the envelope's error.

        Raises:
            LocalProtocolError: the record is invalid; nothing was added.
            InvalidStateError: the batching publisher is closed.
        """
        if type(body) is not bytes:
            body = _record_bytes(body)
        future: concurrent.futures.Future[None] = ConfirmFuture()
        with self._lock:
            if self._closed:
                raise InvalidStateError("this batching publisher is closed")
            if self.publisher.is_closed:
                raise _publisher_gone(self._acc, cause=_ended_by(self._closed_state))
            acc = self._acc
            if acc.add((exchange, routing_key), body, future) and acc.open is not None:
                self._deadline = time.monotonic() + self.linger
                self._start_linger_thread()
                self._wake.notify()
            if acc.sealed:
                self._drain()
        return future

    def flush(self) -> None:
        """Send the open batch now."""
        with self._lock:
            self._acc.seal()
            self._drain()

    def wait_for_confirms(self, *, timeout: float | None = None) -> None:
        """Flush, then wait until the broker has settled everything sent so far.

        Args:
            timeout: seconds to wait (``None``: no limit); the publisher's
                ``wait_for_confirms`` raises :class:`PublishTimeout` past it.
        """
        self.flush()
        self.publisher.wait_for_confirms(timeout=timeout)

    def close(self) -> None:
        """Send the open batch, stop the linger thread, refuse new records.

        Record failures nobody looked at are reported by the publisher's ``close()``,
        as for :meth:`AsyncBatchingPublisher.close`.
        """
        with self._lock:
            if self._closed:
                return
            self._acc.seal()
            self._drain()
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        self._failures.close()

    def _drain(self) -> None:
        """Send sealed batches (the caller holds the lock)."""
        sealed = self._acc.sealed
        if self._acc.open is None:
            self._deadline = None
        while sealed:
            # The envelope stays first in line until it is handed over: an interrupt at
            # any point before that (Ctrl-C, ServiceStopped), which other threads'
            # records in it must survive, finds it still queued.
            batch = sealed[0]
            futures = batch.futures
            options = self._options
            try:
                body, props = options.message(batch)
                sent = self.publisher.publish(body, **options.publish_options(batch, props))
            except Exception as exc:
                sealed.popleft()
                if self.publisher.is_closed:
                    _fail_all(futures, exc, self._ledger)
                    _publisher_gone(self._acc, len(futures), exc)  # one ERROR for all
                    continue
                self._failures.log(
                    type(exc).__name__,
                    "batching publisher: an envelope of %d records was not sent: %r",
                    len(futures),
                    exc,
                )
                _fail_all(futures, exc, self._ledger)
                continue
            except BaseException:
                # Interrupted while the envelope waited for the publisher: the linger
                # thread sends it.
                self._deadline = time.monotonic()
                self._start_linger_thread()
                self._wake.notify()
                raise
            sealed.popleft()
            if len(futures) == 1:
                self._acc.stats.singles += 1
            else:
                self._acc.stats.envelopes += 1
            sent.add_done_callback(functools.partial(_settle_all, futures, self._ledger))

    def _start_linger_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._linger_loop, name="rabbitry-batch-linger", daemon=True
            )
            self._thread.start()

    def _linger_loop(self) -> None:
        with self._lock:
            while not self._closed:
                deadline = self._deadline
                if deadline is None:
                    self._wake.wait()
                    continue
                left = deadline - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                self._acc.seal()
                try:
                    self._drain()
                except Exception:  # pragma: no cover - _drain fails the futures itself
                    logger.exception("batching publisher: the linger flush failed")

"""The batching publishers' core without I/O: batches, envelopes, record outcomes.

Both :class:`~rabbitry.batching_publisher.AsyncBatchingPublisher` and its thread-safe
twin hold an :class:`Accumulator` (what to seal when), an :class:`EnvelopeOptions` (how a
sealed batch becomes one message) and an :class:`EnvelopeOutcomes` (what an envelope's
fate means for its records' futures); they add only the I/O and the linger clock.
"""

from __future__ import annotations

import copy
import functools
import logging
import struct
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from ._support.failure_log import RateLimitedLog
from .batching import envelope_headers
from .exceptions import ConfigurationError, InvalidStateError, LocalProtocolError
from .protocol import spec
from .publisher import as_properties

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import timedelta

    from .publishing.unobserved import UnobservedLedger

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "MAX_BATCH_BYTES",
    "Accumulator",
    "Batch",
    "BatchingStats",
    "EnvelopeOptions",
    "EnvelopeOutcomes",
    "check_options",
    "ended_by",
    "publisher_gone",
    "record_bytes",
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


def check_options(batch_records: object, batch_bytes: object, linger: object) -> None:
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


def record_bytes(body: object) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    raise LocalProtocolError(
        f"record: must be bytes, bytearray, memoryview or str, got {type(body).__name__}"
    )


def check_target(exchange: object, routing_key: object) -> tuple[str, str]:
    for field, value in (("exchange", exchange), ("routing_key", routing_key)):
        if not isinstance(value, str):
            raise LocalProtocolError(
                f"basic.publish.{field}: must be a str, got {type(value).__name__}"
            )
        if len(value) > 255 and len(value.encode("utf-8", "surrogateescape")) > 255:
            raise LocalProtocolError(f"basic.publish.{field}: shortstr longer than 255 bytes")
    return exchange, routing_key  # type: ignore[return-value]


class Batch:
    """An open or sealed batch: its target, records (each after its length field, ready
    to be joined into an envelope body) and their futures."""

    __slots__ = ("futures", "parts", "size", "target")

    def __init__(self, target: tuple[str, str]) -> None:
        self.target = target
        self.parts: list[bytes] = []
        self.futures: list[Any] = []
        self.size = 0


class Accumulator:
    """The batching rules without I/O: what to seal when, for both publishers."""

    def __init__(self, batch_records: int, batch_bytes: int) -> None:
        self.max_records = batch_records
        self.max_bytes = batch_bytes
        self.open: Batch | None = None
        self.sealed: deque[Batch] = deque()
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
            check_target(*target)
            batch = self.open = Batch(target)
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


class EnvelopeOptions:
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

    def message(self, batch: Batch) -> tuple[bytes, spec.BasicProperties]:
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

    def publish_options(self, batch: Batch, props: spec.BasicProperties) -> dict[str, Any]:
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


def settle_all(futures: list[Any], ledger: UnobservedLedger, outcome: Any) -> None:
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


def fail_all(
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


def envelope_failures() -> RateLimitedLog:
    """The ERROR log of envelopes the publisher refused, rate-limited with counts (by
    error type): a publisher failing every envelope logs a few lines a minute, not
    one per envelope."""
    return RateLimitedLog(logger, "batching publisher", "unsent envelopes")


def ended_by(closed_state: Callable[[], InvalidStateError]) -> BaseException | None:
    """What closed a publisher: its connection's end (``ConnectionClosed``,
    ``RecoveryFailed``...) when that closed it, ``None`` when its owner did; read from
    the error the publisher's own calls raise once it is closed."""
    return closed_state().__cause__


def publisher_gone(
    acc: Accumulator, failed: int = 0, cause: BaseException | None = None
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
        fail_all(futures, lost)
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


class EnvelopeOutcomes:
    """Settles the record futures of envelopes: counts what was sent, fails and logs
    what was not."""

    def __init__(self, acc: Accumulator, ledger: UnobservedLedger) -> None:
        self.acc = acc
        self.ledger = ledger
        self.failures = envelope_failures()

    def sent(self, futures: list[Any], sent: Any) -> None:
        """The publisher took the envelope of ``futures``; ``sent`` is its confirm future.

        Args:
            futures: the record futures of the envelope.
            sent: the publisher's future of the envelope, settled by the broker.
        """
        if len(futures) == 1:
            self.acc.stats.singles += 1
        else:
            self.acc.stats.envelopes += 1
        sent.add_done_callback(functools.partial(settle_all, futures, self.ledger))

    def refused(
        self,
        futures: list[Any],
        exc: BaseException,
        publisher_closed: bool,
        fail_with: BaseException | None = None,
    ) -> None:
        """The envelope of ``futures`` was not sent because of ``exc``: fail them.

        Args:
            futures: the record futures of the envelope.
            exc: what the publisher raised (logged, rate-limited).
            publisher_closed: the publisher is closed (then every record still held
                fails too, counted in one ERROR line, instead of the log).
            fail_with: the error the futures fail with (default: ``exc``).
        """
        if publisher_closed:
            fail_all(futures, exc, self.ledger)
            publisher_gone(self.acc, len(futures), exc)  # one ERROR for all of them
            return
        self.failures.log(
            type(exc).__name__,
            "batching publisher: an envelope of %d records was not sent: %r",
            len(futures),
            exc,
        )
        fail_all(futures, exc if fail_with is None else fail_with, self.ledger)

    def close(self) -> None:
        """Log the summary of unsent envelopes only counted so far, if any."""
        self.failures.close()

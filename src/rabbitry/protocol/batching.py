"""Batch envelopes, without I/O: the record codec and how records settle their envelope.

Several records in one AMQP message, in Spring AMQP's batch format; the format and
the rules of reading and settling are documented in :mod:`rabbitry.batching`, which
gives these names to applications.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from ..exceptions import BatchFormatError, InvalidStateError
from .message import Message
from .spec import BasicProperties

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Sequence

__all__ = [
    "BATCH_FORMAT_HEADER",
    "BATCH_SIZE_HEADER",
    "LENGTH_HEADER4",
    "MAX_RECORD_BYTES",
    "BatchRecord",
    "RecordLedger",
    "decode_records",
    "encode_records",
    "envelope_headers",
    "is_envelope",
    "iter_delivery",
    "unpack",
]

#: The header that marks a batch envelope and names its format (Spring AMQP's name).
BATCH_FORMAT_HEADER: Final = "springBatchFormat"
#: The one format rabbitry reads and writes: records each preceded by a 4-byte length.
LENGTH_HEADER4: Final = "lengthHeader4"
#: The header with the number of records (written by Spring AMQP and by rabbitry).
BATCH_SIZE_HEADER: Final = "amqp_batchSize"
#: A record's length must fit the 4-byte field (Spring reads it as a signed int).
MAX_RECORD_BYTES: Final = 2**31 - 1

_LENGTH = struct.Struct(">I")
_pack_length = _LENGTH.pack
_unpack_length = _LENGTH.unpack_from
_BATCH_HEADERS = (BATCH_FORMAT_HEADER, BATCH_SIZE_HEADER)


# --------------------------------------------------------------------------- codec


def encode_records(records: Sequence[bytes]) -> bytes:
    """The body of an envelope: each record preceded by its 4-byte big-endian length.

    Args:
        records: the records, bytes-like.

    Returns:
        The envelope's body.

    Raises:
        BatchFormatError: a record is not bytes-like or is longer than 2^31 - 1 bytes.
    """
    parts: list[bytes] = []
    append = parts.append
    for index, record in enumerate(records):
        if not isinstance(record, bytes | bytearray | memoryview):
            raise BatchFormatError(
                f"records[{index}]: must be bytes, bytearray or memoryview, "
                f"got {type(record).__name__}"
            )
        size = len(record) if not isinstance(record, memoryview) else record.nbytes
        if size > MAX_RECORD_BYTES:
            raise BatchFormatError(f"records[{index}]: {size} bytes, at most {MAX_RECORD_BYTES}")
        append(_pack_length(size))
        append(record)
    return b"".join(parts)


def decode_records(body: bytes | bytearray | memoryview, count: int | None = None) -> list[bytes]:
    """Split an envelope body (``lengthHeader4``) into its records.

    Args:
        body: the envelope's body.
        count: the record count announced by ``amqp_batchSize``, checked when given.

    Returns:
        The records, in order.

    Raises:
        BatchFormatError: the body ends inside a length field or a record, or holds a
            different number of records than ``count``.
    """
    view = memoryview(body)
    end = len(view)
    records: list[bytes] = []
    offset = 0
    while offset < end:
        if end - offset < 4:
            raise BatchFormatError(
                f"batch envelope truncated: {end - offset} bytes left at offset {offset}, "
                "less than a 4-byte record length"
            )
        (size,) = _unpack_length(view, offset)
        offset += 4
        if size > end - offset:
            raise BatchFormatError(
                f"batch envelope truncated: record {len(records)} announces {size} bytes at "
                f"offset {offset - 4}, {end - offset} remain"
            )
        records.append(bytes(view[offset : offset + size]))
        offset += size
    if count is not None and count != len(records):
        raise BatchFormatError(
            f"batch envelope holds {len(records)} records but its {BATCH_SIZE_HEADER} "
            f"header says {count}"
        )
    return records


def envelope_headers(headers: dict[str, Any] | None, count: int) -> dict[str, Any]:
    """The headers of an envelope of records.

    Args:
        headers: the records' headers (``None``: none).
        count: how many records the envelope holds.

    Returns:
        A copy of ``headers`` with the batch format and size headers added.
    """
    result = dict(headers) if headers else {}
    result[BATCH_FORMAT_HEADER] = LENGTH_HEADER4
    result[BATCH_SIZE_HEADER] = count
    return result


def is_envelope(message: Message) -> bool:
    """Whether ``message`` is a batch envelope.

    Args:
        message: a delivery.

    Returns:
        ``True`` if it carries a ``springBatchFormat`` header (of any value).
    """
    headers = message.properties.headers
    return headers is not None and BATCH_FORMAT_HEADER in headers


# --------------------------------------------------------------------------- records


class BatchRecord(Message):
    """One record of a batch envelope, handed out like a delivered message.

    ``body`` is the record; ``properties`` are the envelope's without the batch headers;
    ``delivery_tag``, ``redelivered``, ``exchange``, ``routing_key`` and
    ``consumer_tag`` are the envelope's. ``ack()``, ``nack()`` and ``reject()`` act on
    the envelope as described in the module documentation.

    Attributes:
        envelope: the envelope message as delivered.
        index: the record's position in the envelope (from 0).
        count: the number of records in the envelope.
    """

    __slots__ = ("count", "envelope", "index")

    envelope: Message
    index: int
    count: int


# Its home for applications (and for pickle) is rabbitry.batching.
BatchRecord.__module__ = "rabbitry.batching"


#: What a record's byte in :attr:`_EnvelopeSettler.state` says.
_OPEN: Final = 0
_ACKED: Final = 1
_REJECTED: Final = 2


class _EnvelopeSettler:
    """Settles an envelope for its records: acked once every record was acked.

    Each record acks through a :class:`_RecordAcker` that stands in for its channel
    (``Message.ack`` calls ``basic_ack`` on it), so a record acks, nacks and rejects like
    any message, from the same threads. A record rejected without requeue waits for the
    others: the envelope is then rejected (dead-lettered or dropped) once every record
    was settled, so no record is dropped that was never handed out.
    """

    __slots__ = (
        "before",
        "channel",
        "done",
        "envelope",
        "ledger",
        "multiple",
        "rejected",
        "remaining",
        "settle",
        "state",
    )

    def __init__(
        self,
        envelope: Message,
        count: int,
        settle: Callable[..., object],
        ledger: RecordLedger | None = None,
    ) -> None:
        self.envelope = envelope
        self.channel = envelope.channel
        self.remaining = count
        #: One byte a record: _OPEN, _ACKED or _REJECTED (without requeue).
        self.state = bytearray(count)
        #: Records rejected without requeue: the envelope is rejected when complete.
        self.rejected = 0
        self.settle = settle
        #: The iteration that handed the records out, in order (None: a handler's).
        self.ledger = ledger
        #: The newest plain delivery that iteration handed out before this envelope.
        self.before: Message | None = None if ledger is None else ledger.last_plain
        self.multiple = False
        #: The envelope was settled (acked, nacked or rejected).
        self.done = False

    @property
    def is_closed(self) -> bool:
        closed: bool = self.channel is None or self.channel.is_closed
        return closed

    @property
    def epoch(self) -> int:
        return int(getattr(self.channel, "epoch", 0))

    def _check(self) -> None:
        if self.done:
            raise InvalidStateError(
                f"the batch envelope (delivery {self.envelope.delivery_tag}) of this record "
                "was already settled by another of its records"
            )

    def _mark(self, index: int, multiple: bool, how: int) -> None:
        """Settle record ``index`` (with ``multiple``, every open one up to it) as ``how``."""
        state = self.state
        for i in range(index + 1) if multiple else (index,):
            if state[i] == _OPEN:
                state[i] = how
                self.remaining -= 1
                if how == _REJECTED:
                    self.rejected += 1
        if self.remaining == 0:
            self.finish()

    def finish(self) -> None:
        """Every record was settled: ack the envelope, or reject it (without requeue)
        when any record was."""
        self.done = True
        if self.rejected:
            self.settle("nack", multiple=False, requeue=False)
        else:
            self.settle("ack", multiple=self.multiple)

    def ack(self, index: int, multiple: bool) -> None:
        """Record ``index`` was acked; with ``multiple``, every record handed out before it
        too (those of earlier envelopes of the same iteration included)."""
        self._check()
        if multiple:
            if self.ledger is not None:
                self.ledger.settle_before(self, "ack")
            # The envelope's own ack then goes out as a multiple one too, so that plain
            # deliveries handed out between two envelopes are covered as well.
            self.multiple = True
        self._mark(index, multiple, _ACKED)

    def nack(self, index: int, multiple: bool, requeue: bool) -> None:
        """A record was nacked. With ``requeue`` the whole envelope goes back at once
        (and, with ``multiple``, every delivery of the channel before it, as the broker
        does); its records not handed out yet come again with it. Without, only the
        record (and, with ``multiple``, every open one handed out up to it) counts as
        rejected, and the envelope is rejected once its other records were settled."""
        self._check()
        if requeue:
            if multiple and self.ledger is not None:
                self.ledger.settle_before(self, None)  # the broker's multiple nack: them too
            self.done = True
            self.settle("nack", multiple=multiple, requeue=True)
            return
        if multiple and self.ledger is not None:
            self.ledger.settle_before(self, "reject")
        self._mark(index, multiple, _REJECTED)

    def reject(self, index: int, requeue: bool) -> None:
        """A record was rejected: :meth:`nack` without ``multiple``."""
        self._check()
        if requeue:
            self.done = True
            self.settle("reject", requeue=True)
            return
        self._mark(index, False, _REJECTED)


class _RecordAcker:
    """A record's stand-in for a channel: its settlements, told to its envelope's settler."""

    __slots__ = ("index", "settler")

    def __init__(self, settler: _EnvelopeSettler, index: int) -> None:
        self.settler = settler
        self.index = index

    @property
    def is_closed(self) -> bool:
        return self.settler.is_closed

    @property
    def epoch(self) -> int:
        return self.settler.epoch

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        self.settler.ack(self.index, multiple)

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        self.settler.nack(self.index, multiple, requeue)

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        self.settler.reject(self.index, requeue)


class RecordLedger:
    """The envelopes one iteration handed out, in order, until each is settled.

    It gives a record's ``ack(multiple=True)`` the meaning it has for a message: every
    record handed out up to it is acknowledged, those of earlier envelopes included.
    Those envelopes are then settled at once, by one ``multiple`` ack of the newest of
    them (which also covers plain deliveries handed out before it). A multiple nack
    marks them settled without sending anything: the broker's own multiple nack of
    the later envelope covers them.
    """

    __slots__ = ("_open", "_prune_at", "last_plain")

    def __init__(self) -> None:
        self._open: deque[_EnvelopeSettler] = deque()
        self._prune_at = 64
        #: The newest plain (not enveloped) delivery handed out; the iteration sets it.
        self.last_plain: Message | None = None

    def add(self, settler: _EnvelopeSettler) -> None:
        """Note an envelope whose records the iteration starts handing out.

        Args:
            settler: the envelope's settler.
        """
        pending = self._open
        while pending and pending[0].done:
            pending.popleft()
        if len(pending) >= self._prune_at:
            # An unsettled envelope at the front keeps settled ones behind it: drop
            # them, so a record that is never acked holds no more than itself.
            self._open = pending = deque(s for s in pending if not s.done)
            self._prune_at = max(64, 2 * len(pending))
        pending.append(settler)

    def settle_before(self, settler: _EnvelopeSettler, how: str | None) -> None:
        """Settle every envelope (and plain delivery) handed out before ``settler``.

        Args:
            settler: the envelope a record of which was settled with ``multiple``.
            how: ``"ack"`` to acknowledge them (one ``multiple`` ack of the newest;
                an envelope holding a record rejected without requeue is rejected on
                its own first), ``"reject"`` to reject them without requeue (one
                ``multiple`` nack), or ``None`` to only mark them settled: a multiple
                nack that covers them is about to go out.
        """
        pending = self._open
        newest: _EnvelopeSettler | None = None
        while pending and pending[0] is not settler:
            earlier = pending.popleft()
            if earlier.done:
                continue
            earlier.done = True
            if how == "ack" and earlier.rejected:
                # Not covered by the multiple ack below: its rejection goes out first.
                earlier.settle("nack", multiple=False, requeue=False)
            else:
                newest = earlier
        plain, settler.before = settler.before, None
        if plain is not None and plain.settled:
            plain = None
        if how is None:
            if plain is not None:
                plain.settled = True
            return
        if plain is not None and (
            newest is None or plain.delivery_tag > newest.envelope.delivery_tag
        ):
            # The later of the two: covers the other.
            if how == "ack":
                plain.ack(multiple=True)
            else:
                plain.nack(multiple=True, requeue=False)
        elif newest is not None:
            if how == "ack":
                newest.settle("ack", multiple=True)
            else:
                newest.settle("nack", multiple=True, requeue=False)
            if plain is not None:
                plain.settled = True


def _settle_on_channel(envelope: Message) -> Callable[..., object]:
    """Settle ``envelope`` through its own ``ack``/``nack``/``reject`` methods."""

    def settle(how: str, *, multiple: bool = False, requeue: bool = True) -> None:
        if how == "ack":
            envelope.ack(multiple)
        elif how == "nack":
            envelope.nack(multiple, requeue)
        else:
            envelope.reject(requeue)

    return settle


def unpack(
    envelope: Message,
    settle: Callable[..., object] | None = None,
    ledger: RecordLedger | None = None,
) -> list[BatchRecord]:
    """The records of ``envelope`` as :class:`BatchRecord` messages.

    Args:
        envelope: a message for which :func:`is_envelope` is true.
        settle: ``settle(how, *, multiple=False, requeue=True)`` with ``how`` one of
            ``"ack"``, ``"nack"``, ``"reject"``: how the records' acks reach the
            envelope (default: the envelope's own ``ack``/``nack``/``reject``).
        ledger: the iteration the records are handed out by, for ``ack(multiple=True)``
            to reach the records of its earlier envelopes (None: this envelope only).

    Returns:
        The records, in order.

    Raises:
        BatchFormatError: an unknown format, a malformed body, or a wrong count; its
            ``message`` is the envelope.
    """
    properties = envelope.properties
    headers = properties.headers or {}
    kind = headers.get(BATCH_FORMAT_HEADER)
    if isinstance(kind, bytes):
        kind = kind.decode("utf-8", "replace")
    if kind != LENGTH_HEADER4:
        raise BatchFormatError(
            f"message {envelope.delivery_tag}: {BATCH_FORMAT_HEADER}={kind!r} is not a batch "
            f"format rabbitry knows (only {LENGTH_HEADER4!r}); it was not split",
            envelope,
        )
    count = headers.get(BATCH_SIZE_HEADER)
    if isinstance(count, bool) or not isinstance(count, int):
        count = None
    try:
        bodies = decode_records(envelope.body, count)
    except BatchFormatError as exc:
        raise BatchFormatError(f"message {envelope.delivery_tag}: {exc}", envelope) from None
    shared = _record_properties(properties, headers)
    settler = _EnvelopeSettler(
        envelope,
        len(bodies),
        settle if settle is not None else _settle_on_channel(envelope),
        ledger,
    )
    records: list[BatchRecord] = []
    total = len(bodies)
    for index, body in enumerate(bodies):
        record = BatchRecord(
            body,
            shared,
            delivery_tag=envelope.delivery_tag,
            redelivered=envelope.redelivered,
            exchange=envelope.exchange,
            routing_key=envelope.routing_key,
            consumer_tag=envelope.consumer_tag,
        )
        record.settle_through(_RecordAcker(settler, index))
        record.epoch = envelope.epoch
        record.envelope = envelope
        record.index = index
        record.count = total
        records.append(record)
    if not records:
        # An empty envelope has nothing to hand out: settle it as handled.
        settler.done = True
        settler.settle("ack", multiple=False)
    elif ledger is not None:
        ledger.add(settler)
    return records


def _record_properties(properties: BasicProperties, headers: dict[str, Any]) -> BasicProperties:
    values = {name: getattr(properties, name) for name in BasicProperties.FIELDS}
    rest = {k: v for k, v in headers.items() if k not in _BATCH_HEADERS}
    values["headers"] = rest or None
    return BasicProperties(**values)


def settler_of(record: Message) -> _EnvelopeSettler | None:
    """The envelope settler behind a :class:`BatchRecord` (unwrapping a thread proxy).

    Args:
        record: a message handed out by a consume iteration or a consumer.

    Returns:
        The settler of the record's envelope, or ``None`` when ``record`` is not a
        record of an envelope.
    """
    channel = getattr(record, "channel", None)
    inner = getattr(channel, "target", channel)  # a handler thread's acker wraps it
    return inner.settler if isinstance(inner, _RecordAcker) else None


def _no_settle(how: str, **options: object) -> None:
    return None


def iter_delivery(
    message: Message, no_ack: bool = False, ledger: RecordLedger | None = None
) -> Generator[Message, None, None]:
    """What an iterator hands out for one delivery: the message itself, or its records.

    Args:
        message: the delivery.
        no_ack: the broker settled the envelope already (the records' acks do
            nothing).
        ledger: the iteration's :class:`RecordLedger` (one per iteration), so that a
            record's ``ack(multiple=True)`` covers every record handed out before it.

    Yields:
        ``message`` itself, or each of its records (stopping early when one of them
        settled the envelope).
    """
    if not is_envelope(message):
        if ledger is not None:
            ledger.last_plain = message
        yield message
        return
    records = unpack(message, _no_settle if no_ack else None, None if no_ack else ledger)
    settler = settler_of(records[0]) if records else None
    handed = 0
    try:
        for record in records:
            if settler is not None and settler.done:
                return
            handed += 1
            yield record
    finally:
        if settler is not None and not settler.done and handed < len(records):
            # The iteration ended inside the envelope: nobody can ack the records not
            # handed out, so the whole envelope goes back to the queue now (the records
            # handed out come again, flagged redelivered), not when the channel closes.
            settler.done = True
            if not no_ack and not settler.is_closed:
                settler.settle("nack", requeue=True)

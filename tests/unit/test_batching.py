"""The batch envelope format (Spring AMQP's ``lengthHeader4``) without a broker: bytes
built by hand from the format's description, our encoder read back the same way, the
envelope settling rules and the batching publishers' options."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from rabbitry import (
    BatchFormatError,
    ConfigurationError,
    InvalidStateError,
    Message,
    Properties,
    Reject,
)
from rabbitry._batch_envelopes import Accumulator
from rabbitry.batching import (
    BATCH_FORMAT_HEADER,
    BATCH_SIZE_HEADER,
    LENGTH_HEADER4,
    BatchRecord,
    RecordLedger,
    decode_records,
    encode_records,
    envelope_headers,
    is_envelope,
    iter_delivery,
    unpack,
)
from rabbitry.batching_publisher import MAX_BATCH_BYTES
from rabbitry.protocol.spec import BasicProperties


def _by_hand(*records: bytes) -> bytes:
    """The format as documented: each record after its 4-byte big-endian length."""
    return b"".join(struct.pack(">I", len(r)) + r for r in records)


def _split_by_hand(body: bytes) -> list[bytes]:
    out, offset = [], 0
    while offset < len(body):
        (size,) = struct.unpack_from(">I", body, offset)
        out.append(body[offset + 4 : offset + 4 + size])
        offset += 4 + size
    assert offset == len(body)
    return out


class _Channel:
    """Records what was sent to it, like a channel's ack methods."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.is_closed = False
        self.epoch = 0

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        self.calls.append(("ack", delivery_tag, multiple))

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        self.calls.append(("nack", delivery_tag, multiple, requeue))

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        self.calls.append(("reject", delivery_tag, requeue))


def _envelope(
    body: bytes, headers: dict[str, Any] | None, tag: int = 7
) -> tuple[Message, _Channel]:
    message = Message(
        body,
        BasicProperties(headers=headers, content_type="text/plain", delivery_mode=2),
        delivery_tag=tag,
        exchange="x",
        routing_key="k",
    )
    channel = _Channel()
    message.settle_through(channel)
    return message, channel


def test_encoder_writes_the_documented_layout() -> None:
    records = [b"a", b"", b"\x00\xff" * 300, "é".encode()]
    body = encode_records(records)
    assert body == _by_hand(*records)
    assert _split_by_hand(body) == records
    assert encode_records([bytearray(b"xy"), memoryview(b"z")]) == _by_hand(b"xy", b"z")


def test_decoder_reads_hand_built_bytes() -> None:
    records = [b"one", b"", b"three" * 100]
    assert decode_records(_by_hand(*records)) == records
    assert decode_records(b"") == []
    assert decode_records(_by_hand(*records), count=3) == records


@pytest.mark.parametrize(
    ("body", "count", "rule"),
    [
        (b"\x00\x00\x00", None, "less than a 4-byte record length"),
        (struct.pack(">I", 5) + b"abc", None, "announces 5 bytes"),
        (_by_hand(b"a") + b"\x00", None, "less than a 4-byte"),
        (_by_hand(b"a", b"b"), 3, "header says 3"),
    ],
)
def test_decoder_refuses_malformed_bodies(body: bytes, count: int | None, rule: str) -> None:
    with pytest.raises(BatchFormatError, match=rule):
        decode_records(body, count)


def test_batch_format_error_is_a_reject_and_a_value_error() -> None:
    assert issubclass(BatchFormatError, Reject) and issubclass(BatchFormatError, ValueError)


def test_envelope_headers_keep_the_records_headers() -> None:
    assert envelope_headers({"tenant": "a"}, 3) == {
        "tenant": "a",
        BATCH_FORMAT_HEADER: LENGTH_HEADER4,
        BATCH_SIZE_HEADER: 3,
    }
    assert (BATCH_FORMAT_HEADER, LENGTH_HEADER4, BATCH_SIZE_HEADER) == (
        "springBatchFormat",
        "lengthHeader4",
        "amqp_batchSize",
    )


def test_unpack_gives_records_with_the_envelope_properties() -> None:
    envelope, _ = _envelope(
        _by_hand(b"r0", b"r1"),
        {BATCH_FORMAT_HEADER: LENGTH_HEADER4, BATCH_SIZE_HEADER: 2, "tenant": "a"},
    )
    assert is_envelope(envelope)
    records = unpack(envelope)
    assert [r.body for r in records] == [b"r0", b"r1"]
    assert all(isinstance(r, BatchRecord) and isinstance(r, Message) for r in records)
    first = records[0]
    assert first.properties.headers == {"tenant": "a"}
    assert (first.properties.content_type, first.properties.delivery_mode) == ("text/plain", 2)
    assert (first.delivery_tag, first.exchange, first.routing_key) == (7, "x", "k")
    assert (first.index, first.count, first.envelope) == (0, 2, envelope)
    # Spring's header alone (no count) is enough.
    only_format, _ = _envelope(_by_hand(b"a"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4})
    assert [r.body for r in unpack(only_format)] == [b"a"]


@pytest.mark.parametrize("kind", ["lengthHeader2", "", 4, b"other"])
def test_unknown_format_is_refused_naming_it(kind: object) -> None:
    envelope, channel = _envelope(_by_hand(b"a"), {BATCH_FORMAT_HEADER: kind})
    with pytest.raises(BatchFormatError, match="not a batch format rabbitry knows") as caught:
        unpack(envelope)
    assert caught.value.message is envelope
    assert channel.calls == []


def test_plain_message_passes_through_unchanged() -> None:
    plain, _ = _envelope(_by_hand(b"a"), {"other": 1})
    assert not is_envelope(plain)
    assert list(iter_delivery(plain)) == [plain]


def test_envelope_is_acked_once_every_record_is() -> None:
    envelope, channel = _envelope(_by_hand(b"a", b"b", b"c"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4})
    records = list(iter_delivery(envelope))
    records[0].ack()
    records[2].ack()
    assert channel.calls == []
    records[1].ack()
    assert channel.calls == [("ack", 7, False)]
    assert envelope.settled
    with pytest.raises(InvalidStateError):
        records[1].ack()


def test_a_multiple_ack_on_a_record_goes_out_with_the_envelope_ack() -> None:
    envelope, channel = _envelope(_by_hand(b"a", b"b"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4})
    first, second = iter_delivery(envelope)
    first.ack(multiple=True)
    second.ack()
    assert channel.calls == [("ack", 7, True)]


def test_a_record_rejected_without_requeue_waits_for_the_other_records() -> None:
    envelope, channel = _envelope(_by_hand(b"a", b"b", b"c"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4})
    handed = []
    for record in iter_delivery(envelope):
        handed.append(record.body)
        if record.body == b"b":
            record.reject(requeue=False)
            assert channel.calls == []  # the records after it are still to be handed out
        else:
            record.ack()
    assert handed == [b"a", b"b", b"c"]
    assert channel.calls == [("nack", 7, False, False)]  # once every record was settled
    envelope2, channel2 = _envelope(_by_hand(b"a", b"b"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4})
    first, second = iter_delivery(envelope2)
    second.nack(requeue=False)
    first.nack(requeue=False)
    assert channel2.calls == [("nack", 7, False, False)]


def test_a_record_requeued_returns_the_envelope_at_once_and_skips_the_rest() -> None:
    envelope, channel = _envelope(_by_hand(b"a", b"b", b"c"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4})
    handed = []
    for record in iter_delivery(envelope):
        handed.append(record.body)
        record.nack(requeue=True)
    assert handed == [b"a"]  # b and c come again with the envelope
    assert channel.calls == [("nack", 7, False, True)]
    envelope2, channel2 = _envelope(_by_hand(b"a", b"b"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4})
    records = iter_delivery(envelope2)
    next(records).reject()
    assert channel2.calls == [("reject", 7, True)]


def test_a_multiple_ack_rejects_an_earlier_envelope_holding_a_rejected_record_first() -> None:
    """Envelope 7 has a rejected record and an open one; a record of envelope 8 is acked
    with ``multiple``: envelope 7 is rejected on its own, before the multiple ack that
    covers everything else (a multiple ack of 7 would have acked the rejected record)."""
    ledger = RecordLedger()
    channel = _Channel()
    first, _ = _envelope(_by_hand(b"a", b"b"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4}, tag=6)
    second, _ = _envelope(_by_hand(b"c", b"d"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4}, tag=7)
    third, _ = _envelope(_by_hand(b"e", b"f"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4}, tag=8)
    for message in (first, second, third):
        message.settle_through(channel)
    a, _b = iter_delivery(first, ledger=ledger)
    c, _d = iter_delivery(second, ledger=ledger)
    e, _f = iter_delivery(third, ledger=ledger)
    c.reject(requeue=False)
    e.ack(multiple=True)
    assert channel.calls == [("nack", 7, False, False), ("ack", 6, True)]
    with pytest.raises(InvalidStateError):
        a.ack()  # settled by the multiple ack


def test_a_multiple_nack_without_requeue_rejects_earlier_envelopes_at_once() -> None:
    ledger = RecordLedger()
    channel = _Channel()
    first, _ = _envelope(_by_hand(b"a", b"b"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4}, tag=6)
    second, _ = _envelope(_by_hand(b"c", b"d"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4}, tag=7)
    for message in (first, second):
        message.settle_through(channel)
    list(iter_delivery(first, ledger=ledger))
    records = iter_delivery(second, ledger=ledger)
    next(records).nack(multiple=True, requeue=False)
    assert channel.calls == [("nack", 6, True, False)]
    next(records).ack()  # still handed out; its envelope goes once it is settled
    assert channel.calls == [("nack", 6, True, False), ("nack", 7, False, False)]


def test_an_iteration_ended_inside_an_envelope_requeues_it() -> None:
    envelope, channel = _envelope(_by_hand(b"a", b"b", b"c"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4})
    records = iter_delivery(envelope)
    next(records).ack()
    records.close()  # ``break`` after the first record
    assert channel.calls == [("nack", 7, False, True)]
    # Ended after its last record was handed out: the caller can still settle them all.
    envelope, channel = _envelope(_by_hand(b"a", b"b"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4})
    records = iter_delivery(envelope)
    held = [next(records), next(records)]
    records.close()
    assert channel.calls == []
    for record in held:
        record.ack()
    assert channel.calls == [("ack", 7, False)]


def test_no_ack_records_settle_nothing() -> None:
    envelope, channel = _envelope(_by_hand(b"a", b"b"), {BATCH_FORMAT_HEADER: LENGTH_HEADER4})
    for record in iter_delivery(envelope, no_ack=True):
        record.ack()
    assert channel.calls == []


def test_accumulator_seals_on_count_bytes_and_target() -> None:
    acc = Accumulator(batch_records=3, batch_bytes=4 * 4 + 12)  # 4 records of 3 bytes
    target = ("", "q")
    for i in range(3):
        acc.add(target, b"%03d" % i, i)
    assert len(acc.sealed) == 1 and acc.open is None  # three records: full by count
    assert _split_by_hand(b"".join(acc.sealed[0].parts)) == [b"000", b"001", b"002"]
    acc = Accumulator(batch_records=100, batch_bytes=20)
    acc.add(target, b"0123456789", 0)  # 14 bytes
    acc.add(target, b"0123456789", 1)  # would be 28 > 20: the first batch is sealed
    assert [len(b.futures) for b in acc.sealed] == [1]
    assert acc.open is not None and acc.open.futures == [1]
    acc.add(("", "other"), b"x", 2)  # another routing key: sealed again
    assert [b.futures for b in acc.sealed] == [[0], [1]]
    acc.add(("", "other"), b"y" * 50, 3)  # larger than batch_bytes alone: sent alone
    assert [b.futures for b in acc.sealed][-2:] == [[2], [3]]
    assert all(b.size <= 20 for b in acc.sealed if len(b.futures) > 1)
    # What an envelope body will be: the documented layout.
    assert b"".join(acc.sealed[0].parts) == _by_hand(b"0123456789")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"batch_records": 0}, "batch_records"),
        ({"batch_records": True}, "batch_records"),
        ({"batch_bytes": MAX_BATCH_BYTES + 1}, "batch_bytes"),
        ({"batch_bytes": 4}, "batch_bytes"),
        ({"linger": -1}, "linger"),
        ({"linger": "1"}, "linger"),
        # One fixed id on every envelope: a deduplicating consumer would drop all but one.
        ({"properties": Properties(message_id="fixed")}, "properties.message_id"),
    ],
)
def test_batching_publisher_options_are_checked(options: dict[str, Any], field: str) -> None:
    from rabbitry.batching_publisher import AsyncBatchingPublisher, BatchingPublisher

    for cls in (AsyncBatchingPublisher, BatchingPublisher):
        with pytest.raises(ConfigurationError, match=f"^{field}:"):
            cls(object(), **options)  # type: ignore[arg-type]

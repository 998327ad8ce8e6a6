"""Batch envelopes delivered through the sans-IO channel: the records a consume
iteration hands out (rabbitry.protocol.batching.iter_delivery) settle their envelope on
the channel with the envelope's tag, once, as the scripted broker sees it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from broker_peer import BrokerPeer, Pair

from rabbitry.exceptions import InvalidStateError
from rabbitry.protocol import spec
from rabbitry.protocol.batching import (
    BATCH_FORMAT_HEADER,
    LENGTH_HEADER4,
    RecordLedger,
    encode_records,
    envelope_headers,
    iter_delivery,
)
from rabbitry.protocol.events import Delivery
from rabbitry.protocol.tags import DeliveryTags

if TYPE_CHECKING:
    from rabbitry.protocol.channel import ChannelProtocol
    from rabbitry.protocol.message import Message


class Engine:
    """The engine's part of settling: ask DeliveryTags for the wire tag, then send."""

    def __init__(self) -> None:
        self.pair = Pair()
        self.pair.handshake()
        self.channel: ChannelProtocol = self.pair.open_channel()
        self.tags = DeliveryTags()
        self.is_closed = False

    @property
    def epoch(self) -> int:
        return self.tags.epoch

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        wire = self.tags.wire_tag(delivery_tag)
        if wire is not None:
            self.channel.send_ack(wire, multiple)

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        wire = self.tags.wire_tag(delivery_tag)
        if wire is not None:
            self.channel.send_nack(wire, multiple, requeue)

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        wire = self.tags.wire_tag(delivery_tag)
        if wire is not None:
            self.channel.send_reject(wire, requeue)

    def deliver(self, wire_tag: int, body: bytes, headers: dict[str, object] | None) -> Message:
        method = spec.BasicDeliver(
            consumer_tag="c", delivery_tag=wire_tag, redelivered=False, exchange="", routing_key="q"
        )
        properties = spec.BasicProperties(headers=headers)
        events = self.pair.broker_to_client(BrokerPeer.send_content(1, method, body, properties))
        assert len(events) == 1 and isinstance(events[0], Delivery)
        message = events[0].message
        self.tags.stamp(message, self)
        return message


def envelope(engine: Engine, wire_tag: int, *records: bytes) -> Message:
    headers = envelope_headers(None, len(records))
    assert headers[BATCH_FORMAT_HEADER] == LENGTH_HEADER4
    return engine.deliver(wire_tag, encode_records(records), headers)


def test_every_record_acked_acks_the_envelope_once() -> None:
    engine = Engine()
    handed = list(iter_delivery(envelope(engine, 1, b"a", b"b", b"c"), ledger=RecordLedger()))
    assert [r.body for r in handed] == [b"a", b"b", b"c"]
    for record in handed[:2]:
        record.ack()
    engine.pair.assert_nothing_sent()
    handed[2].ack()
    assert engine.pair.client_to_broker() == [(1, spec.BasicAck(delivery_tag=1, multiple=False))]


def test_a_plain_delivery_is_handed_out_as_is() -> None:
    engine = Engine()
    message = engine.deliver(1, b"plain", None)
    assert list(iter_delivery(message, ledger=RecordLedger())) == [message]
    message.ack()
    assert engine.pair.client_to_broker() == [(1, spec.BasicAck(delivery_tag=1, multiple=False))]


def test_an_iteration_left_inside_an_envelope_requeues_it_at_once() -> None:
    engine = Engine()
    records = iter_delivery(envelope(engine, 1, b"a", b"b"), ledger=RecordLedger())
    first = next(records)
    records.close()
    assert engine.pair.client_to_broker() == [
        (1, spec.BasicNack(delivery_tag=1, multiple=False, requeue=True))
    ]
    with pytest.raises(InvalidStateError, match="already settled"):
        first.ack()  # the envelope went back already
    engine.pair.assert_nothing_sent()


def test_a_record_of_an_envelope_from_before_a_recovery_is_not_sent() -> None:
    engine = Engine()
    handed = list(iter_delivery(envelope(engine, 1, b"a"), ledger=RecordLedger()))
    engine.tags.new_epoch()  # the connection died; the broker redelivers the envelope
    assert handed[0].epoch == 0 and engine.epoch == 1
    handed[0].ack()
    engine.pair.assert_nothing_sent()
    assert engine.tags.stale == 1

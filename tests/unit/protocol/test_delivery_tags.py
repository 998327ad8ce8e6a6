"""Settling deliveries across recoveries, without I/O: DeliveryTags (the numbering of a
channel's deliveries across connections, and which settlements are stale) driving
ChannelProtocol.send_ack / send_nack / send_reject (the ack floor), against a scripted
broker."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from broker_peer import BrokerPeer, Pair

from rabbitry.exceptions import LocalProtocolError
from rabbitry.protocol import spec
from rabbitry.protocol.events import Delivery, RpcReply
from rabbitry.protocol.tags import DeliveryTags

if TYPE_CHECKING:
    from rabbitry.protocol.channel import ChannelProtocol
    from rabbitry.protocol.message import Message


def connect() -> tuple[Pair, ChannelProtocol]:
    pair = Pair()
    pair.handshake()
    return pair, pair.open_channel()


class Target:
    """Stands for the engine's channel: records the settlements a message sends it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def basic_ack(self, delivery_tag: int = 0, multiple: bool = False) -> None:
        self.calls.append(("ack", delivery_tag))

    def basic_nack(
        self, delivery_tag: int = 0, multiple: bool = False, requeue: bool = True
    ) -> None:
        self.calls.append(("nack", delivery_tag))

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        self.calls.append(("reject", delivery_tag))


TARGET = Target()


def deliver(pair: Pair, channel: int, wire_tag: int, tags: DeliveryTags) -> Message:
    """The broker delivers one message; the engine stamps it."""
    method = spec.BasicDeliver(
        consumer_tag="c", delivery_tag=wire_tag, redelivered=False, exchange="", routing_key="q"
    )
    events = pair.broker_to_client(BrokerPeer.send_content(channel, method, b"x"))
    assert len(events) == 1 and isinstance(events[0], Delivery)
    message = events[0].message
    tags.stamp(message, TARGET)
    return message


def ack(channel: ChannelProtocol, tags: DeliveryTags, tag: int, multiple: bool = False) -> bool:
    """What the engine does for basic_ack: ask for the wire tag, send what it says."""
    wire = tags.wire_tag(tag)
    if wire is None:
        return False
    channel.send_ack(wire, multiple)
    return True


def test_before_any_recovery_tags_are_the_brokers() -> None:
    pair, channel = connect()
    tags = DeliveryTags()
    messages = [deliver(pair, 1, n, tags) for n in (1, 2, 3)]
    assert [(m.delivery_tag, m.epoch) for m in messages] == [(1, 0), (2, 0), (3, 0)]
    assert ack(channel, tags, 2)
    assert pair.client_to_broker() == [(1, spec.BasicAck(delivery_tag=2, multiple=False))]
    assert tags.stale == 0


def test_after_a_recovery_tags_keep_growing_and_old_ones_are_stale() -> None:
    pair, old = connect()
    tags = DeliveryTags()
    for n in (1, 2, 3):
        deliver(pair, 1, n, tags)
    tags.new_epoch()  # the connection died
    assert tags.wire_tag(3, connected=False) is None  # while recovering: everything
    pair2, fresh = connect()
    message = deliver(pair2, 1, 1, tags)
    assert (message.delivery_tag, message.epoch) == (4, 1)
    for stale in (1, 3):
        assert not ack(fresh, tags, stale)
    assert tags.stale == 3
    pair2.assert_nothing_sent()
    assert ack(fresh, tags, 4)
    assert pair2.client_to_broker() == [(1, spec.BasicAck(delivery_tag=1, multiple=False))]
    del old, pair


def test_multiple_with_tag_zero_means_the_current_connection_only() -> None:
    pair, _ = connect()
    tags = DeliveryTags()
    deliver(pair, 1, 1, tags)
    tags.new_epoch()
    pair2, fresh = connect()
    deliver(pair2, 1, 1, tags)
    assert tags.wire_tag(0) == 0
    assert ack(fresh, tags, 0, multiple=True)
    assert pair2.client_to_broker() == [(1, spec.BasicAck(delivery_tag=0, multiple=True))]


def test_a_fetched_message_is_numbered_like_a_delivery() -> None:
    pair, channel = connect()
    tags = DeliveryTags()
    deliver(pair, 1, 1, tags)
    tags.new_epoch()
    pair2, fresh = connect()
    fresh.send_method(spec.BasicGet(queue="q"))
    pair2.assert_sent(spec.BasicGet, channel=1)
    method = spec.BasicGetOk(
        delivery_tag=1, redelivered=False, exchange="", routing_key="q", message_count=0
    )
    events = pair2.broker_to_client(BrokerPeer.send_content(1, method, b"y"))
    assert len(events) == 1 and isinstance(events[0], RpcReply)
    message = events[0].message
    assert message is not None
    tags.stamp(message, TARGET)
    assert (message.delivery_tag, message.epoch, tags.highest) == (2, 1, 2)
    del channel


def test_a_stamped_message_settles_through_its_channel_with_the_tag_handed_out() -> None:
    pair, _ = connect()
    tags = DeliveryTags()
    tags.new_epoch()
    tags.highest = tags.offset = 10
    target = Target()
    method = spec.BasicDeliver(
        consumer_tag="c", delivery_tag=3, redelivered=False, exchange="", routing_key="q"
    )
    events = pair.broker_to_client(BrokerPeer.send_content(1, method, b"x"))
    assert isinstance(events[0], Delivery)
    message = events[0].message
    assert message.channel is None
    tags.stamp(message, target)
    assert message.channel is target
    message.nack()
    assert target.calls == [("nack", 13)]


def test_a_nack_or_reject_moves_the_ack_floor_like_an_ack() -> None:
    pair, channel = connect()
    channel.send_nack(1, requeue=False)
    channel.send_ack(2)  # right above the floor the nack raised: merges on
    channel.send_ack(3)
    channel.send_reject(5)
    channel.send_ack(4)  # fills the gap below the reject: the floor is now 5
    channel.send_ack(6)  # so this one extends the ack of 4 (5 is settled already)
    assert pair.client_to_broker() == [
        (1, spec.BasicNack(delivery_tag=1, multiple=False, requeue=False)),
        (1, spec.BasicAck(delivery_tag=3, multiple=True)),
        (1, spec.BasicReject(delivery_tag=5, requeue=True)),
        (1, spec.BasicAck(delivery_tag=6, multiple=True)),
    ]


def test_a_multiple_nack_settles_everything_below_it() -> None:
    pair, channel = connect()
    channel.send_nack(4, multiple=True)
    channel.send_ack(5)
    channel.send_ack(6)
    assert pair.client_to_broker() == [
        (1, spec.BasicNack(delivery_tag=4, multiple=True, requeue=True)),
        (1, spec.BasicAck(delivery_tag=6, multiple=True)),
    ]


def test_a_settlement_below_the_floor_is_sent_as_given_and_moves_nothing() -> None:
    pair, channel = connect()
    channel.send_ack(3, multiple=True)
    channel.send_reject(2)
    channel.send_ack(4)
    channel.send_ack(5)
    assert pair.client_to_broker() == [
        (1, spec.BasicAck(delivery_tag=3, multiple=True)),
        (1, spec.BasicReject(delivery_tag=2, requeue=True)),
        (1, spec.BasicAck(delivery_tag=5, multiple=True)),
    ]


@pytest.mark.parametrize("tag", [-1, 2**64])
def test_an_invalid_tag_is_refused_and_the_floor_stays(tag: int) -> None:
    pair, channel = connect()
    with pytest.raises(LocalProtocolError):
        channel.send_nack(tag)
    with pytest.raises(LocalProtocolError):
        channel.send_reject(tag)
    channel.send_ack(1)
    channel.send_ack(2)
    assert pair.client_to_broker() == [(1, spec.BasicAck(delivery_tag=2, multiple=True))]

"""ChannelProtocol.send_publish with a waiter: the frames are queued and, in confirm
mode, the waiter is registered under the publish's sequence number in one call; the
broker's confirms then settle exactly the waiters they name."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from broker_peer import Pair

from rabbitry.exceptions import InvalidStateError
from rabbitry.protocol import spec
from rabbitry.protocol.events import PublishConfirmed
from rabbitry.protocol.publish import ConfirmTracker

if TYPE_CHECKING:
    from rabbitry.protocol.channel import ChannelProtocol


def confirming() -> tuple[Pair, ChannelProtocol, ConfirmTracker[str], list[tuple[str, int, bool]]]:
    pair = Pair()
    pair.handshake()
    channel = pair.open_channel()
    settled: list[tuple[str, int, bool]] = []
    confirms: ConfirmTracker[str] = ConfirmTracker(
        lambda waiter, tag, ack: settled.append((waiter, tag, ack))
    )
    channel.use_confirms(confirms)
    channel.send_method(spec.ConfirmSelect())
    pair.assert_sent(spec.ConfirmSelect, channel=1)
    pair.broker_method(1, spec.ConfirmSelectOk())
    return pair, channel, confirms, settled


def publish(channel: ChannelProtocol, waiter: str | None, body: bytes = b"x") -> int:
    return channel.send_publish(channel.encode_publish("", "q", body), waiter)


def apply(confirms: ConfirmTracker[str], events: list[object]) -> None:
    for event in events:
        assert isinstance(event, PublishConfirmed)
        confirms.confirm(event.delivery_tag, event.multiple, event.ack)


def test_each_publish_is_sent_and_registered_under_its_sequence_number() -> None:
    pair, channel, confirms, settled = confirming()
    assert [publish(channel, f"w{n}") for n in range(1, 4)] == [1, 2, 3]
    assert list(confirms) == [(1, "w1"), (2, "w2"), (3, "w3")]
    pair.flush()
    assert [c.body for c in pair.broker.contents] == [b"x", b"x", b"x"]
    apply(confirms, pair.broker_method(1, spec.BasicAck(delivery_tag=2, multiple=True)))
    apply(confirms, pair.broker_method(1, spec.BasicNack(delivery_tag=3)))
    assert settled == [("w1", 2, True), ("w2", 2, True), ("w3", 3, False)]
    assert not confirms


def test_a_publish_without_a_waiter_is_numbered_but_not_registered() -> None:
    _, channel, confirms, _ = confirming()
    assert publish(channel, None) == 1
    assert publish(channel, "w2") == 2
    assert list(confirms) == [(2, "w2")]


def test_outside_confirm_mode_nothing_is_registered() -> None:
    pair = Pair()
    pair.handshake()
    channel = pair.open_channel()
    confirms: ConfirmTracker[str] = ConfirmTracker(lambda *_: None)
    channel.use_confirms(confirms)
    assert publish(channel, "w") == 0
    assert not confirms
    pair.assert_sent(spec.BasicPublish, channel=1)


def test_a_publish_queued_behind_confirm_select_is_registered_in_order() -> None:
    pair = Pair()
    pair.handshake()
    channel = pair.open_channel()
    confirms: ConfirmTracker[str] = ConfirmTracker(lambda *_: None)
    channel.use_confirms(confirms)
    channel.send_method(spec.ConfirmSelect())
    assert publish(channel, "w1") == 1  # waits behind the select, numbered already
    assert list(confirms) == [(1, "w1")]
    pair.assert_sent(spec.ConfirmSelect, channel=1)
    pair.assert_nothing_sent()
    pair.broker_method(1, spec.ConfirmSelectOk())
    pair.assert_sent(spec.BasicPublish, channel=1)


def test_a_closed_channel_refuses_and_registers_nothing() -> None:
    pair, channel, confirms, _ = confirming()
    channel.close()
    pair.assert_sent(spec.ChannelClose, channel=1)
    with pytest.raises(InvalidStateError):
        publish(channel, "w1")
    assert not confirms
    assert channel.next_publish_seq == 1
    pair.assert_nothing_sent()


def test_a_waiter_without_a_confirm_table_is_refused_before_anything_is_queued() -> None:
    pair = Pair()
    pair.handshake()
    channel = pair.open_channel()
    channel.send_method(spec.ConfirmSelect())
    pair.assert_sent(spec.ConfirmSelect, channel=1)
    pair.broker_method(1, spec.ConfirmSelectOk())
    with pytest.raises(InvalidStateError, match="confirm table"):
        publish(channel, "w1")
    pair.assert_nothing_sent()
    assert channel.next_publish_seq == 1


def test_a_new_protocol_object_registers_in_the_table_it_is_given() -> None:
    # Recovery: the engine's table outlives the protocol object; the new channel
    # numbers from 1 again into the same (emptied) table.
    pair, channel, confirms, settled = confirming()
    publish(channel, "old")
    pair.assert_sent(spec.BasicPublish, channel=1)
    assert confirms.take_all() == {1: "old"}
    fresh = pair.open_channel()
    fresh.use_confirms(confirms)
    fresh.send_method(spec.ConfirmSelect())
    pair.client_to_broker()
    pair.broker_method(fresh.channel_id, spec.ConfirmSelectOk())
    assert publish(fresh, "new") == 1
    apply(confirms, pair.broker_method(fresh.channel_id, spec.BasicAck(delivery_tag=1)))
    assert settled == [("new", 1, True)]

"""Ack coalescing in ChannelProtocol.send_ack: contiguous single acks queued before one
flush leave as one ``multiple`` ack, and only when that settles exactly the same
deliveries as the separate acks would have."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from broker_peer import Pair

from rabbitry.exceptions import InvalidStateError, LocalProtocolError
from rabbitry.protocol import spec
from rabbitry.protocol.frames import ack_frame, method_frame

if TYPE_CHECKING:
    from rabbitry.protocol.channel import ChannelProtocol


def setup() -> tuple[Pair, ChannelProtocol]:
    pair = Pair()
    pair.handshake()
    return pair, pair.open_channel()


def ack(tag: int, multiple: bool = False) -> tuple[int, spec.BasicAck]:
    return (1, spec.BasicAck(delivery_tag=tag, multiple=multiple))


def test_ack_frame_matches_the_generic_encoder() -> None:
    for tag, multiple in ((1, False), (2**64 - 1, True), (0, True)):
        expected = method_frame(7, spec.BasicAck(delivery_tag=tag, multiple=multiple))
        assert ack_frame(7, tag, multiple) == expected


@pytest.mark.parametrize("tag", [-1, 2**64, "1", None])
def test_invalid_tag_is_refused_and_nothing_queued(tag: object) -> None:
    pair, ch = setup()
    with pytest.raises(LocalProtocolError, match="delivery_tag"):
        ch.send_ack(tag)  # type: ignore[arg-type]
    pair.assert_nothing_sent()


def test_contiguous_acks_in_one_flush_become_one_multiple_ack() -> None:
    pair, ch = setup()
    for tag in range(1, 101):
        ch.send_ack(tag)
    assert pair.client_to_broker() == [ack(100, True)]
    # The next burst continues from the floor.
    for tag in range(101, 104):
        ch.send_ack(tag)
    assert pair.client_to_broker() == [ack(103, True)]


def test_a_single_ack_stays_single() -> None:
    pair, ch = setup()
    ch.send_ack(1)
    assert pair.client_to_broker() == [ack(1)]
    ch.send_ack(2)
    assert pair.client_to_broker() == [ack(2)]


def test_a_held_earlier_delivery_is_never_acked_by_a_merged_ack() -> None:
    # Delivery 1 is still held by the application: 2 and 3 must go out one by one,
    # since ack(3, multiple) would also ack 1.
    pair, ch = setup()
    ch.send_ack(2)
    ch.send_ack(3)
    assert pair.client_to_broker() == [ack(2), ack(3)]
    # Once 1 is acked the floor catches up (2 and 3 were settled) and merging resumes.
    ch.send_ack(1)
    ch.send_ack(4)
    ch.send_ack(5)
    assert pair.client_to_broker() == [ack(5, True)]


def test_other_frames_in_between_keep_their_order() -> None:
    pair, ch = setup()
    ch.send_ack(1)
    ch.publish("", "q", b"x")
    ch.send_ack(2)
    ch.send_ack(3)
    assert pair.client_to_broker() == [
        ack(1),
        (1, spec.BasicPublish(exchange="", routing_key="q")),
        ack(3, True),
    ]


def test_nack_and_reject_break_a_run_and_count_as_settled() -> None:
    pair, ch = setup()
    ch.send_ack(1)
    ch.send_nack(2, requeue=True)
    ch.send_ack(3)
    ch.send_ack(4)
    ch.send_reject(5, requeue=False)
    ch.send_ack(6)
    assert pair.client_to_broker() == [
        ack(1),
        (1, spec.BasicNack(delivery_tag=2, multiple=False, requeue=True)),
        ack(4, True),
        (1, spec.BasicReject(delivery_tag=5, requeue=False)),
        ack(6),
    ]


def test_a_user_multiple_ack_moves_the_floor_and_can_be_extended() -> None:
    pair, ch = setup()
    ch.send_ack(10, multiple=True)
    ch.send_ack(11)
    ch.send_ack(12)
    assert pair.client_to_broker() == [ack(12, True)]
    # An ack of a tag below the floor is sent as given and changes nothing.
    ch.send_ack(5)
    ch.send_ack(13)
    assert pair.client_to_broker() == [ack(5), ack(13)]


def test_acks_behind_an_outstanding_request_are_not_merged_into_it() -> None:
    pair, ch = setup()
    ch.send_ack(1)
    ch.send_method(spec.BasicQos(prefetch_count=5))  # a request: later frames wait
    ch.send_ack(2)
    ch.send_ack(3)
    assert pair.client_to_broker() == [ack(1), (1, spec.BasicQos(prefetch_count=5))]
    pair.broker_method(1, spec.BasicQosOk())
    assert pair.client_to_broker() == [ack(2), ack(3)]


def test_ack_on_a_closed_channel_raises() -> None:
    _pair, ch = setup()
    ch.close(200, "bye")
    with pytest.raises(InvalidStateError):
        ch.send_ack(1)

"""ChannelProtocol driven against the scripted BrokerPeer: request ordering, publisher
confirms, content assembly and splitting, closes from either side, consumer
cancellation, flow control and how a dying connection closes its channels."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from broker_peer import BrokerPeer, Pair

from rabbitry.exceptions import (
    ChannelClosedByBroker,
    ChannelClosedByClient,
    ConnectionForced,
    InvalidStateError,
    LocalProtocolError,
    NotFound,
    PreconditionFailed,
    RemoteProtocolError,
)
from rabbitry.protocol import spec
from rabbitry.protocol.channel import ChannelProtocol, ChannelState
from rabbitry.protocol.connection import ConnectionState
from rabbitry.protocol.events import (
    ChannelClosedEvent,
    ConnectionTerminated,
    ConsumerCancelledByBroker,
    Delivery,
    FlowChanged,
    PublishConfirmed,
    Returned,
    RpcReply,
)

B = BrokerPeer

DECLARE_OK = spec.QueueDeclareOk(queue="q", message_count=0, consumer_count=0)


def setup(**kwargs: object) -> tuple[Pair, ChannelProtocol]:
    frame_max = kwargs.pop("broker_frame_max", 131072)
    pair = Pair(**kwargs)
    pair.handshake(frame_max=frame_max)  # type: ignore[arg-type]
    return pair, pair.open_channel()


def deliver_method(tag: int = 1, **kwargs: object) -> spec.BasicDeliver:
    fields: dict = {
        "consumer_tag": "ctag",
        "delivery_tag": tag,
        "redelivered": False,
        "exchange": "ex",
        "routing_key": "rk",
    }
    fields.update(kwargs)
    return spec.BasicDeliver(**fields)


# --------------------------------------------------------------------------- RPC order


def test_requests_wait_for_the_previous_answer_and_keep_their_order() -> None:
    pair, ch = setup()
    ch.send_method(spec.QueueDeclare(queue="q"))
    ch.send_method(spec.QueueBind(queue="q", exchange="ex", routing_key="rk"))
    assert ch.publish("ex", "rk", b"body") == 0
    ch.send_method(spec.ExchangeDeclare(exchange="ex2", type="topic"))
    assert pair.client_to_broker() == [(1, spec.QueueDeclare(queue="q"))]

    events = pair.broker_method(1, DECLARE_OK)
    assert events == [RpcReply(1, DECLARE_OK)]
    assert pair.client_to_broker() == [
        (1, spec.QueueBind(queue="q", exchange="ex", routing_key="rk"))
    ]

    events = pair.broker_method(1, spec.QueueBindOk())
    assert events == [RpcReply(1, spec.QueueBindOk())]
    assert pair.client_to_broker() == [
        (1, spec.BasicPublish(exchange="ex", routing_key="rk")),
        (1, spec.ExchangeDeclare(exchange="ex2", type="topic")),
    ]
    # The publish's content frames went out between the two methods.
    kinds = [f.kind for f in pair.broker.frames[-4:]]
    assert kinds == [1, 2, 3, 1]
    assert pair.broker.contents[-1].body == b"body"

    events = pair.broker_method(1, spec.ExchangeDeclareOk())
    assert events == [RpcReply(1, spec.ExchangeDeclareOk())]
    pair.assert_nothing_sent()


def test_asynchronous_methods_go_out_at_once_when_nothing_waits() -> None:
    pair, ch = setup()
    ch.send_method(spec.BasicAck(delivery_tag=3, multiple=True))
    ch.send_method(spec.BasicReject(delivery_tag=4, requeue=False))
    ch.publish("", "q", b"x")
    assert pair.client_to_broker() == [
        (1, spec.BasicAck(delivery_tag=3, multiple=True)),
        (1, spec.BasicReject(delivery_tag=4, requeue=False)),
        (1, spec.BasicPublish(exchange="", routing_key="q")),
    ]


def test_requests_and_publishes_before_open_ok_wait_for_it() -> None:
    pair = Pair()
    pair.handshake()
    ch = pair.client.open_channel()
    ch.send_method(spec.ConfirmSelect())
    assert ch.publish("", "q", b"a") == 1
    pair.assert_sent(spec.ChannelOpen, channel=1)
    pair.assert_nothing_sent()
    assert pair.broker_method(1, spec.ChannelOpenOk()) == [RpcReply(1, spec.ChannelOpenOk())]
    pair.assert_sent(spec.ConfirmSelect, channel=1)
    pair.assert_nothing_sent()
    pair.broker_method(1, spec.ConfirmSelectOk())
    pair.assert_sent(spec.BasicPublish, routing_key="q")
    assert pair.broker.contents[-1].body == b"a"


def test_basic_get_ok_and_get_empty_are_replies() -> None:
    pair, ch = setup()
    ch.send_method(spec.BasicGet(queue="q"))
    ch.send_method(spec.BasicGet(queue="q"))
    pair.assert_sent(spec.BasicGet, queue="q")
    pair.assert_nothing_sent()
    get_ok = spec.BasicGetOk(
        delivery_tag=7, redelivered=True, exchange="ex", routing_key="rk", message_count=41
    )
    props = spec.BasicProperties(content_type="text/plain", message_id="m-1")
    events = pair.broker_to_client(B.send_content(1, get_ok, b"fetched", props))
    assert len(events) == 1
    reply = events[0]
    assert isinstance(reply, RpcReply)
    assert reply.channel == 1 and reply.method == get_ok
    message = reply.message
    assert message is not None
    assert message.body == b"fetched"
    assert message.properties == props
    assert message.delivery_tag == 7
    assert message.redelivered is True
    assert (message.exchange, message.routing_key) == ("ex", "rk")
    assert message.message_count == 41
    # The second get went out after the first was answered.
    pair.assert_sent(spec.BasicGet, queue="q")
    events = pair.broker_method(1, spec.BasicGetEmpty())
    assert events == [RpcReply(1, spec.BasicGetEmpty())]


def test_deliveries_do_not_disturb_an_outstanding_request() -> None:
    pair, ch = setup()
    ch.send_method(spec.QueueDeclare(queue="q"))
    ch.send_method(spec.QueuePurge(queue="q"))
    pair.assert_sent(spec.QueueDeclare)
    events = pair.broker_to_client(B.send_content(1, deliver_method(), b"d"))
    assert [type(e) for e in events] == [Delivery]
    pair.assert_nothing_sent()
    assert pair.broker_method(1, DECLARE_OK) == [RpcReply(1, DECLARE_OK)]
    pair.assert_sent(spec.QueuePurge)


def test_tx_select_sets_transactional() -> None:
    pair, ch = setup()
    assert not ch.transactional
    ch.send_method(spec.TxSelect())
    assert ch.transactional
    pair.assert_sent(spec.TxSelect)
    assert pair.broker_method(1, spec.TxSelectOk()) == [RpcReply(1, spec.TxSelectOk())]


def test_a_nowait_request_does_not_block_the_channel() -> None:
    pair, ch = setup()
    ch.send_method(spec.QueueDeclare(queue="q", nowait=True))
    ch.send_method(spec.QueueBind(queue="q", exchange="ex", nowait=True))
    ch.publish("", "q", b"x")
    sent = pair.client_to_broker()
    assert [type(m) for _, m in sent] == [spec.QueueDeclare, spec.QueueBind, spec.BasicPublish]


# --------------------------------------------------------------------------- confirms


def test_publisher_confirms() -> None:
    pair, ch = setup()
    assert ch.publish("", "q", b"before") == 0
    assert not ch.confirm_mode
    ch.send_method(spec.ConfirmSelect())
    assert ch.confirm_mode
    assert [ch.publish("", "q", b"m%d" % i) for i in (1, 2, 3)] == [1, 2, 3]
    assert ch.next_publish_seq == 4
    pair.assert_sent(spec.BasicPublish)
    pair.assert_sent(spec.ConfirmSelect, channel=1, nowait=False)
    pair.assert_nothing_sent()  # the publishes wait for select-ok
    assert pair.broker_method(1, spec.ConfirmSelectOk()) == [RpcReply(1, spec.ConfirmSelectOk())]
    assert [m for _, m in pair.client_to_broker()] == [
        spec.BasicPublish(exchange="", routing_key="q")
    ] * 3
    assert [c.body for c in pair.broker.contents] == [b"before", b"m1", b"m2", b"m3"]

    events = pair.broker_to_client(
        B.send_method(1, spec.BasicAck(delivery_tag=2, multiple=True)),
        B.send_method(1, spec.BasicNack(delivery_tag=3, multiple=False, requeue=False)),
    )
    assert events == [
        PublishConfirmed(channel=1, delivery_tag=2, multiple=True, ack=True),
        PublishConfirmed(channel=1, delivery_tag=3, multiple=False, ack=False),
    ]
    assert ch.publish("", "q", b"m4") == 4
    pair.client_to_broker()
    events = pair.broker_to_client(
        B.send_method(1, spec.BasicAck(delivery_tag=4, multiple=False)),
        B.send_method(1, spec.BasicNack(delivery_tag=4, multiple=True)),
    )
    assert events == [PublishConfirmed(1, 4, False, True), PublishConfirmed(1, 4, True, False)]
    pair.assert_nothing_sent()


def test_failed_publish_does_not_consume_a_sequence_number() -> None:
    pair, ch = setup()
    ch.send_method(spec.ConfirmSelect())
    pair.broker_method(1, spec.ConfirmSelectOk())
    pair.client_to_broker()
    with pytest.raises(LocalProtocolError):
        ch.publish("", "q", 12)  # type: ignore[arg-type]
    assert ch.publish("", "q", b"ok") == 1


# --------------------------------------------------------------------------- receiving content


def test_delivery_split_over_several_body_frames() -> None:
    pair, _ch = setup()
    props = spec.BasicProperties(
        content_type="application/json",
        headers={"x-trace": "abc", "n": 3},
        delivery_mode=2,
        priority=5,
        correlation_id="corr",
        reply_to="amq.rabbitmq.reply-to",
        expiration="60000",
        message_id="id-1",
        timestamp=datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        type="order.created",
        user_id="guest",
        app_id="shop",
    )
    body = bytes(range(256)) * 40  # 10240 bytes
    method = deliver_method(tag=99, redelivered=True, consumer_tag="ctag-7")
    data = B.send_content(1, method, body, props, frame_max=4096)
    # Fed in awkward chunks: frames split across calls.
    events = []
    for i in range(0, len(data), 1000):
        events += pair.broker_to_client(data[i : i + 1000])
    assert len(events) == 1
    event = events[0]
    assert isinstance(event, Delivery)
    assert event.channel == 1
    message = event.message
    assert message.body == body
    assert message.properties == props
    assert message.headers == {"x-trace": "abc", "n": 3}
    assert message.delivery_tag == 99
    assert message.redelivered is True
    assert message.exchange == "ex"
    assert message.routing_key == "rk"
    assert message.consumer_tag == "ctag-7"
    assert message.message_count is None


def test_delivery_bodies_of_several_frames_in_one_chunk() -> None:
    pair, _ch = setup()
    events = pair.broker_to_client(
        B.send_method(1, deliver_method(1)),
        B.send_header(1, 6),
        B.send_body(1, b"ab"),
        B.send_body(1, b"cd"),
        B.send_body(1, b"ef"),
        B.send_content(1, deliver_method(2), b"second"),
    )
    assert [e.message.body for e in events] == [b"abcdef", b"second"]  # type: ignore[attr-defined]
    assert [e.message.delivery_tag for e in events] == [1, 2]  # type: ignore[attr-defined]


def test_zero_length_body_is_complete_after_the_header() -> None:
    pair, _ch = setup()
    events = pair.broker_to_client(B.send_method(1, deliver_method()), B.send_header(1, 0))
    assert len(events) == 1
    assert isinstance(events[0], Delivery)
    assert events[0].message.body == b""
    assert events[0].message.properties == spec.BasicProperties()
    # And the next message assembles normally.
    events = pair.broker_to_client(B.send_content(1, deliver_method(2), b"x"))
    assert events[0].message.body == b"x"  # type: ignore[attr-defined]


def test_basic_return() -> None:
    pair, _ch = setup()
    method = spec.BasicReturn(reply_code=312, reply_text="NO_ROUTE", exchange="ex", routing_key="k")
    props = spec.BasicProperties(message_id="m")
    events = pair.broker_to_client(B.send_content(1, method, b"back", props))
    assert len(events) == 1
    event = events[0]
    assert isinstance(event, Returned)
    assert event.channel == 1
    message = event.message
    assert message.body == b"back"
    assert message.properties == props
    assert (message.reply_code, message.reply_text) == (312, "NO_ROUTE")
    assert (message.exchange, message.routing_key) == ("ex", "k")
    assert message.delivery_tag == 0


def test_incoming_message_above_max_message_size_fails_the_connection() -> None:
    pair, _ch = setup(max_message_size=100)
    pair.broker_to_client(B.send_method(1, deliver_method()), B.send_header(1, 101))
    exc = pair.client.close_exc
    assert isinstance(exc, RemoteProtocolError) and exc.reply_code == 501
    pair.assert_sent(spec.ConnectionClose, reply_code=501)


def test_max_message_size_zero_means_no_limit() -> None:
    pair, ch = setup(max_message_size=0)
    events = pair.broker_to_client(B.send_content(1, deliver_method(), b"x" * 200_000))
    assert events[0].message.body == b"x" * 200_000  # type: ignore[attr-defined]
    ch.publish("", "q", b"y" * 200_000)
    pair.client_to_broker()
    assert pair.broker.contents[-1].body == b"y" * 200_000


# --------------------------------------------------------------------------- publishing


def test_publish_splits_a_large_body_into_frames_of_frame_max() -> None:
    pair, ch = setup()
    assert pair.client.frame_max == 131072
    body = bytes(range(256)) * 1200  # 307200 bytes
    props = spec.BasicProperties(content_type="application/octet-stream", delivery_mode=2)
    ch.publish("ex", "rk", body, props, mandatory=True)
    pair.assert_sent(spec.BasicPublish, channel=1, exchange="ex", routing_key="rk", mandatory=True)
    content = pair.broker.contents[-1]
    assert content.body == body
    assert content.body_size == len(body)
    assert content.properties == props
    assert content.body_frame_sizes == [131064, 131064, len(body) - 2 * 131064]
    assert all(size <= pair.client.frame_max - 8 for size in content.body_frame_sizes)


def test_publish_with_the_minimum_frame_max() -> None:
    pair, ch = setup(broker_frame_max=4096)
    ch.publish("", "q", b"z" * 10000)
    pair.client_to_broker()
    assert pair.broker.contents[-1].body_frame_sizes == [4088, 4088, 10000 - 2 * 4088]


def test_publish_with_an_empty_body_sends_only_the_header() -> None:
    pair, ch = setup()
    ch.publish("", "q", b"")
    pair.assert_sent(spec.BasicPublish)
    assert [f.kind for f in pair.broker.frames[-2:]] == [1, 2]
    content = pair.broker.contents[-1]
    assert content.body == b"" and content.body_frame_sizes == []


def test_publish_with_no_frame_limit_sends_one_body_frame() -> None:
    pair = Pair(frame_max=0)
    pair.handshake(frame_max=0)
    ch = pair.open_channel()
    ch.publish("", "q", b"b" * 300_000)
    pair.client_to_broker()
    assert pair.broker.contents[-1].body_frame_sizes == [300_000]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("héllo wörld", "héllo wörld".encode()),
        (bytearray(b"array"), b"array"),
        (memoryview(b"view"), b"view"),
    ],
)
def test_publish_body_types(body: object, expected: bytes) -> None:
    pair, ch = setup()
    ch.publish("", "q", body)  # type: ignore[arg-type]
    pair.client_to_broker()
    assert pair.broker.contents[-1].body == expected


@pytest.mark.parametrize("body", [12, None, 1.5, ["a"]])
def test_publish_with_an_invalid_body_queues_nothing(body: object) -> None:
    pair, ch = setup()
    with pytest.raises(LocalProtocolError, match="body"):
        ch.publish("", "q", body)  # type: ignore[arg-type]
    pair.assert_nothing_sent()


def test_publish_with_a_too_long_exchange_name_queues_nothing() -> None:
    pair, ch = setup()
    with pytest.raises(LocalProtocolError, match=r"basic\.publish\.exchange"):
        ch.publish("e" * 256, "rk", b"x")
    with pytest.raises(LocalProtocolError, match=r"basic\.publish\.routing_key"):
        ch.publish("", "é" * 128, b"x")  # 256 bytes in UTF-8
    pair.assert_nothing_sent()
    ch.publish("e" * 255, "rk", b"x")  # the limit itself is fine
    pair.assert_sent(spec.BasicPublish, exchange="e" * 255)


def test_publish_with_invalid_properties_queues_nothing() -> None:
    pair, ch = setup()
    with pytest.raises(LocalProtocolError, match="expiration"):
        ch.publish("", "q", b"x", spec.BasicProperties(expiration="soon"))
    with pytest.raises(LocalProtocolError):
        ch.publish("", "q", b"x", spec.BasicProperties(headers={"k": object()}))
    pair.assert_nothing_sent()


def test_publish_above_max_message_size_queues_nothing() -> None:
    pair, ch = setup(max_message_size=1000)
    with pytest.raises(LocalProtocolError, match="max_message_size"):
        ch.publish("", "q", b"x" * 1001)
    pair.assert_nothing_sent()
    ch.publish("", "q", b"x" * 1000)
    pair.assert_sent(spec.BasicPublish)


def test_encode_publish_then_send_publish() -> None:
    pair, ch = setup()
    frames = ch.encode_publish("ex", "rk", b"pre-encoded")
    pair.assert_nothing_sent()  # encoding alone queues nothing
    assert ch.send_publish(frames) == 0
    pair.assert_sent(spec.BasicPublish, exchange="ex", routing_key="rk")
    assert pair.broker.contents[-1].body == b"pre-encoded"
    ch.close()
    with pytest.raises(InvalidStateError):
        ch.send_publish(frames)


def test_many_distinct_routing_keys_publish_correctly() -> None:
    # More distinct (exchange, routing key) pairs than the method-frame cache holds.
    pair, ch = setup()
    for i in range(600):
        ch.publish("", f"rk-{i}", b"x")
    ch.publish("", "rk-0", b"x")
    sent = pair.client_to_broker()
    assert [m.routing_key for _, m in sent] == [f"rk-{i}" for i in range(600)] + ["rk-0"]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- closes


def test_broker_channel_close() -> None:
    pair, ch = setup()
    ch.send_method(spec.QueueDeclare(queue="missing", passive=True))
    ch.send_method(spec.QueueBind(queue="missing", exchange="ex"))
    pair.assert_sent(spec.QueueDeclare)
    events = pair.broker_method(
        1,
        spec.ChannelClose(
            reply_code=404,
            reply_text="NOT_FOUND - no queue 'missing' in vhost '/'",
            class_id=50,
            method_id=10,
        ),
    )
    pair.assert_sent(spec.ChannelCloseOk, channel=1)
    pair.assert_nothing_sent()  # the waiting bind is dropped
    assert len(events) == 1
    event = events[0]
    assert isinstance(event, ChannelClosedEvent)
    assert event.channel == 1
    exc = event.exc
    assert isinstance(exc, NotFound)
    assert exc.reply_code == 404
    assert exc.reply_text == "NOT_FOUND - no queue 'missing' in vhost '/'"
    assert (exc.class_id, exc.method_id) == (50, 10)
    assert "queue.declare" in str(exc)
    assert ch.state is ChannelState.CLOSED
    assert ch.close_exc is exc
    assert 1 not in pair.client.channels
    assert pair.client.state is ConnectionState.OPEN
    with pytest.raises(InvalidStateError, match="closed") as info:
        ch.send_method(spec.BasicQos(prefetch_count=1))
    assert info.value.__cause__ is exc
    with pytest.raises(InvalidStateError):
        ch.publish("", "q", b"x")
    ch.close()  # no-op
    pair.assert_nothing_sent()
    # The connection is still usable.
    assert pair.open_channel().channel_id == 2


@pytest.mark.parametrize(
    ("code", "cls"), [(406, PreconditionFailed), (404, NotFound), (499, ChannelClosedByBroker)]
)
def test_broker_channel_close_codes(code: int, cls: type) -> None:
    pair, _ch = setup()
    events = pair.broker_method(
        1, spec.ChannelClose(reply_code=code, reply_text="x", class_id=0, method_id=0)
    )
    assert type(events[0].exc) is cls  # type: ignore[attr-defined]


def test_client_channel_close() -> None:
    pair, ch = setup()
    ch.send_method(spec.QueueDeclare(queue="q"))
    ch.send_method(spec.QueueBind(queue="q", exchange="ex"))
    pair.assert_sent(spec.QueueDeclare)
    ch.close(200, "done")
    assert ch.state is ChannelState.CLOSING
    pair.assert_sent(
        spec.ChannelClose, channel=1, reply_code=200, reply_text="done", class_id=0, method_id=0
    )
    ch.close()  # idempotent
    pair.assert_nothing_sent()
    with pytest.raises(InvalidStateError):
        ch.send_method(spec.BasicQos(prefetch_count=1))
    with pytest.raises(InvalidStateError):
        ch.publish("", "q", b"x")
    # Everything but close / close-ok is discarded while closing.
    events = pair.broker_to_client(
        B.send_method(1, DECLARE_OK),
        B.send_method(1, spec.BasicAck(delivery_tag=1)),
        B.send_method(1, spec.BasicCancel(consumer_tag="c")),
    )
    assert events == []
    pair.assert_nothing_sent()  # no bind, no cancel-ok
    events = pair.broker_method(1, spec.ChannelCloseOk())
    assert len(events) == 1
    event = events[0]
    assert isinstance(event, ChannelClosedEvent) and event.channel == 1
    assert isinstance(event.exc, ChannelClosedByClient)
    assert (event.exc.reply_code, event.exc.reply_text) == (200, "done")
    assert ch.state is ChannelState.CLOSED
    assert 1 not in pair.client.channels
    assert pair.client.state is ConnectionState.OPEN


def test_deliveries_in_flight_while_closing_are_discarded() -> None:
    pair, ch = setup()
    ch.close()
    pair.assert_sent(spec.ChannelClose)
    events = pair.broker_to_client(B.send_content(1, deliver_method(), b"in flight"))
    assert events == []
    assert pair.client.state is ConnectionState.OPEN
    pair.assert_nothing_sent()
    events = pair.broker_method(1, spec.ChannelCloseOk())
    assert [type(e) for e in events] == [ChannelClosedEvent]


def test_deliver_method_while_closing_is_discarded() -> None:
    # Only the method frame: what the current code handles (see the xfail above).
    pair, ch = setup()
    ch.close()
    pair.assert_sent(spec.ChannelClose)
    assert pair.broker_method(1, deliver_method()) == []
    assert pair.client.state is ConnectionState.OPEN


def test_broker_channel_close_while_closing() -> None:
    pair, ch = setup()
    ch.close()
    pair.assert_sent(spec.ChannelClose)
    events = pair.broker_method(
        1, spec.ChannelClose(reply_code=406, reply_text="PRECONDITION", class_id=0, method_id=0)
    )
    pair.assert_sent(spec.ChannelCloseOk, channel=1)
    assert len(events) == 1
    assert isinstance(events[0], ChannelClosedEvent)
    assert isinstance(events[0].exc, ChannelClosedByClient)
    assert ch.state is ChannelState.CLOSED
    assert 1 not in pair.client.channels


def test_close_while_opening() -> None:
    pair = Pair()
    pair.handshake()
    ch = pair.client.open_channel()
    ch.close()
    pair.assert_sent(spec.ChannelOpen)
    pair.assert_sent(spec.ChannelClose)
    assert pair.broker_method(1, spec.ChannelOpenOk()) == []  # discarded
    events = pair.broker_method(1, spec.ChannelCloseOk())
    assert isinstance(events[0], ChannelClosedEvent)


# --------------------------------------------------------------------------- broker-initiated


def test_broker_basic_cancel() -> None:
    pair, _ch = setup()
    events = pair.broker_method(1, spec.BasicCancel(consumer_tag="ctag-1", nowait=False))
    pair.assert_sent(spec.BasicCancelOk, channel=1, consumer_tag="ctag-1")
    assert events == [ConsumerCancelledByBroker(1, "ctag-1")]


def test_broker_basic_cancel_nowait() -> None:
    pair, _ch = setup()
    events = pair.broker_method(1, spec.BasicCancel(consumer_tag="ctag-2", nowait=True))
    pair.assert_nothing_sent()
    assert events == [ConsumerCancelledByBroker(1, "ctag-2")]


def test_broker_channel_flow() -> None:
    pair, ch = setup()
    assert ch.flow_active
    events = pair.broker_method(1, spec.ChannelFlow(active=False))
    pair.assert_sent(spec.ChannelFlowOk, channel=1, active=False)
    assert events == [FlowChanged(1, False)]
    assert ch.flow_active is False
    events = pair.broker_method(1, spec.ChannelFlow(active=True))
    pair.assert_sent(spec.ChannelFlowOk, channel=1, active=True)
    assert events == [FlowChanged(1, True)]
    assert ch.flow_active is True


def test_flow_ok_does_not_wait_for_an_outstanding_request() -> None:
    pair, ch = setup()
    ch.send_method(spec.QueueDeclare(queue="q"))
    pair.assert_sent(spec.QueueDeclare)
    pair.broker_method(1, spec.ChannelFlow(active=False))
    pair.assert_sent(spec.ChannelFlowOk)


@pytest.mark.parametrize(
    "reply",
    [
        spec.QueueBindOk(),
        spec.ConfirmSelectOk(),
        spec.ChannelOpenOk(),
        spec.BasicConsumeOk(consumer_tag="x"),
    ],
)
def test_an_unexpected_reply_fails_the_connection(reply: spec.Method) -> None:
    pair, ch = setup()
    ch.send_method(spec.QueueDeclare(queue="q"))
    pair.assert_sent(spec.QueueDeclare)
    assert pair.broker_method(1, reply) == []
    exc = pair.client.close_exc
    assert isinstance(exc, RemoteProtocolError)
    assert exc.reply_code == 503
    assert reply.NAME in str(exc) and "queue.declare-ok" in str(exc)
    assert pair.client.state is ConnectionState.CLOSING
    pair.assert_sent(spec.ConnectionClose, channel=0, reply_code=503)


def test_a_reply_with_nothing_outstanding_fails_the_connection() -> None:
    pair, _ch = setup()
    pair.broker_method(1, spec.QueueDeclareOk(queue="q", message_count=0, consumer_count=0))
    exc = pair.client.close_exc
    assert isinstance(exc, RemoteProtocolError)
    assert "expected nothing" in str(exc)


# --------------------------------------------------------------------------- connection end


def test_channels_are_closed_before_the_connection_terminates() -> None:
    pair = Pair()
    pair.handshake()
    channels = [pair.open_channel() for _ in range(3)]
    channels[1].close()
    pair.client_to_broker()
    events = pair.broker_method(
        0, spec.ConnectionClose(reply_code=320, reply_text="forced", class_id=0, method_id=0)
    )
    assert [type(e) for e in events] == [ChannelClosedEvent] * 3 + [ConnectionTerminated]
    assert sorted(e.channel for e in events[:3]) == [1, 2, 3]  # type: ignore[attr-defined]
    exc = events[-1].exc  # type: ignore[attr-defined]
    assert isinstance(exc, ConnectionForced)
    assert all(e.exc is exc for e in events)  # type: ignore[attr-defined]
    assert all(c.state is ChannelState.CLOSED for c in channels)
    assert all(c.close_exc is exc for c in channels)
    assert pair.client.channels == {}
    with pytest.raises(InvalidStateError):
        channels[0].publish("", "q", b"x")


def test_closed_channel_after_protocol_error() -> None:
    pair, ch = setup()
    pair.broker_to_client(B.send_header(1, 3))  # 505
    assert pair.client.state is ConnectionState.CLOSING
    assert ch.state is ChannelState.OPEN  # until the connection ends
    events = pair.broker_method(0, spec.ConnectionCloseOk())
    assert [type(e) for e in events] == [ChannelClosedEvent, ConnectionTerminated]
    assert ch.state is ChannelState.CLOSED
    assert isinstance(ch.close_exc, RemoteProtocolError)

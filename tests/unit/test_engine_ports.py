"""What the engine hands the library's own collaborators, against the scripted broker.

A channel's ``start_consumer`` / ``abandon_consumer`` (the consumers' way to subscribe),
the connection's ``read_flow`` (their read back-pressure) and ``loop_hooks`` (what the
thread-safe API's IO thread drives). The scripted broker never answers basic.consume or
basic.cancel by itself: each test sends the answer when it wants it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from fake_broker import FakeBroker

import rabbitry
from rabbitry.aio.channel import AsyncChannel, Subscription
from rabbitry.aio.connection import loop_hooks
from rabbitry.exceptions import AMQPError, ConnectionClosedByClient
from rabbitry.protocol import spec

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from rabbitry.protocol.message import Message

pytestmark = pytest.mark.timeout(60)

WAIT = 5.0  # only a hang gets near it


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    with FakeBroker() as fake:
        yield fake


@pytest.fixture
async def conn(broker: FakeBroker) -> AsyncIterator[rabbitry.AsyncConnection]:
    connection = rabbitry.AsyncConnection(broker.url)
    await connection.connect()
    try:
        yield connection
    finally:
        await connection.close(timeout=1.0)


async def _sent(broker: FakeBroker, method_class: type[spec.Method], count: int = 1) -> spec.Method:
    """The ``count``-th method of that class the broker received (waits for it)."""
    await asyncio.to_thread(broker.wait_for, lambda: len(broker.sent(method_class)) >= count)
    return broker.sent(method_class)[count - 1][1]


async def _start(
    broker: FakeBroker, channel: AsyncChannel, subscription: Subscription, count: int = 1
) -> str:
    """Start a consumer; the broker answers with the tag it was asked for."""
    started = asyncio.ensure_future(channel.start_consumer(subscription, timeout=WAIT))
    method = await _sent(broker, spec.BasicConsume, count)
    assert isinstance(method, spec.BasicConsume)
    broker.send(channel.channel_id, spec.BasicConsumeOk(consumer_tag=method.consumer_tag))
    return await started


def _ignore(message: Message) -> None:
    del message


def test_a_subscription_makes_a_new_basic_consume_each_time() -> None:
    subscription = Subscription(
        "q", _ignore, consumer_tag="t", no_ack=True, exclusive=True, arguments={"x-priority": 3}
    )
    first, second = subscription.method(), subscription.method()
    assert first is not second  # recovery fills in the broker's tag in its own copy
    for method in (first, second):
        assert (method.queue, method.consumer_tag, method.no_ack, method.exclusive) == (
            "q",
            "t",
            True,
            True,
        )
        assert method.arguments == {"x-priority": 3}
        assert not method.no_local


async def test_start_consumer_sends_the_subscription_and_returns_the_tag(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    channel = await conn.channel()
    subscription = Subscription("q", _ignore, consumer_tag="tag-1", exclusive=True)
    assert await _start(broker, channel, subscription) == "tag-1"
    method = broker.sent(spec.BasicConsume)[0][1]
    assert isinstance(method, spec.BasicConsume)
    assert (method.queue, method.exclusive, method.no_ack) == ("q", True, False)


async def test_abandon_consumer_cancels_on_an_open_channel_and_ignores_unknown_tags(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    channel = await conn.channel()
    tag = await _start(broker, channel, Subscription("q", _ignore, consumer_tag="tag-1"))
    await channel.abandon_consumer("no-such-tag")
    abandoning = asyncio.ensure_future(channel.abandon_consumer(tag, timeout=WAIT))
    cancel = await _sent(broker, spec.BasicCancel)
    assert isinstance(cancel, spec.BasicCancel) and cancel.consumer_tag == tag
    broker.send(channel.channel_id, spec.BasicCancelOk(consumer_tag=tag))
    await abandoning
    assert len(broker.sent(spec.BasicCancel)) == 1  # none for the unknown tag


async def test_abandon_consumer_returns_quietly_when_the_channel_ends_meanwhile(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    channel = await conn.channel()
    closed: list[AMQPError] = []
    subscription = Subscription("q", _ignore, consumer_tag="tag-1", on_close=closed.append)
    tag = await _start(broker, channel, subscription)
    abandoning = asyncio.ensure_future(channel.abandon_consumer(tag, timeout=WAIT))
    await _sent(broker, spec.BasicCancel)
    broker.close_channel(channel.channel_id)  # instead of cancel-ok
    await abandoning  # no error: the consumer is gone with the channel
    assert channel.is_closed
    assert len(closed) == 1  # the channel's end still reaches the subscription


async def test_a_cancelled_last_consumer_makes_the_record_forget_its_auto_delete_queue(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    channel = await conn.channel()
    await channel.queue_declare("q", auto_delete=True)
    assert conn.topology_record.queue("q") is not None
    first = await _start(broker, channel, Subscription("q", _ignore, consumer_tag="a"), 1)
    second = await _start(broker, channel, Subscription("q", _ignore, consumer_tag="b"), 2)
    for count, tag in enumerate((first, second), start=1):
        cancelling = asyncio.ensure_future(channel.basic_cancel(tag, timeout=WAIT))
        await _sent(broker, spec.BasicCancel, count)
        broker.send(channel.channel_id, spec.BasicCancelOk(consumer_tag=tag))
        await cancelling
        # Forgotten with the last consumer only: the broker deletes the queue then.
        assert (conn.topology_record.queue("q") is None) == (tag == second)


async def test_read_flow_counts_pauses(conn: rabbitry.AsyncConnection) -> None:
    flow = conn.read_flow
    assert conn.read_flow is flow  # one handle per connection
    transport = conn._transport
    assert transport is not None and transport.is_reading()
    flow.pause()
    flow.pause()
    assert not transport.is_reading()
    flow.resume()
    assert not transport.is_reading()  # one pause is still held
    flow.resume()
    assert transport.is_reading()
    flow.resume()  # more resumes than pauses: nothing to release
    assert transport.is_reading()
    flow.pause()
    assert not transport.is_reading()  # the extra resume was not counted
    flow.resume()


async def test_loop_hooks_cork_writes_until_the_batch_ends(
    conn: rabbitry.AsyncConnection,
) -> None:
    channel = await conn.channel()
    proto = conn._proto
    assert proto is not None
    hooks = loop_hooks(conn)
    hooks.begin_batch()
    await channel.basic_publish("", "q", b"one")
    await channel.basic_publish("", "q", b"two")
    assert proto.send_queue  # still queued: the batch corks them
    hooks.end_batch()
    assert not proto.send_queue


async def test_loop_hooks_abort_ends_the_connection_at_once(broker: FakeBroker) -> None:
    broker.answer_close = False  # nothing would answer a close: abort does not ask
    conn = rabbitry.AsyncConnection(broker.url)
    await conn.connect()
    ended: list[AMQPError] = []
    conn.add_close_callback(ended.append)
    channel = await conn.channel()
    pending = asyncio.ensure_future(channel.basic_qos(10))  # never answered
    await _sent(broker, spec.BasicQos)
    reason = ConnectionClosedByClient(200, "the loop stops")
    loop_hooks(conn).abort(reason)
    assert conn.is_closed and conn.close_exc is reason
    assert ended == [reason]
    with pytest.raises(AMQPError):
        await asyncio.wait_for(pending, WAIT)
    assert channel.is_closed

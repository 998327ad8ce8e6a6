"""Round trips through a real broker: declare, bind, publish, get, consume, confirm, tx."""

from __future__ import annotations

import asyncio
import contextlib
import os
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest

import rabbitry
from rabbitry import AsyncChannel, AsyncConnection, Message, Properties
from rabbitry.config import parse_urls

if TYPE_CHECKING:
    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(30)

#: Upper bound for waiting on something that should happen (never a timing assertion).
WAIT = 5.0
#: How long to listen for deliveries that must *not* come.
QUIET = 0.3


async def ready_count(ch: AsyncChannel, queue: str) -> int:
    """Ready messages in ``queue``, as a passive declare reports them."""
    ok = await ch.queue_declare(queue, passive=True)
    return ok.message_count


async def wait_ready(ch: AsyncChannel, queue: str, expected: int) -> None:
    """Passive-declare until ``queue`` holds ``expected`` ready messages.

    RabbitMQ applies publishes, acks and requeues to a queue asynchronously, so a count
    taken right after them may lag (a publish followed at once by a passive declare on
    the same channel can report 0). Where the publish is confirmed the count is exact
    and a plain :func:`ready_count` is used instead.
    """
    count = None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(WAIT):
            while (count := await ready_count(ch, queue)) != expected:
                await asyncio.sleep(0.01)
    assert count == expected, f"{queue}: {count} ready messages, expected {expected}"


async def consumer_count(ch: AsyncChannel, queue: str) -> int:
    ok = await ch.queue_declare(queue, passive=True)
    return ok.consumer_count


async def confirm_channel(conn: AsyncConnection) -> AsyncChannel:
    ch = await conn.channel()
    await ch.confirm_select()
    return ch


async def publish_confirmed(
    ch: AsyncChannel, exchange: str, routing_key: str, body: bytes, **kwargs: Any
) -> None:
    """Publish on a confirm channel and wait for the broker's ack (so it is routed)."""
    future = await ch.basic_publish(exchange, routing_key, body, **kwargs)
    assert future is not None, "the channel is not in confirm mode"
    async with asyncio.timeout(WAIT):
        await future


async def drain(ch: AsyncChannel, queue: str) -> list[bytes]:
    """basic_get (auto-ack) until the queue is empty; return the bodies."""
    bodies = []
    while (message := await ch.basic_get(queue, no_ack=True)) is not None:
        bodies.append(message.body)
    return bodies


# --------------------------------------------------------------------------- exchanges


@pytest.mark.parametrize("kind", ["direct", "topic", "fanout", "headers"])
async def test_exchange_types_route(conn: AsyncConnection, names: Names, kind: str) -> None:
    ch = await confirm_channel(conn)
    exchange = names.exchange(kind)
    queue = names.queue()
    await ch.exchange_declare(exchange, kind)
    await ch.queue_declare(queue)

    # (binding key, arguments) and then (routing key, headers, routed?) per message.
    bindings: dict[str, tuple[str, dict[str, Any] | None]] = {
        "direct": ("orders", None),
        "topic": ("orders.*.created", None),
        "fanout": ("ignored", None),
        "headers": ("", {"x-match": "all", "region": "eu", "tier": 2}),
    }
    messages: dict[str, list[tuple[str, dict[str, Any] | None, bool]]] = {
        "direct": [("orders", None, True), ("orders.x", None, False)],
        "topic": [("orders.eu.created", None, True), ("orders.eu.deleted", None, False)],
        "fanout": [("anything", None, True), ("", None, True)],
        "headers": [
            ("", {"region": "eu", "tier": 2, "extra": True}, True),
            ("", {"region": "eu", "tier": 3}, False),
            ("", {"region": "eu"}, False),
        ],
    }
    binding_key, arguments = bindings[kind]
    await ch.queue_bind(queue, exchange, binding_key, arguments=arguments)

    expected = []
    for index, (routing_key, headers, routed) in enumerate(messages[kind]):
        body = f"{kind}-{index}".encode()
        await publish_confirmed(
            ch, exchange, routing_key, body, properties=Properties(headers=headers)
        )
        if routed:
            expected.append(body)

    assert await ready_count(ch, queue) == len(expected)
    assert await drain(ch, queue) == expected


async def test_exchange_declare_passive_and_delete(channel: AsyncChannel, names: Names) -> None:
    exchange = names.exchange()
    await channel.exchange_declare(exchange, "topic", auto_delete=False)
    await channel.exchange_declare(exchange, "topic", passive=True)
    await channel.exchange_delete(exchange)
    with pytest.raises(rabbitry.NotFound):
        await channel.exchange_declare(exchange, "topic", passive=True)


async def test_exchange_to_exchange_bind_and_unbind(conn: AsyncConnection, names: Names) -> None:
    ch = await confirm_channel(conn)
    source = names.exchange("src")
    destination = names.exchange("dst")
    queue = names.queue()
    await ch.exchange_declare(source, "direct")
    await ch.exchange_declare(destination, "fanout")
    await ch.queue_declare(queue)
    await ch.queue_bind(queue, destination)
    await ch.exchange_bind(destination, source, "k")

    await publish_confirmed(ch, source, "k", b"via-binding")
    await publish_confirmed(ch, source, "other-key", b"not-bound-key")
    assert await drain(ch, queue) == [b"via-binding"]

    await ch.exchange_unbind(destination, source, "k")
    await publish_confirmed(ch, source, "k", b"after-unbind")
    assert await ready_count(ch, queue) == 0
    # The destination itself still routes.
    await publish_confirmed(ch, destination, "", b"direct-to-destination")
    assert await drain(ch, queue) == [b"direct-to-destination"]


async def test_queue_unbind(conn: AsyncConnection, names: Names) -> None:
    ch = await confirm_channel(conn)
    exchange = names.exchange()
    queue = names.queue()
    await ch.exchange_declare(exchange, "direct")
    await ch.queue_declare(queue)
    await ch.queue_bind(queue, exchange, "rk")
    await publish_confirmed(ch, exchange, "rk", b"bound")
    await ch.queue_unbind(queue, exchange, "rk")
    await publish_confirmed(ch, exchange, "rk", b"unbound")
    assert await drain(ch, queue) == [b"bound"]


# --------------------------------------------------------------------------- queues


async def test_queue_purge_and_delete_report_counts(conn: AsyncConnection, names: Names) -> None:
    ch = await confirm_channel(conn)
    queue = names.queue()
    ok = await ch.queue_declare(queue)
    assert ok.queue == queue
    assert (ok.message_count, ok.consumer_count) == (0, 0)

    for index in range(7):
        await publish_confirmed(ch, "", queue, b"purge-%d" % index)
    assert await ready_count(ch, queue) == 7
    purged = await ch.queue_purge(queue)
    assert purged.message_count == 7
    assert await ready_count(ch, queue) == 0

    for index in range(4):
        await publish_confirmed(ch, "", queue, b"delete-%d" % index)
    deleted = await ch.queue_delete(queue)
    assert deleted.message_count == 4
    with pytest.raises(rabbitry.NotFound):
        await ch.queue_declare(queue, passive=True)


async def test_server_named_exclusive_queue(url: str) -> None:
    async with AsyncConnection(url) as conn:
        ch = await conn.channel()
        ok = await ch.queue_declare("", exclusive=True)
        name = ok.queue
        assert name.startswith("amq.gen-")
        await ch.basic_publish("", name, b"to-server-named")
        await wait_ready(ch, name, 1)
        message = await ch.basic_get(name)
        assert message is not None
        assert message.body == b"to-server-named"
        assert message.routing_key == name
        message.ack()
    # Exclusive: gone with its connection.
    async with AsyncConnection(url) as other:
        ch = await other.channel()
        with pytest.raises(rabbitry.NotFound):
            await ch.queue_declare(name, passive=True)


# --------------------------------------------------------------------------- get / ack


async def test_get_ack_nack_reject_update_queue_counts(channel: AsyncChannel, names: Names) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    assert await channel.basic_get(queue) is None
    for body in (b"one", b"two", b"three"):
        await channel.basic_publish("", queue, body)
    await wait_ready(channel, queue, 3)

    first = await channel.basic_get(queue)
    assert first is not None
    assert (first.body, first.redelivered, first.exchange, first.routing_key) == (
        b"one",
        False,
        "",
        queue,
    )
    assert first.message_count == 2
    first.ack()
    await wait_ready(channel, queue, 2)

    second = await channel.basic_get(queue)
    assert second is not None
    assert second.body == b"two"
    await wait_ready(channel, queue, 1)
    second.nack(requeue=True)
    await wait_ready(channel, queue, 2)

    # The requeued message goes back to its place at the head, marked redelivered.
    again = await channel.basic_get(queue)
    assert again is not None
    assert (again.body, again.redelivered) == (b"two", True)
    again.reject(requeue=False)
    await wait_ready(channel, queue, 1)

    third = await channel.basic_get(queue)
    assert third is not None
    assert third.body == b"three"
    channel.basic_reject(third.delivery_tag, requeue=True)
    await wait_ready(channel, queue, 1)
    last = await channel.basic_get(queue)
    assert last is not None
    assert (last.body, last.redelivered) == (b"three", True)
    channel.basic_nack(last.delivery_tag, requeue=False)
    await wait_ready(channel, queue, 0)


async def test_basic_get_no_ack(channel: AsyncChannel, names: Names) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    await channel.basic_publish("", queue, "text body é")
    await wait_ready(channel, queue, 1)
    message = await channel.basic_get(queue, no_ack=True)
    assert message is not None
    assert message.body == "text body é".encode()
    # Nothing to ack: closing the channel must not put it back.
    await channel.close()
    other = await channel.connection.channel()
    assert await ready_count(other, queue) == 0


async def test_basic_recover_redelivers(channel: AsyncChannel, names: Names) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    await channel.basic_publish("", queue, b"recover-me")
    await wait_ready(channel, queue, 1)
    first = await channel.basic_get(queue)
    assert first is not None
    assert not first.redelivered
    assert await ready_count(channel, queue) == 0

    await channel.basic_recover(requeue=True)
    again = await channel.basic_get(queue)
    assert again is not None
    assert (again.body, again.redelivered) == (b"recover-me", True)
    again.ack()
    assert await ready_count(channel, queue) == 0


# --------------------------------------------------------------------------- consume


async def _publish_n(ch: AsyncChannel, queue: str, n: int) -> list[bytes]:
    bodies = [b"msg-%03d" % index for index in range(n)]
    for body in bodies:
        await ch.basic_publish("", queue, body)
    return bodies


@pytest.mark.parametrize("style", ["sync", "async"])
async def test_consume_with_callback(channel: AsyncChannel, names: Names, style: str) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    received: list[Message] = []
    done = asyncio.Event()
    n = 20

    def on_message_sync(message: Message) -> None:
        received.append(message)
        message.ack()
        if len(received) == n:
            done.set()

    async def on_message_async(message: Message) -> None:
        await asyncio.sleep(0)  # really suspends: deliveries must still stay in order
        on_message_sync(message)

    callback = on_message_sync if style == "sync" else on_message_async
    tag = await channel.basic_consume(queue, callback)
    assert tag.startswith("amq.ctag-")
    assert await consumer_count(channel, queue) == 1
    bodies = await _publish_n(channel, queue, n)
    async with asyncio.timeout(WAIT):
        await done.wait()

    assert [m.body for m in received] == bodies
    assert {m.consumer_tag for m in received} == {tag}
    assert [m.delivery_tag for m in received] == list(range(1, n + 1))
    assert all(m.routing_key == queue and m.exchange == "" for m in received)

    await channel.basic_cancel(tag)
    assert await consumer_count(channel, queue) == 0
    await channel.basic_publish("", queue, b"after-cancel")
    await wait_ready(channel, queue, 1)
    await asyncio.sleep(QUIET)
    assert len(received) == n


async def test_consume_with_own_consumer_tag(channel: AsyncChannel, names: Names) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    got: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
    tag = await channel.basic_consume(
        queue, got.set_result, consumer_tag="my-tag", no_ack=True, exclusive=True
    )
    assert tag == "my-tag"
    await channel.basic_publish("", queue, b"tagged")
    async with asyncio.timeout(WAIT):
        message = await got
    assert (message.body, message.consumer_tag) == (b"tagged", "my-tag")
    await channel.basic_cancel(tag)


async def test_consume_iterator_ends_when_idle(channel: AsyncChannel, names: Names) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    bodies = await _publish_n(channel, queue, 25)
    received = []
    async with asyncio.timeout(WAIT):
        async for message in channel.consume(queue, prefetch=10, timeout=1):
            received.append(message.body)
            message.ack()
    assert received == bodies
    assert await ready_count(channel, queue) == 0
    # The iteration cancelled its consumer.
    assert await consumer_count(channel, queue) == 0
    assert channel.is_open


async def test_consume_iterator_closed_early(channel: AsyncChannel, names: Names) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    await _publish_n(channel, queue, 5)
    async with contextlib.aclosing(channel.consume(queue, timeout=WAIT)) as messages:
        async for message in messages:
            message.ack()
            break
    assert await consumer_count(channel, queue) == 0
    # One acked; the rest are ready or (sent before the cancel) unacked until the
    # channel closes.
    await channel.close()
    await wait_ready(await channel.connection.channel(), queue, 4)


async def test_consume_iterator_releases_unyielded_messages(
    conn: AsyncConnection, names: Names
) -> None:
    """Deliveries that reached the iterator but were never yielded go back to the queue
    when the iteration ends, without waiting for the channel to close."""
    ch = await confirm_channel(conn)
    queue = names.queue()
    await ch.queue_declare(queue)
    for index in range(10):
        await publish_confirmed(ch, "", queue, b"%d" % index)
    async with contextlib.aclosing(ch.consume(queue, prefetch=10, timeout=1)) as messages:
        async for message in messages:
            await asyncio.sleep(0.2)  # let the other nine arrive in the inbox
            message.ack()
            break
    assert ch.is_open
    # The channel stays open; the nine others should be back in the queue.
    await wait_ready(await conn.channel(), queue, 9)


async def test_basic_qos_limits_unacked_deliveries(channel: AsyncChannel, names: Names) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    await _publish_n(channel, queue, 20)
    await channel.basic_qos(5)
    received: list[Message] = []
    five = asyncio.Event()
    ten = asyncio.Event()

    def on_message(message: Message) -> None:
        received.append(message)
        if len(received) >= 5:
            five.set()
        if len(received) >= 10:
            ten.set()

    await channel.basic_consume(queue, on_message)
    async with asyncio.timeout(WAIT):
        await five.wait()
    await asyncio.sleep(QUIET)
    assert len(received) == 5

    # Acking all of them (multiple) opens the window for exactly five more.
    received[-1].ack(multiple=True)
    async with asyncio.timeout(WAIT):
        await ten.wait()
    await asyncio.sleep(QUIET)
    assert len(received) == 10
    assert [m.body for m in received] == [b"msg-%03d" % i for i in range(10)]


async def test_many_channels_on_one_connection(conn: AsyncConnection, names: Names) -> None:
    n = 50
    channels = await asyncio.gather(*(conn.channel() for _ in range(n)))
    assert len({ch.channel_id for ch in channels}) == n
    assert all(ch.is_open for ch in channels)
    queue = names.queue()
    await channels[0].queue_declare(queue)

    async def publish(ch: AsyncChannel) -> None:
        await ch.confirm_select()
        await publish_confirmed(ch, "", queue, b"from-%d" % ch.channel_id)

    await asyncio.gather(*(publish(ch) for ch in channels))
    bodies = await drain(channels[-1], queue)
    assert sorted(bodies) == sorted(b"from-%d" % ch.channel_id for ch in channels)
    await asyncio.gather(*(ch.close() for ch in channels[: n // 2]))
    assert all(ch.is_closed for ch in channels[: n // 2])
    assert all(ch.is_open for ch in channels[n // 2 :])
    # Freed channel numbers are reused and still work.
    again = await conn.channel()
    assert await ready_count(again, queue) == 0


# --------------------------------------------------------------------------- publishing


async def test_publisher_confirms_5000(conn: AsyncConnection, names: Names) -> None:
    ch = await confirm_channel(conn)
    assert ch.confirm_mode
    queue = names.queue()
    await ch.queue_declare(queue)
    futures = [await ch.basic_publish("", queue, b"c%d" % i) for i in range(5000)]
    assert all(isinstance(f, asyncio.Future) for f in futures)
    async with asyncio.timeout(WAIT):
        results = await asyncio.gather(*futures)  # type: ignore[arg-type]
    assert results == [None] * 5000
    assert await ready_count(ch, queue) == 5000


async def test_publish_without_confirms_returns_none(channel: AsyncChannel, names: Names) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    assert await channel.basic_publish("", queue, b"x") is None


async def test_mandatory_unroutable_is_returned(conn: AsyncConnection, names: Names) -> None:
    ch = await confirm_channel(conn)
    exchange = names.exchange()
    await ch.exchange_declare(exchange, "direct")
    returned: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
    ch.add_return_callback(returned.set_result)
    props = Properties(message_id="m-1", headers={"k": "v"})
    confirm = await ch.basic_publish(
        exchange, "nowhere", b"unroutable", properties=props, mandatory=True
    )
    async with asyncio.timeout(WAIT):
        message = await returned
        # The broker still confirms a returned message (after the return).
        assert confirm is not None
        await confirm
    assert message.reply_code == 312
    assert message.reply_text == "NO_ROUTE"
    assert (message.exchange, message.routing_key, message.body) == (
        exchange,
        "nowhere",
        b"unroutable",
    )
    assert message.properties == props
    assert message.delivery_tag == 0
    assert ch.is_open


async def test_non_mandatory_unroutable_is_dropped(conn: AsyncConnection, names: Names) -> None:
    ch = await confirm_channel(conn)
    exchange = names.exchange()
    await ch.exchange_declare(exchange, "direct")
    returned: list[Message] = []
    ch.add_return_callback(returned.append)
    await publish_confirmed(ch, exchange, "nowhere", b"dropped")
    await asyncio.sleep(QUIET)
    assert returned == []


async def test_transactions_commit_and_rollback(channel: AsyncChannel, names: Names) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    await channel.tx_select()
    await channel.basic_publish("", queue, b"committed")
    assert await ready_count(channel, queue) == 0  # not before the commit
    await channel.tx_commit()
    await wait_ready(channel, queue, 1)

    await channel.basic_publish("", queue, b"rolled-back")
    await channel.tx_rollback()
    await asyncio.sleep(QUIET)
    assert await ready_count(channel, queue) == 1
    await channel.tx_commit()  # nothing left to commit
    assert await ready_count(channel, queue) == 1

    message = await channel.basic_get(queue)
    assert message is not None
    assert message.body == b"committed"
    # Acks are transactional too.
    message.ack()
    await channel.tx_rollback()
    await channel.basic_recover(requeue=True)
    await wait_ready(channel, queue, 1)
    assert await drain(channel, queue) == [b"committed"]


async def test_all_properties_round_trip(url: str, channel: AsyncChannel, names: Names) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    username = parse_urls(url)[0].username
    # Whole seconds (AMQP timestamps are POSIX seconds) and a non-UTC zone: the value
    # must survive, not the zone.
    stamp = datetime(2024, 5, 17, 12, 30, 45, tzinfo=timezone(timedelta(hours=2)))
    props = Properties(
        content_type="application/json",
        content_encoding="gzip",
        headers={
            "str": "value é",
            "int": 42,
            "neg": -(2**40),
            "float": 0.5,
            "bool": False,
            "none": None,
            "list": [1, "two", [3.0], {"four": 4}],
            "table": {"nested": {"deeper": "yes"}},
            "bytes": b"\x00\x01\xfe\xff",
            "decimal": Decimal("3.14159"),
            "when": datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC),
        },
        delivery_mode=2,
        priority=7,
        correlation_id="corr-123",
        reply_to="amq.rabbitmq.reply-to-ish",
        expiration="60000",
        message_id="msg-456",
        timestamp=stamp,
        type="order.created",
        user_id=username,  # RabbitMQ refuses a user_id other than the connection's
        app_id="rabbitry-tests",
        cluster_id="cluster-7",
    )
    assert all(getattr(props, field) is not None for field in Properties.FIELDS)
    assert len(Properties.FIELDS) == 14
    await channel.basic_publish("", queue, b"{}", properties=props)
    await wait_ready(channel, queue, 1)
    message = await channel.basic_get(queue, no_ack=True)
    assert message is not None
    got = message.properties
    for field in Properties.FIELDS:
        assert getattr(got, field) == getattr(props, field), field
    assert got == props
    assert isinstance(got.timestamp, datetime)
    assert got.timestamp.tzinfo is not None
    assert got.timestamp.utcoffset() == timedelta(0)
    assert got.timestamp == datetime(2024, 5, 17, 10, 30, 45, tzinfo=UTC)
    assert message.headers == props.headers


async def test_empty_body_and_no_properties(channel: AsyncChannel, names: Names) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    await channel.basic_publish("", queue, b"")
    await wait_ready(channel, queue, 1)
    message = await channel.basic_get(queue, no_ack=True)
    assert message is not None
    assert message.body == b""
    assert message.properties == Properties()
    assert message.headers == {}


@pytest.mark.parametrize("frame_max", [None, 4096], ids=["default-frame-max", "frame-max-4096"])
async def test_one_mebibyte_body(url: str, names: Names, frame_max: int | None) -> None:
    body = os.urandom(1024 * 1024)
    queue = names.queue()
    async with AsyncConnection(url, frame_max=frame_max) as conn:
        if frame_max is not None:
            assert conn.frame_max == frame_max
        ch = await confirm_channel(conn)
        await ch.queue_declare(queue)
        await publish_confirmed(ch, "", queue, body, properties=Properties(message_id="big"))
        message = await ch.basic_get(queue, no_ack=True)
    assert message is not None
    assert len(message.body) == len(body)
    assert message.body == body
    assert message.properties.message_id == "big"


async def test_large_body_consumed_on_small_frames(url: str, names: Names) -> None:
    """Deliveries (not only get-ok) are reassembled from many body frames."""
    bodies = [os.urandom(100_000 + i) for i in range(3)]
    queue = names.queue()
    async with AsyncConnection(url, frame_max=4096) as conn:
        ch = await conn.channel()
        await ch.queue_declare(queue)
        for body in bodies:
            await ch.basic_publish("", queue, body)
        received = []
        async with contextlib.aclosing(ch.consume(queue, timeout=1)) as messages:
            async for message in messages:
                received.append(message.body)
                message.ack()
                if len(received) == len(bodies):
                    break
    assert received == bodies

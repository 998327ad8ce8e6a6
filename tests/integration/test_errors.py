"""Errors from a real broker (and from no broker): types, codes and what stays usable."""

from __future__ import annotations

import asyncio
import re
import socket
from typing import TYPE_CHECKING

import pytest
from tests.support.broker_ctl import rabbitmqctl
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import AsyncChannel, AsyncConnection, Properties
from rabbitry.config import parse_urls

if TYPE_CHECKING:
    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(30)

WAIT = 5.0


def dead_port() -> int:
    """A local TCP port where (almost certainly) nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dead_url(port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{port}/"


def with_query(url: str, **query: object) -> str:
    extra = "&".join(f"{key}={value}" for key, value in query.items())
    return f"{url}{'&' if '?' in url else '?'}{extra}"


async def assert_channel_usable(conn: AsyncConnection, names: Names) -> None:
    """The connection is open and a new channel can do a round trip."""
    assert conn.is_open
    assert conn.close_exc is None
    ch = await conn.channel()
    queue = names.queue("after")
    ok = await ch.queue_declare(queue)
    assert ok.queue == queue
    await ch.close()


# --------------------------------------------------------------------------- channel errors


async def test_conflicting_redeclare_is_precondition_failed(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue, durable=False)
    with pytest.raises(rabbitry.PreconditionFailed) as info:
        await channel.queue_declare(queue, durable=True)
    exc = info.value
    assert isinstance(exc, rabbitry.ChannelClosed)
    assert (exc.reply_code, exc.class_id, exc.method_id) == (406, 50, 10)
    assert "PRECONDITION_FAILED" in exc.reply_text
    assert "queue.declare" in str(exc)

    assert channel.is_closed
    assert not channel.is_open
    assert isinstance(channel.close_exc, rabbitry.PreconditionFailed)
    assert channel.close_exc.reply_code == 406
    assert isinstance(await channel.wait_closed(), rabbitry.PreconditionFailed)
    # The closed channel refuses further work without touching the wire...
    with pytest.raises(rabbitry.InvalidStateError):
        await channel.queue_declare(queue, passive=True)
    # ...and the connection is unharmed.
    await assert_channel_usable(conn, names)


async def test_conflicting_exchange_type_is_precondition_failed(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    exchange = names.exchange()
    await channel.exchange_declare(exchange, "direct")
    with pytest.raises(rabbitry.PreconditionFailed) as info:
        await channel.exchange_declare(exchange, "fanout")
    assert (info.value.reply_code, info.value.class_id, info.value.method_id) == (406, 40, 10)
    await assert_channel_usable(conn, names)


async def test_publish_to_missing_exchange_fails_the_next_rpc(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    missing = names.exchange("missing")  # never declared
    await channel.basic_publish(missing, "rk", b"lost")
    with pytest.raises(rabbitry.NotFound) as info:
        await channel.queue_declare(names.queue())
    exc = info.value
    assert (exc.reply_code, exc.class_id, exc.method_id) == (404, 60, 40)  # basic.publish
    assert missing in exc.reply_text
    assert channel.is_closed
    assert isinstance(channel.close_exc, rabbitry.NotFound)
    await assert_channel_usable(conn, names)


async def test_publish_to_missing_exchange_closes_the_channel(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    await channel.basic_publish(names.exchange("missing"), "rk", b"lost")
    async with asyncio.timeout(WAIT):
        exc = await channel.wait_closed()
    assert isinstance(exc, rabbitry.NotFound)
    assert exc.reply_code == 404
    assert channel.close_exc is exc
    # Publishing on it now is refused locally, and says why the channel closed.
    with pytest.raises(rabbitry.InvalidStateError) as info:
        await channel.basic_publish("", "q", b"too late")
    assert info.value.__cause__ is exc
    await assert_channel_usable(conn, names)


async def test_confirmed_publish_to_missing_exchange_is_refused(
    conn: AsyncConnection, names: Names
) -> None:
    ch = await conn.channel()
    await ch.confirm_select()
    future = await ch.basic_publish(names.exchange("missing"), "rk", b"lost")
    assert future is not None
    with pytest.raises(rabbitry.PublishRefused) as info:
        async with asyncio.timeout(WAIT):
            await future
    assert info.value.delivery_tag == 1
    assert isinstance(info.value.__cause__, rabbitry.NotFound)
    await assert_channel_usable(conn, names)


async def test_passive_declare_of_missing_queue_is_not_found(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    with pytest.raises(rabbitry.NotFound) as info:
        await channel.queue_declare(names.queue("missing"), passive=True)
    assert (info.value.reply_code, info.value.class_id, info.value.method_id) == (404, 50, 10)
    assert channel.is_closed
    await assert_channel_usable(conn, names)


async def test_exclusive_queue_of_another_connection_is_locked(
    url: str, conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    owner_channel = await conn.channel()
    await owner_channel.queue_declare(queue, exclusive=True)
    async with AsyncConnection(url) as other:
        ch = await other.channel()
        with pytest.raises(rabbitry.ResourceLocked) as info:
            await ch.queue_declare(queue, passive=True)
        assert info.value.reply_code == 405
        ch = await other.channel()
        with pytest.raises(rabbitry.ResourceLocked):
            await ch.basic_consume(queue, lambda message: None)
        assert other.is_open
    # The owner is unaffected.
    assert (await owner_channel.queue_declare(queue, passive=True)).queue == queue


async def test_unknown_delivery_tag_ends_the_consume_iterator(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    await channel.basic_publish("", queue, b"one")
    with pytest.raises(rabbitry.PreconditionFailed) as info:
        async with asyncio.timeout(WAIT):
            async for message in channel.consume(queue):
                channel.basic_ack(message.delivery_tag + 1000)  # never delivered
    assert info.value.reply_code == 406
    assert (info.value.class_id, info.value.method_id) == (60, 80)  # basic.ack
    assert channel.is_closed
    await assert_channel_usable(conn, names)


async def test_deleted_queue_cancels_its_consumers(
    conn: AsyncConnection, channel: AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    cancelled: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    tag = await channel.basic_consume(queue, lambda message: None, on_cancel=cancelled.set_result)
    iterator = channel.consume(queue)
    waiting = asyncio.ensure_future(anext(iterator))
    await asyncio.sleep(0.1)  # both consumers registered

    other = await conn.channel()
    await other.queue_delete(queue)
    async with asyncio.timeout(WAIT):
        assert await cancelled == tag
        with pytest.raises(rabbitry.ConsumerCancelled) as info:
            await waiting
    assert info.value.consumer_tag != tag
    await iterator.aclose()
    # A broker-side cancel leaves the channel open.
    assert channel.is_open
    await assert_channel_usable(conn, names)


async def test_publish_on_channel_closed_by_client(channel: AsyncChannel) -> None:
    await channel.close()
    assert channel.is_closed
    assert isinstance(channel.close_exc, rabbitry.ChannelClosedByClient)
    assert channel.close_exc.reply_code == 200
    with pytest.raises(rabbitry.InvalidStateError):
        await channel.basic_publish("", "anything", b"body")
    with pytest.raises(rabbitry.InvalidStateError):
        channel.basic_ack(1)
    await channel.close()  # idempotent


async def test_local_protocol_error_sends_nothing(url: str, names: Names) -> None:
    host, port = parse_urls(url)[0].host, parse_urls(url)[0].port
    with TcpProxy(host, port) as proxy:
        # heartbeat 60 s: no heartbeat frame can pass during this test's fraction of a
        # second and spoil the byte count.
        async with AsyncConnection(proxy.url(), heartbeat=60) as conn:
            ch = await conn.channel()
            await ch.queue_declare(names.queue())  # some traffic first
            await asyncio.sleep(0.1)
            before = proxy.bytes_upstream

            with pytest.raises(rabbitry.LocalProtocolError) as info:
                await ch.queue_declare("q" * 300)
            assert isinstance(info.value, ValueError)
            assert "queue.declare.queue" in str(info.value)
            with pytest.raises(rabbitry.LocalProtocolError):
                await ch.basic_publish("", "r" * 300, b"body")
            with pytest.raises(rabbitry.LocalProtocolError):
                await ch.basic_publish(
                    "", "q", b"body", properties=Properties(headers={"bad": object()})
                )
            await asyncio.sleep(0.2)
            assert proxy.bytes_upstream == before, "a refused request reached the wire"

            # Neither the channel nor the connection noticed.
            assert ch.is_open
            assert conn.is_open
            queue = names.queue()
            assert (await ch.queue_declare(queue)).queue == queue


async def test_content_header_larger_than_frame_max_is_refused_locally(
    url: str, names: Names
) -> None:
    """Regression: the header frame used to be sent and the broker closed the whole
    connection with 501 FRAME_ERROR. A content header cannot be split (§4.2.6)."""
    async with AsyncConnection(url, frame_max=4096) as conn:
        ch = await conn.channel()
        queue = names.queue()
        await ch.queue_declare(queue)
        with pytest.raises(rabbitry.LocalProtocolError):
            await ch.basic_publish(
                "", queue, b"body", properties=Properties(headers={"big": "y" * 5000})
            )
        # Had it been sent, the broker's FRAME_ERROR would arrive by this round trip.
        await ch.queue_declare(queue, passive=True)
        assert conn.is_open


def _headers_for_header_frame(size: int) -> dict[str, str]:
    """Headers that make the content header frame exactly ``size`` bytes long."""
    # frame head 7 + class/weight/body-size 12 + properties + frame end 1
    base = len(Properties(headers={"big": ""}).encode()) + 20
    return {"big": "y" * (size - base)}


async def test_content_header_of_exactly_frame_max_is_sent(url: str, names: Names) -> None:
    """The limit is inclusive: a header frame of exactly frame_max bytes is legal."""
    async with AsyncConnection(url, frame_max=4096) as conn:
        ch = await conn.channel()
        await ch.confirm_select()
        queue = names.queue()
        await ch.queue_declare(queue)
        headers = _headers_for_header_frame(4096)
        with pytest.raises(rabbitry.LocalProtocolError):
            await ch.basic_publish(
                "", queue, b"", properties=Properties(headers=_headers_for_header_frame(4097))
            )
        future = await ch.basic_publish("", queue, b"fits", properties=Properties(headers=headers))
        assert future is not None
        async with asyncio.timeout(WAIT):
            await future
        message = await ch.basic_get(queue, no_ack=True)
        assert message is not None
        assert (message.body, message.headers) == (b"fits", headers)
        assert conn.is_open


async def test_method_frame_larger_than_frame_max_is_refused_locally(
    url: str, names: Names
) -> None:
    """Regression: such a frame used to be sent; the broker closed the connection
    with 501 FRAME_ERROR (frame_too_large)."""
    async with AsyncConnection(url, frame_max=4096) as conn:
        ch = await conn.channel()
        exchange = names.exchange()
        with pytest.raises(rabbitry.LocalProtocolError):
            async with asyncio.timeout(WAIT):
                await ch.exchange_declare(exchange, "direct", arguments={"x-big": "y" * 5000})
        assert conn.is_open


async def test_rpc_timeout_and_the_late_reply(url: str, names: Names) -> None:
    """A timed-out request raises Timeout; its late reply is dropped, not given to the
    next request."""
    params = parse_urls(url)[0]
    with TcpProxy(params.host, params.port) as proxy:
        async with AsyncConnection(
            proxy.url(user=params.username, password=params.password)
        ) as conn:
            ch = await conn.channel()
            first, second = names.queue("first"), names.queue("second")
            proxy.latency(0.5)
            with pytest.raises(rabbitry.Timeout, match=r"queue\.declare"):
                await ch.queue_declare(first, timeout=0.1)
            proxy.latency(0)
            async with asyncio.timeout(WAIT):
                ok = await ch.queue_declare(second)
            assert ok.queue == second
            assert (await ch.queue_declare(first, passive=True)).queue == first
            assert ch.is_open


def _close_connection_named(url: str, name: str, reason: str) -> None:
    """Force-close (as an operator would) the one broker connection called ``name``."""
    listing = rabbitmqctl(url, "list_connections", "-q", "pid", "client_properties")
    pids = [line.split("\t", 1)[0] for line in listing.splitlines() if f'"{name}"' in line]
    assert len(pids) == 1, f"connection {name!r} is listed {len(pids)} times:\n{listing}"
    rabbitmqctl(url, "close_connection", pids[0], reason)


async def test_connection_closed_by_the_broker(url: str, names: Names) -> None:
    """connection.close from the broker: ConnectionForced (320) reaches everyone."""
    name = names.queue("conn")  # just a unique string; no queue is declared
    async with AsyncConnection(url, connection_name=name, recovery=None) as conn:
        ended: list[rabbitry.AMQPError] = []
        conn.add_close_callback(ended.append)
        ch = await conn.channel()
        await asyncio.to_thread(_close_connection_named, url, name, "closed by the test")
        async with asyncio.timeout(WAIT):
            exc = await conn.wait_closed()
        assert isinstance(exc, rabbitry.ConnectionForced)
        assert isinstance(exc, rabbitry.ConnectionClosedByBroker)
        assert exc.reply_code == 320
        assert "closed by the test" in exc.reply_text
        assert conn.close_exc is exc
        assert ended == [exc]
        assert ch.is_closed
        assert ch.close_exc is exc
        with pytest.raises(rabbitry.InvalidStateError):
            await ch.basic_publish("", "q", b"body")


# --------------------------------------------------------------------------- connecting


async def test_wrong_password_is_authentication_error(url: str) -> None:
    """Regression: AuthenticationError is an OSError (via ConnectionError) and used to be
    wrapped in ConnectError by the per-address ``except OSError``."""
    params = parse_urls(url)[0]
    bad = f"amqp://{params.username}:not-the-password@{params.host}:{params.port}/"
    conn = AsyncConnection(bad, connection_timeout=WAIT)
    with pytest.raises(rabbitry.AuthenticationError) as info:
        async with asyncio.timeout(WAIT):
            await conn.connect()
    assert "not-the-password" not in str(info.value)
    assert not conn.is_open
    # Credentials are not retried against the next address: the error is not wrapped.
    assert not isinstance(info.value, rabbitry.ConnectError)


def _chain(exc: BaseException | None) -> list[BaseException]:
    """``exc``, its ``__cause__``, that one's cause...; plus ConnectError.errors."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        if isinstance(exc, rabbitry.ConnectError):
            for _, inner in exc.errors:
                seen.extend(_chain(inner))
        exc = exc.__cause__
    return seen


async def test_wrong_password_fails_fast_with_the_brokers_reason(url: str) -> None:
    """The refusal is quick, keeps the broker's 403 as its cause, hides the password."""
    params = parse_urls(url)[0]
    bad = f"amqp://{params.username}:not-the-password@{params.host}:{params.port}/"
    conn = AsyncConnection(bad, connection_timeout=WAIT)
    with pytest.raises(rabbitry.AMQPConnectionError) as info:
        async with asyncio.timeout(WAIT):
            await conn.connect()
    chain = _chain(info.value)
    assert any(isinstance(e, rabbitry.AuthenticationError) for e in chain), chain
    refused = [e for e in chain if isinstance(e, rabbitry.ConnectionClosed)]
    assert refused and refused[0].reply_code == 403
    assert all("not-the-password" not in str(e) for e in chain)
    assert not conn.is_open


async def test_wrong_password_is_not_retried_on_the_next_address(url: str) -> None:
    """Regression: the wrapped refusal used to make connect() try the next address."""
    params = parse_urls(url)[0]
    bad = f"amqp://{params.username}:not-the-password@{params.host}:{params.port}/"
    conn = AsyncConnection([bad, url], connection_timeout=WAIT)
    try:
        with pytest.raises(rabbitry.AuthenticationError):
            async with asyncio.timeout(WAIT):
                await conn.connect()
    finally:
        await conn.close()


async def test_nothing_listening_is_connect_error() -> None:
    port = dead_port()
    conn = AsyncConnection(dead_url(port), connection_timeout=WAIT)
    with pytest.raises(rabbitry.ConnectError) as info:
        async with asyncio.timeout(WAIT):
            await conn.connect()
    address = f"127.0.0.1:{port}"
    assert address in str(info.value)
    assert [addr for addr, _ in info.value.errors] == [address]
    assert isinstance(info.value, ConnectionError)
    assert not conn.is_open


async def test_all_addresses_dead_lists_each(url: str) -> None:
    ports = [dead_port(), dead_port()]
    conn = AsyncConnection([dead_url(p) for p in ports], connection_timeout=WAIT)
    with pytest.raises(rabbitry.ConnectError) as info:
        async with asyncio.timeout(WAIT):
            await conn.connect()
    assert [addr for addr, _ in info.value.errors] == [f"127.0.0.1:{p}" for p in ports]
    for port in ports:
        assert f"127.0.0.1:{port}" in str(info.value)


async def test_falls_over_to_the_next_url(url: str, names: Names) -> None:
    good = parse_urls(url)[0]
    async with AsyncConnection([dead_url(dead_port()), url], connection_timeout=WAIT) as conn:
        assert conn.is_open
        assert (conn.params.host, conn.params.port) == (good.host, good.port)
        ch = await conn.channel()
        queue = names.queue()
        assert (await ch.queue_declare(queue)).queue == queue


async def test_url_none_reads_rabbitmq_url(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    port = dead_port()
    monkeypatch.setenv("RABBITMQ_URL", dead_url(port))
    with pytest.raises(rabbitry.ConnectError, match=re.escape(f"127.0.0.1:{port}")):
        async with asyncio.timeout(WAIT):
            await AsyncConnection(connection_timeout=WAIT).connect()

    # The variable's options are used too, which tells it apart from the built-in default.
    monkeypatch.setenv("RABBITMQ_URL", with_query(url, heartbeat=7))
    async with AsyncConnection() as conn:
        assert conn.is_open
        assert conn.heartbeat == 7


# --------------------------------------------------------------------------- closing


async def test_close_twice_is_fine(url: str) -> None:
    conn = AsyncConnection(url)
    await conn.close()  # never opened: nothing to do
    await conn.connect()
    ch = await conn.channel()
    await conn.close()
    await conn.close()
    assert conn.is_closed
    assert not conn.is_open
    assert isinstance(conn.close_exc, rabbitry.ConnectionClosedByClient)
    assert conn.close_exc.reply_code == 200
    assert ch.is_closed
    assert isinstance(await conn.wait_closed(), rabbitry.ConnectionClosedByClient)
    with pytest.raises(rabbitry.InvalidStateError):
        await conn.channel()
    with pytest.raises(rabbitry.InvalidStateError):
        await ch.basic_publish("", "q", b"body")
    with pytest.raises(rabbitry.InvalidStateError):
        await conn.connect()


async def test_async_with_closes(url: str) -> None:
    closed: list[rabbitry.AMQPError] = []
    async with AsyncConnection(url) as conn:
        conn.add_close_callback(closed.append)
        async with await conn.channel() as ch:
            assert ch.is_open
        assert ch.is_closed
        assert isinstance(ch.close_exc, rabbitry.ChannelClosedByClient)
        other = await conn.channel()
        assert conn.is_open
    assert conn.is_closed
    assert other.is_closed
    assert isinstance(conn.close_exc, rabbitry.ConnectionClosedByClient)
    assert closed == [conn.close_exc]


async def test_async_with_closes_on_error(url: str) -> None:
    conn = AsyncConnection(url)
    with pytest.raises(ZeroDivisionError):
        async with conn:
            await conn.channel()
            1 / 0  # noqa: B018
    assert conn.is_closed


async def test_connect_timeout_is_bounded() -> None:
    """A listener that accepts but never speaks AMQP: connect gives up in time."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        conn = AsyncConnection(dead_url(port), connection_timeout=0.5)
        with pytest.raises(rabbitry.ConnectError) as info:
            async with asyncio.timeout(WAIT):
                await conn.connect()
        ((address, cause),) = info.value.errors
        assert address == f"127.0.0.1:{port}"
        assert isinstance(cause, rabbitry.Timeout)

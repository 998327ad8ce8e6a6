"""Request/reply over direct reply-to (``rabbitry.rpc`` and ``rabbitry.sync.rpc``).

Both twins against the broker: replies matched by correlation id across concurrent
calls, the typed timeout, an unroutable request, the rule for failing handlers and
for requests without ``reply_to``, and a connection reset in the middle of a call
(through :class:`~tests.support.proxy.TcpProxy`): the waiting call fails with the
reason, and the same client works once the connection has recovered.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

import pytest
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import (
    AsyncConnection,
    Connection,
    Message,
    Properties,
    RecoveryPolicy,
    RpcInterrupted,
    RpcRemoteError,
    RpcTimeout,
    RpcUnroutable,
    State,
)
from rabbitry.config import parse_urls
from rabbitry.rpc import ERROR_HEADER

if TYPE_CHECKING:
    from tests.integration.conftest import Names

DEADLINE = 60.0
FAST = RecoveryPolicy(initial_delay=0.1, max_delay=0.5)


async def _echo(request: Message) -> bytes:
    return b"echo:" + request.body


async def test_call_gets_the_reply_of_its_own_request(conn: AsyncConnection, names: Names) -> None:
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)
    async with conn.rpc_server(queue, _echo, concurrency=4):
        watchers = len(conn._state_callbacks)
        client = await conn.rpc_client()
        replies = await asyncio.gather(
            *(client.call(queue, f"n{i}".encode(), timeout=DEADLINE) for i in range(20))
        )
        assert [r.body for r in replies] == [f"echo:n{i}".encode() for i in range(20)]
        with pytest.raises(rabbitry.InvalidStateError):
            replies[0].ack()  # replies come without acks: nothing to settle
        assert (await client.call(queue, b"still", timeout=DEADLINE)).body == b"echo:still"
        assert client.pending == 0
        await client.close()
        assert len(conn._state_callbacks) == watchers  # a closed client leaves nothing behind


async def test_a_call_without_a_reply_raises_rpc_timeout_naming_key_and_timeout(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()  # declared, but nobody serves it
    await (await conn.channel()).queue_declare(queue)
    async with await conn.rpc_client() as client:
        with pytest.raises(RpcTimeout, match=rf"{queue}.*0\.3 s") as caught:
            await client.call(queue, b"x", timeout=0.3)
    assert isinstance(caught.value, rabbitry.Timeout)
    assert caught.value.routing_key == queue and caught.value.timeout == 0.3


async def test_an_unroutable_request_fails_at_once(conn: AsyncConnection, names: Names) -> None:
    async with await conn.rpc_client() as client:
        with pytest.raises(RpcUnroutable, match="NO_ROUTE"):
            await client.call(names.queue("nobody"), b"x", timeout=DEADLINE)


async def test_a_failing_handler_is_logged_and_answered_with_its_error(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)

    async def fail(request: Message) -> bytes:
        raise ValueError("bad request " + request.body.decode())

    with caplog.at_level(logging.ERROR, logger="rabbitry.rpc"):
        async with conn.rpc_server(queue, fail) as server:
            async with await conn.rpc_client() as client:
                with pytest.raises(RpcRemoteError, match="ValueError: bad request 7") as caught:
                    await client.call(queue, b"7", timeout=DEADLINE)
            await server.stop()
    assert caught.value.error == "ValueError: bad request 7"
    assert any(r.exc_info and "handler failed" in r.getMessage() for r in caplog.records)
    # Answered, so acked: nothing is left on the queue to fail again.
    assert (await (await conn.channel()).queue_declare(queue, passive=True)).message_count == 0


async def test_a_request_without_reply_to_is_logged_and_dead_lettered(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue, dead = names.queue(), names.queue("dead")
    channel = await conn.channel()
    await channel.queue_declare(dead)
    await channel.queue_declare(
        queue,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead},
    )
    called = asyncio.Event()

    async def handler(request: Message) -> bytes:
        called.set()
        return b""

    with caplog.at_level(logging.ERROR, logger="rabbitry.rpc"):
        async with conn.rpc_server(queue, handler):
            await channel.basic_publish("", queue, b"no reply_to")
            for _ in range(int(DEADLINE / 0.05)):
                if (await channel.queue_declare(dead, passive=True)).message_count:
                    break
                await asyncio.sleep(0.05)
    assert (await channel.queue_declare(dead, passive=True)).message_count == 1
    assert not called.is_set()
    assert any("without reply_to" in r.getMessage() for r in caplog.records)


async def test_a_reset_fails_the_waiting_call_with_the_reason_and_the_client_recovers(
    url: str, conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)
    release = asyncio.Event()

    async def slow(request: Message) -> bytes:
        if request.body == b"hold":
            await release.wait()
        return b"ok:" + request.body

    params = parse_urls(url)[0]
    async with conn.rpc_server(queue, slow, concurrency=2):
        with TcpProxy(params.host, params.port) as proxy:
            client_conn = AsyncConnection(proxy.url(), recovery=FAST)
            await client_conn.connect()
            try:
                client = await client_conn.rpc_client()
                assert (await client.call(queue, b"before", timeout=DEADLINE)).body == b"ok:before"
                held = asyncio.ensure_future(client.call(queue, b"hold", timeout=DEADLINE))
                for _ in range(int(DEADLINE / 0.05)):
                    if client.pending:
                        break
                    await asyncio.sleep(0.05)
                proxy.reset()
                with pytest.raises(RpcInterrupted) as caught:
                    await held
                assert isinstance(caught.value.reason, rabbitry.AMQPConnectionError)
                assert caught.value.routing_key == queue
                release.set()
                await client_conn.wait_recovered(timeout=DEADLINE)
                after = await client.call(queue, b"after", timeout=DEADLINE)
                assert after.body == b"ok:after"
                await client.close()
            finally:
                await client_conn.close()


async def test_a_late_reply_is_dropped_with_an_error_log(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)
    replied = asyncio.Event()

    async def late(request: Message) -> bytes:
        await asyncio.sleep(0.5)
        replied.set()
        return b"late"

    with caplog.at_level(logging.ERROR, logger="rabbitry.rpc"):
        async with conn.rpc_server(queue, late):
            async with await conn.rpc_client() as client:
                with pytest.raises(RpcTimeout):
                    await client.call(queue, b"x", timeout=0.1)
                await asyncio.wait_for(replied.wait(), DEADLINE)
                for _ in range(int(DEADLINE / 0.05)):
                    if any("matches no waiting call" in r.getMessage() for r in caplog.records):
                        break
                    await asyncio.sleep(0.05)
    assert any("matches no waiting call" in r.getMessage() for r in caplog.records)


async def test_the_request_carries_properties_and_the_reply_its_correlation_id(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)
    seen: list[Properties] = []

    async def record(request: Message) -> str:
        seen.append(request.properties)
        return "é"

    async with conn.rpc_server(queue, record), await conn.rpc_client() as client:
        reply = await client.call(
            queue, "q", headers={"k": "v"}, content_type="text/plain", timeout=DEADLINE
        )
    assert reply.body == "é".encode()
    (props,) = seen
    assert props.headers == {"k": "v"} and props.content_type == "text/plain"
    assert props.reply_to and props.reply_to.startswith("amq.rabbitmq.reply-to")
    assert reply.properties.correlation_id == props.correlation_id
    assert ERROR_HEADER not in (reply.properties.headers or {})


# ---------------------------------------------------------------------- sync twins


def test_sync_client_and_server_round_trip_from_several_threads(url: str, names: Names) -> None:
    queue = names.queue()
    with Connection(url) as conn:
        conn.channel().queue_declare(queue)

        def handle(request: Message) -> bytes:
            if request.body == b"fail":
                raise KeyError("nope")
            return request.body.upper()

        with conn.rpc_server(queue, handle, concurrency=2), conn.rpc_client() as client:
            results: dict[int, bytes] = {}

            def worker(i: int) -> None:
                results[i] = client.call(queue, f"t{i}".encode(), timeout=DEADLINE).body

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(5)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(DEADLINE)
            assert results == {i: f"T{i}".encode() for i in range(5)}
            with pytest.raises(RpcRemoteError, match="KeyError"):
                client.call(queue, b"fail", timeout=DEADLINE)
            unserved = names.queue("unserved")
            conn.channel().queue_declare(unserved)
            with pytest.raises(RpcTimeout, match=r"0\.2 s"):
                client.call(unserved, b"x", timeout=0.2)


def test_sync_client_recovers_after_a_reset(url: str, names: Names) -> None:
    queue = names.queue()
    params = parse_urls(url)[0]
    with Connection(url) as server_conn:
        server_conn.channel().queue_declare(queue)
        with server_conn.rpc_server(queue, lambda request: b"pong"):
            with TcpProxy(params.host, params.port) as proxy:
                with Connection(proxy.url(), recovery=FAST) as conn:
                    client = conn.rpc_client()
                    assert client.call(queue, timeout=DEADLINE).body == b"pong"
                    recovered = threading.Event()
                    conn.on_state_change(
                        lambda state, cause: state is State.OPEN and recovered.set()
                    )
                    proxy.reset()
                    assert recovered.wait(DEADLINE)  # dropped, then recovered
                    assert client.call(queue, timeout=DEADLINE).body == b"pong"
                    client.close()


async def test_a_reply_that_cannot_be_sent_is_logged_and_the_caller_times_out(
    url: str, conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)
    params = parse_urls(url)[0]
    with TcpProxy(params.host, params.port) as proxy:
        server_conn = AsyncConnection(proxy.url(), recovery=None)
        await server_conn.connect()

        async def cut_then_answer(request: Message) -> bytes:
            proxy.reset()  # the server's connection dies before it can reply
            await server_conn.wait_closed(timeout=DEADLINE)
            return b"too late"

        try:
            with caplog.at_level(logging.ERROR, logger="rabbitry.rpc"):
                server = server_conn.rpc_server(queue, cut_then_answer)
                await server.start()
                async with await conn.rpc_client() as client:
                    with pytest.raises(RpcTimeout):
                        await client.call(queue, b"x", timeout=3)
                for _ in range(int(DEADLINE / 0.05)):
                    if any("could not be sent" in r.getMessage() for r in caplog.records):
                        break
                    await asyncio.sleep(0.05)
        finally:
            await server_conn.close()
    assert any("could not be sent" in r.getMessage() for r in caplog.records)


async def test_a_missing_exchange_fails_the_call_and_the_next_call_works(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)
    async with conn.rpc_server(queue, _echo), await conn.rpc_client() as client:
        with pytest.raises(RpcInterrupted) as caught:
            await client.call("x", b"1", exchange=names.exchange("missing"), timeout=DEADLINE)
        assert isinstance(caught.value.reason, rabbitry.NotFound)  # the broker's 404
        # The broker closed the client's channel; the next call opens another.
        assert (await client.call(queue, b"2", timeout=DEADLINE)).body == b"echo:2"


async def test_a_handler_failing_on_every_request_is_logged_rate_limited_with_counts(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)

    async def fail(request: Message) -> bytes:
        raise ValueError("always")

    with caplog.at_level(logging.ERROR, logger="rabbitry.rpc"):
        server = conn.rpc_server(queue, fail)
        await server.start()
        async with await conn.rpc_client() as client:
            for i in range(20):
                with pytest.raises(RpcRemoteError):
                    await client.call(queue, b"%d" % i, timeout=DEADLINE)
        during = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        await server.stop()  # logs the summary of what was only counted
    assert len(during) == 6  # five with their traceback, then the notice
    assert sum("handler failed" in m for m in during) == 5
    assert caplog.records[-1].getMessage() == (
        f"RPC server on {queue!r}: 15 more failed requests (without traceback): "
        "15 answered with the handler's error"
    )

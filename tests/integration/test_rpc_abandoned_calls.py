"""Calls given up on: their requests expire with them, their late replies are counted.

A call that times out with no server leaves nothing for a server started later to run
(the request carries a per-message TTL from the call's timeout); replies that come after
their call was given up on are counted in ``client.late_replies`` and logged at ERROR a
bounded number of times, with the count.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING

import pytest

from rabbitry import AsyncChannel, AsyncConnection, Connection, Message, Properties, RpcTimeout

if TYPE_CHECKING:
    from tests.integration.conftest import Names

DEADLINE = 60.0
pytestmark = pytest.mark.timeout(120)


async def _wait_empty(channel: AsyncChannel, queue: str) -> None:
    """Until the broker reports ``queue`` empty (the expired requests dropped)."""
    for _ in range(int(DEADLINE / 0.05)):
        if (await channel.queue_declare(queue, passive=True)).message_count == 0:
            return
        await asyncio.sleep(0.05)
    count = (await channel.queue_declare(queue, passive=True)).message_count
    raise AssertionError(f"{count} requests of timed-out calls still queued after {DEADLINE} s")


async def test_requests_of_timed_out_calls_are_not_run_by_a_server_started_later(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    async with await conn.rpc_client() as client:
        outcomes = await asyncio.gather(
            *(client.call(queue, b"abandoned %d" % i, timeout=0.5) for i in range(200)),
            return_exceptions=True,
        )
        assert all(isinstance(o, RpcTimeout) for o in outcomes)
        await _wait_empty(channel, queue)
        executed: list[bytes] = []

        async def handler(request: Message) -> bytes:
            executed.append(request.body)
            return b"done"

        async with conn.rpc_server(queue, handler):
            assert (await client.call(queue, b"fresh", timeout=DEADLINE)).body == b"done"
        assert executed == [b"fresh"]  # none of the 200 abandoned requests ran
        assert client.late_replies == 0


async def test_the_request_ttl_is_the_time_left_unless_the_caller_set_a_shorter_one(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)

    async def expiration(request: Message) -> str:
        return request.properties.expiration or "none"

    async with conn.rpc_server(queue, expiration), await conn.rpc_client() as client:
        assert 1 <= int((await client.call(queue, timeout=5)).body) <= 5000
        shorter = await client.call(queue, timeout=30, properties=Properties(expiration="20000"))
        assert shorter.body == b"20000"
        longer = await client.call(queue, timeout=5, properties=Properties(expiration="600000"))
        assert 1 <= int(longer.body) <= 5000
        assert (await client.call(queue, timeout=None)).body == b"none"


async def test_late_replies_are_counted_and_logged_a_bounded_number_of_times(
    conn: AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)
    calls = 40
    release = asyncio.Event()
    entered = 0

    async def slow(request: Message) -> bytes:
        nonlocal entered
        entered += 1
        await release.wait()
        return b"late"

    def late_records() -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.name == "rabbitry.rpc" and r.levelno == logging.ERROR and "late" in r.getMessage()
        ]

    with caplog.at_level(logging.ERROR, logger="rabbitry.rpc"):
        async with conn.rpc_server(queue, slow, prefetch=calls, concurrency=calls):
            client = await conn.rpc_client()
            tasks = [
                asyncio.ensure_future(client.call(queue, b"%d" % i, timeout=DEADLINE))
                for i in range(calls)
            ]
            for _ in range(int(DEADLINE / 0.05)):
                if entered == calls:
                    break
                await asyncio.sleep(0.05)
            assert entered == calls
            for task in tasks:  # the callers give up (e.g. their own deadline passed)
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            release.set()
            for _ in range(int(DEADLINE / 0.05)):
                if client.late_replies == calls:
                    break
                await asyncio.sleep(0.05)
            assert client.late_replies == calls
            during = late_records()
            await client.close()  # logs the summary of what was only counted
    records = late_records()
    # 5 in full (each with the running count), one notice, one summary: not one per reply.
    assert len(during) == 6 and len(records) == 7
    assert "(5 late replies so far" in records[4].getMessage()
    assert records[-1].getMessage() == (
        f"RPC client: {calls - 5} more late replies (dropped without a record each): "
        f"{calls - 5} dropped"
    )


def test_sync_calls_that_timed_out_leave_nothing_for_a_later_server(url: str, names: Names) -> None:
    queue = names.queue()
    with Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        with conn.rpc_client(timeout=0.3) as client:
            errors: list[BaseException] = []

            def caller() -> None:
                for i in range(5):
                    try:
                        client.call(queue, b"%d" % i)
                    except RpcTimeout as exc:
                        errors.append(exc)

            threads = [threading.Thread(target=caller) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(DEADLINE)
            assert len(errors) == 20
            deadline = time.monotonic() + DEADLINE
            while channel.queue_declare(queue, passive=True).message_count:
                assert time.monotonic() < deadline, "requests of timed-out calls still queued"
                time.sleep(0.05)
            executed: list[bytes] = []

            def handler(request: Message) -> bytes:
                executed.append(request.body)
                return b"done"

            with conn.rpc_server(queue, handler):
                assert client.call(queue, b"fresh", timeout=DEADLINE).body == b"done"
            assert executed == [b"fresh"]
            assert client.late_replies == 0

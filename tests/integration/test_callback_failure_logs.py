"""A callback that raises on every message costs a bounded number of ERROR records,
and the rest are counted in a summary line (``rabbitry._support.failure_log.RateLimitedLog``)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

import pytest

import rabbitry

if TYPE_CHECKING:
    from tests.integration.conftest import Names

DEADLINE = 60.0
MESSAGES = 40
pytestmark = pytest.mark.timeout(120)


def _records(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.ERROR and text in r.getMessage()]


@pytest.mark.parametrize("kind", ["plain", "coroutine"])
async def test_a_channel_consumer_callback_failing_on_every_message_is_logged_rate_limited(
    conn: rabbitry.AsyncConnection,
    names: Names,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    for i in range(MESSAGES):
        await channel.basic_publish("", queue, b"%d" % i)
    seen = 0

    def plain(message: rabbitry.Message) -> None:
        nonlocal seen
        seen += 1
        raise ValueError(f"bad message {message.body!r}")

    async def coroutine(message: rabbitry.Message) -> None:
        plain(message)

    with caplog.at_level(logging.ERROR, logger="rabbitry.channel"):
        tag = await channel.basic_consume(
            queue, plain if kind == "plain" else coroutine, no_ack=True
        )
        for _ in range(int(DEADLINE / 0.05)):
            if seen == MESSAGES:
                break
            await asyncio.sleep(0.05)
        assert seen == MESSAGES
        await asyncio.sleep(0)  # the coroutine worker logs the last failure
        full = _records(caplog, "consumer callback")
        await channel.basic_cancel(tag)  # logs the summary of what was only counted
    assert len(full) == 11  # ten with their traceback, then the notice
    assert all(r.exc_info is not None for r in full[:10])
    (summary,) = _records(caplog, "more callback failures")
    assert summary.getMessage().endswith(
        f"{MESSAGES - 10} more callback failures (without traceback): {MESSAGES - 10} raised"
    )


def test_a_sync_consumer_callback_failing_on_every_message_is_logged_rate_limited(
    url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue()
    done = threading.Event()
    seen = 0

    def callback(message: rabbitry.Message) -> None:
        nonlocal seen
        seen += 1
        if seen == MESSAGES:
            done.set()
        raise ValueError(f"bad message {message.body!r}")

    with caplog.at_level(logging.ERROR, logger="rabbitry"):
        with rabbitry.Connection(url) as conn:
            channel = conn.channel()
            channel.queue_declare(queue)
            for i in range(MESSAGES):
                channel.basic_publish("", queue, b"%d" % i)
            channel.basic_consume(queue, callback, no_ack=True)
            assert done.wait(DEADLINE)
        # The connection's close stops the callback thread, which logs the summary.
    full = _records(caplog, "callback <function")
    assert len(full) == 10 and all(r.exc_info is not None for r in full)
    assert len(_records(caplog, "callback failures within 60 s")) == 1
    (summary,) = _records(caplog, "more callback failures")
    assert summary.getMessage().endswith(
        f"{MESSAGES - 10} more callback failures (without traceback): {MESSAGES - 10} raised"
    )


async def test_a_return_callback_failing_on_every_return_is_logged_rate_limited(
    conn: rabbitry.AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    channel = await conn.channel()
    await channel.confirm_select()
    returned = 0

    def on_return(message: rabbitry.Message) -> None:
        nonlocal returned
        returned += 1
        raise RuntimeError("cannot handle a return")

    channel.add_return_callback(on_return)
    with caplog.at_level(logging.ERROR, logger="rabbitry.channel"):
        confirms = [
            await channel.basic_publish("", names.queue("nobody"), b"x", mandatory=True)
            for _ in range(MESSAGES)
        ]
        await asyncio.gather(*(c for c in confirms if c is not None), return_exceptions=True)
    assert returned == MESSAGES  # a return comes before the publish's confirm
    full = _records(caplog, "return callback")
    assert len(full) == 11  # ten with their traceback, then the notice
    assert all(r.exc_info is not None for r in full[:10])

"""Refused is not unknown: publishes the broker refuses fail with ``PublishRefused``.

RabbitMQ refuses a publish by closing its channel (404 no such exchange, 403 internal
exchange, 406 too large or a foreign ``user_id``). The refused publish gets
:class:`PublishRefused`; publishes sent after it on the same channel were discarded
unprocessed (``PublishOutcomeUnknown`` with ``discarded``); those before it that still
lacked a confirm stay "unknown".
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

import rabbitry
from rabbitry import NackRetry, PublishOutcomeUnknown, PublishRefused
from rabbitry.exceptions import AccessRefused, LocalProtocolError, NotFound, PreconditionFailed
from rabbitry.protocol.spec import BasicProperties

if TYPE_CHECKING:
    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(120)


async def outcome(future: asyncio.Future[None] | None) -> BaseException | None:
    assert future is not None
    try:
        await asyncio.wait_for(future, 30)
    except Exception as exc:
        return exc
    return None


async def test_publish_to_a_missing_exchange_is_refused_and_later_ones_are_discarded(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    missing = names.exchange("missing")
    ch = await conn.channel()
    await ch.queue_declare(queue)
    await ch.confirm_select()
    before = [await ch.basic_publish("", queue, b"before-%d" % i) for i in range(20)]
    refused = await ch.basic_publish(missing, "k", b"refused")
    after = [await ch.basic_publish("", queue, b"after-%d" % i) for i in range(5)]
    error = await outcome(refused)
    assert isinstance(error, PublishRefused)
    assert error.reply_code == 404 and missing in error.reply_text
    assert error.delivery_tag == 21
    assert isinstance(error.__cause__, NotFound)
    for future in after:
        later = await outcome(future)
        assert isinstance(later, PublishOutcomeUnknown) and later.discarded
    for future in before:  # acked, or unknown (processed, confirm not sent in time)
        early = await outcome(future)
        assert early is None or (type(early) is PublishOutcomeUnknown and not early.discarded), (
            early
        )
    check = await conn.channel()
    ready = (await check.queue_declare(queue, passive=True)).message_count
    # Nothing sent after the refused publish reached the queue.
    got = [await check.basic_get(queue, no_ack=True) for _ in range(ready)]
    assert all(m is not None and m.body.startswith(b"before-") for m in got)


async def test_publish_to_an_internal_exchange_is_refused_with_403(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    internal = names.exchange("internal")
    ch = await conn.channel()
    await ch.exchange_declare(internal, "direct", internal=True)
    await ch.confirm_select()
    error = await outcome(await ch.basic_publish(internal, "k", b"x"))
    assert isinstance(error, PublishRefused) and error.reply_code == 403
    assert isinstance(error.__cause__, AccessRefused)


async def test_publish_above_the_broker_max_message_size_is_refused_with_406(
    url: str, names: Names
) -> None:
    queue = names.queue()
    # The client's own size check is off, so the broker's limit (128 MiB) is what answers.
    async with rabbitry.AsyncConnection(url, max_message_size=0) as conn:
        ch = await conn.channel()
        await ch.queue_declare(queue)
        await ch.confirm_select()
        small = await ch.basic_publish("", queue, b"small")
        big = await ch.basic_publish("", queue, b"x" * (129 * 1024 * 1024))
        early = await outcome(small)
        assert early is None or type(early) is PublishOutcomeUnknown
        error = await outcome(big)
        assert isinstance(error, PublishRefused) and error.reply_code == 406
        assert "message size" in error.reply_text
        assert isinstance(error.__cause__, PreconditionFailed)


def test_sync_channel_publish_with_a_foreign_user_id_is_refused(url: str, names: Names) -> None:
    queue = names.queue()
    with rabbitry.Connection(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        ch.confirm_select()
        future = ch.basic_publish("", queue, b"x", properties=BasicProperties(user_id="mallory"))
        assert future is not None
        error = future.exception(30)
        assert isinstance(error, PublishRefused) and error.reply_code == 406
        assert "user_id" in error.reply_text


async def test_delivery_mode_outside_1_and_2_is_refused_locally_before_sending(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    ch = await conn.channel()
    await ch.queue_declare(queue)
    await ch.confirm_select()
    with pytest.raises(LocalProtocolError, match=r"delivery_mode: must be 1 .* or 2 .*got 3"):
        await ch.basic_publish("", queue, b"x", properties=BasicProperties(delivery_mode=3))
    publisher = await conn.publisher()
    with pytest.raises(LocalProtocolError, match="delivery_mode"):
        await publisher.send(b"x", routing_key=queue, properties=BasicProperties(delivery_mode=0))
    # Nothing was sent: the channel is still open and usable.
    assert ch.is_open
    assert await outcome(await ch.basic_publish("", queue, b"ok")) is None


async def test_publisher_with_nack_retry_does_not_resend_a_refused_message(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    missing = names.exchange("missing")
    queue = names.queue()
    ch = await conn.channel()
    await ch.queue_declare(queue)
    publisher = await conn.publisher(nack_retry=NackRetry(max_attempts=5, initial_delay=0.01))
    future = await publisher.send(b"x", exchange=missing, routing_key="k")
    error = await outcome(future)
    assert isinstance(error, PublishRefused) and error.reply_code == 404
    assert publisher.nack_resends == 0
    # The publisher opens a new channel and goes on.
    assert await outcome(await publisher.send(b"ok", routing_key=queue)) is None
    assert (await ch.queue_declare(queue, passive=True)).message_count == 1

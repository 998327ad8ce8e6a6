"""A failed publish is never silent, whatever the user's habit (real broker).

* pika habit: ``with conn.publisher() as p: p.publish(...)`` without looking at the
  future: the ``with`` exit (and ``close()``) raises :class:`UnobservedPublishFailures`
  and logs the failures at ERROR.
* aio-pika habit: ``await publisher.publish(...)`` returns once the broker confirmed the
  message and raises on a return, a refusal or a nack; ``send`` is the pipelined call
  whose future nobody may forget either.
* The batching publishers' records nobody looked at are reported by the publisher's end.
* Done-callbacks of sync futures never run on the IO thread.
* ``properties`` may be a mapping of the property fields.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

import rabbitry
from rabbitry import observability
from rabbitry.batching_publisher import AsyncBatchingPublisher, BatchingPublisher
from rabbitry.exceptions import (
    LocalProtocolError,
    Nacked,
    NotFound,
    PublishRefused,
    UnobservedPublishFailures,
    Unroutable,
)
from rabbitry.publisher import OutgoingMessage
from rabbitry.publishing import unobserved

if TYPE_CHECKING:
    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(120)

WAIT = 30


@pytest.fixture(autouse=True)
def _fresh_log_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ERROR lines are rate-limited per process: each test starts a new interval."""
    monkeypatch.setattr(unobserved, "_LIMIT", unobserved._LogLimit())


def unobserved_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and "nobody looked at" in r.getMessage()
    ]


# --------------------------------------------------------------------------- sync (pika habit)


def test_with_block_raises_for_an_unroutable_publish_nobody_checked(
    url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    nowhere = names.queue("nowhere")
    with rabbitry.Connection(url) as conn:
        with pytest.raises(UnobservedPublishFailures) as caught:
            with conn.publisher(mandatory=True) as publisher:
                publisher.publish(b"x", routing_key=nowhere)
    assert caught.value.count == 1
    assert isinstance(caught.value.first, Unroutable)
    assert caught.value.failures == [caught.value.first]
    assert "Unroutable" in str(caught.value)
    (line,) = unobserved_errors(caplog)
    assert "1 failed publishes" in line and nowhere in line


def test_with_block_raises_for_publishes_to_a_missing_exchange(url: str, names: Names) -> None:
    missing = names.exchange("missing")
    queue = names.queue()
    with rabbitry.Connection(url) as conn:
        conn.channel().queue_declare(queue)
        with pytest.raises(UnobservedPublishFailures) as caught:
            with conn.publisher() as publisher:
                publisher.publish(b"lost", exchange=missing, routing_key="k")
                publisher.wait_for_confirms(timeout=WAIT)
                # The next one goes out on a fresh channel.
                publisher.publish(b"kept", routing_key=queue).result(WAIT)
    assert caught.value.count == 1
    first = caught.value.first
    assert isinstance(first, PublishRefused) and isinstance(first.__cause__, NotFound)


def test_close_raises_once_and_checked_failures_never_count(url: str, names: Names) -> None:
    nowhere = names.queue("nowhere")
    with rabbitry.Connection(url) as conn:
        publisher = conn.publisher(mandatory=True)
        checked = publisher.publish(b"a", routing_key=nowhere)
        with pytest.raises(Unroutable):
            checked.result(WAIT)
        outcomes: list[BaseException | None] = []
        done = threading.Event()

        def record(future: object) -> None:
            outcomes.append(future.exception())  # type: ignore[attr-defined]
            done.set()

        publisher.publish(b"b", routing_key=nowhere).add_done_callback(record)
        assert done.wait(WAIT) and isinstance(outcomes[0], Unroutable)
        forgotten = publisher.publish(b"c", routing_key=nowhere)
        with pytest.raises(UnobservedPublishFailures) as caught:
            publisher.close()
        assert caught.value.count == 1 and isinstance(forgotten.exception(0), Unroutable)
        publisher.close()  # reported once: a second close is quiet


def test_a_with_block_that_raises_keeps_its_exception_and_logs_the_failures(
    url: str, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    nowhere = names.queue("nowhere")
    with rabbitry.Connection(url) as conn:
        with pytest.raises(KeyError, match="the application's own error"):
            with conn.publisher(mandatory=True) as publisher:
                publisher.publish(b"x", routing_key=nowhere)
                publisher.wait_for_confirms(timeout=WAIT)
                raise KeyError("the application's own error")
    (line,) = unobserved_errors(caplog)
    assert "Unroutable" in line


def test_sync_batching_publisher_reports_records_nobody_looked_at(url: str, names: Names) -> None:
    missing = names.exchange("missing")
    with rabbitry.Connection(url) as conn:
        with pytest.raises(UnobservedPublishFailures) as caught:
            with conn.publisher() as publisher:
                with BatchingPublisher(publisher, linger=0.001) as batching:
                    for i in range(3):
                        batching.publish(b"%d" % i, exchange=missing, routing_key="k")
    # One envelope of three records, refused: each record's future failed unseen.
    assert caught.value.count == 3
    assert isinstance(caught.value.first, PublishRefused)


# --------------------------------------------------------------------------- asyncio


async def test_await_publish_returns_once_confirmed_and_raises_on_failure(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    limited = names.queue("limited")
    await channel.queue_declare(queue)
    await channel.queue_declare(
        limited, arguments={"x-max-length": 0, "x-overflow": "reject-publish"}
    )
    async with await conn.publisher() as publisher:
        assert await publisher.publish(b"hello", routing_key=queue) is None
        message = await channel.basic_get(queue, no_ack=True, timeout=WAIT)
        assert message is not None and message.body == b"hello"
        with pytest.raises(Unroutable):
            await publisher.publish(b"x", routing_key=names.queue("nowhere"), mandatory=True)
        with pytest.raises(Nacked):
            await publisher.publish(b"x", routing_key=limited)
        with pytest.raises(PublishRefused):
            await publisher.publish(b"x", exchange=names.exchange("missing"), routing_key="k")
        # The next publish opens a fresh channel and is confirmed.
        await publisher.publish(b"again", routing_key=queue)


async def test_async_with_raises_for_a_sent_future_nobody_awaited(
    conn: rabbitry.AsyncConnection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    nowhere = names.queue("nowhere")
    with pytest.raises(UnobservedPublishFailures) as caught:
        async with await conn.publisher(mandatory=True) as publisher:
            await publisher.send(b"x", routing_key=nowhere)
    assert caught.value.count == 1 and isinstance(caught.value.first, Unroutable)
    assert len(unobserved_errors(caplog)) == 1


async def test_close_raises_for_failures_nobody_awaited_but_not_for_awaited_ones(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    missing = names.exchange("missing")
    publisher = await conn.publisher()
    awaited = await publisher.send(b"a", exchange=missing, routing_key="k")
    with pytest.raises(PublishRefused):
        await awaited
    await publisher.send(b"b", exchange=missing, routing_key="k")
    await publisher.send(b"c", exchange=missing, routing_key="k")
    with pytest.raises(UnobservedPublishFailures) as caught:
        await publisher.close()
    # The first is refused; the one behind it on the same channel is discarded with it.
    assert caught.value.count == 2
    assert isinstance(caught.value.first, PublishRefused)
    await publisher.close()


async def test_async_batching_publisher_reports_records_nobody_looked_at(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    missing = names.exchange("missing")
    publisher = await conn.publisher()
    batching = AsyncBatchingPublisher(publisher, linger=60)  # sent by the flush below
    await batching.publish(b"1", exchange=missing, routing_key="k")
    await batching.publish(b"2", exchange=missing, routing_key="k")
    await batching.wait_for_confirms(timeout=WAIT)
    await batching.close()  # the publisher stays open: its close reports the records
    with pytest.raises(UnobservedPublishFailures) as caught:
        await publisher.close()
    assert caught.value.count == 2 and isinstance(caught.value.first, PublishRefused)


async def test_records_in_flight_when_batching_closes_are_reported_by_the_publisher(
    conn: rabbitry.AsyncConnection, names: Names
) -> None:
    missing = names.exchange("missing")
    with pytest.raises(UnobservedPublishFailures) as caught:
        async with await conn.publisher() as publisher:
            async with AsyncBatchingPublisher(publisher) as batching:
                await batching.publish(b"1", exchange=missing, routing_key="k")
    assert caught.value.count == 1 and isinstance(caught.value.first, PublishRefused)


async def test_instrumentation_does_not_count_as_looking_at_a_failure(
    conn: rabbitry.AsyncConnection, url: str, names: Names
) -> None:
    nowhere = names.queue("nowhere")
    tracer_provider, meter_provider = TracerProvider(), MeterProvider()
    observability.instrument(tracer_provider, meter_provider)
    try:
        with pytest.raises(UnobservedPublishFailures) as caught:
            async with await conn.publisher(mandatory=True) as publisher:
                await publisher.send(b"x", routing_key=nowhere)
        assert caught.value.count == 1
        with rabbitry.Connection(url) as sync_conn:
            with pytest.raises(UnobservedPublishFailures):
                with sync_conn.publisher(mandatory=True) as sync_publisher:
                    sync_publisher.publish(b"x", routing_key=nowhere)
    finally:
        observability.uninstrument()
        tracer_provider.shutdown()
        meter_provider.shutdown()


# --------------------------------------------------------------------------- callbacks


def test_sync_done_callbacks_do_not_run_on_the_io_thread(url: str, names: Names) -> None:
    queue = names.queue()
    with rabbitry.Connection(url) as conn:
        conn.channel().queue_declare(queue)
        with conn.publisher() as publisher:
            ran_on: list[str] = []
            release = threading.Event()
            entered = threading.Event()

            def slow(_future: object) -> None:
                ran_on.append(threading.current_thread().name)
                entered.set()
                release.wait(WAIT)  # a callback that takes its time

            publisher.publish(b"first", routing_key=queue).add_done_callback(slow)
            try:
                assert entered.wait(WAIT)
                assert ran_on and ran_on[0] != conn.io_thread_name
                # While that callback runs, the IO thread goes on: other confirms arrive.
                for i in range(20):
                    assert publisher.publish(b"%d" % i, routing_key=queue).result(WAIT) is None
                assert conn.is_open
            finally:
                release.set()


# --------------------------------------------------------------------------- properties


def test_sync_properties_may_be_a_mapping(url: str, names: Names) -> None:
    queue = names.queue()
    with rabbitry.Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        with conn.publisher() as publisher:
            props = {"message_id": "m-1", "headers": {"k": 1}, "content_type": "text/plain"}
            publisher.publish(b"x", routing_key=queue, properties=props).result(WAIT)
            assert publisher.publish_batch([b"y"], routing_key=queue, properties=props) == [None]
            with pytest.raises(LocalProtocolError, match=r"'mesage_id'.*message_id"):
                publisher.publish(b"z", routing_key=queue, properties={"mesage_id": "a"})
            with pytest.raises(LocalProtocolError, match="properties: must be"):
                publisher.publish(b"z", routing_key=queue, properties=42)  # type: ignore[arg-type]
        with BatchingPublisher(
            conn.publisher(), properties={"content_type": "application/json"}
        ) as batching:
            batching.publish(b"{}", routing_key=queue).result(WAIT)
        got = [channel.basic_get(queue, no_ack=True, timeout=WAIT) for _ in range(3)]
        assert [m.properties.message_id for m in got[:2] if m] == ["m-1", "m-1"]
        assert got[0] is not None and got[0].properties.headers == {"k": 1}
        assert got[2] is not None and got[2].properties.content_type == "application/json"
        assert channel.basic_get(queue, no_ack=True) is None  # nothing else was sent


async def test_async_properties_may_be_a_mapping(
    conn: rabbitry.AsyncConnection, channel: rabbitry.AsyncChannel, names: Names
) -> None:
    queue = names.queue()
    await channel.queue_declare(queue)
    async with await conn.publisher() as publisher:
        await publisher.publish(b"a", routing_key=queue, properties={"message_id": "a"})
        await (await publisher.send(b"b", routing_key=queue, properties={"message_id": "b"}))
        outcomes = await publisher.publish_batch(
            [OutgoingMessage(b"c", properties={"message_id": "c"})],
            routing_key=queue,
            properties={"priority": 1},
        )
        assert outcomes == [None]
        with pytest.raises(LocalProtocolError, match="unknown property 'id'"):
            await publisher.publish(b"z", routing_key=queue, properties={"id": "x"})
    got = [await channel.basic_get(queue, no_ack=True, timeout=WAIT) for _ in range(3)]
    assert [m.properties.message_id for m in got if m] == ["a", "b", "c"]
    assert await channel.basic_get(queue, no_ack=True) is None
    await asyncio.sleep(0)

"""AsyncPublisher / Publisher against a scripted broker (no RabbitMQ needed).

The fake broker (``fake_broker.py``) confirms only when a test says so, which makes the
hard orderings deterministic: a return followed by a multiple ack, nacks, confirms that
never come, a channel closed under in-flight messages, connection.blocked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from fake_broker import FakeBroker, Published

import rabbitry
from rabbitry.exceptions import (
    ConfigurationError,
    ConnectionLost,
    InvalidStateError,
    LocalProtocolError,
    Nacked,
    NotFound,
    PublishOutcomeUnknown,
    PublishRefused,
    PublishTimeout,
    Timeout,
    Unroutable,
)
from rabbitry.pool import AsyncChannelPool
from rabbitry.protocol import spec
from rabbitry.protocol.channel import ChannelState
from rabbitry.publisher import AsyncPublisher, OutgoingMessage, expiration_ms
from rabbitry.sync.pool import ChannelPool
from rabbitry.sync.publisher import Publisher

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

pytestmark = pytest.mark.timeout(60)

#: Upper bound for something that should happen soon (never a timing assertion).
WAIT = 5.0


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    with FakeBroker() as fake:
        yield fake


@pytest.fixture
async def conn(broker: FakeBroker) -> AsyncIterator[rabbitry.AsyncConnection]:
    connection = rabbitry.AsyncConnection(
        broker.url, heartbeat=0, connection_timeout=5, recovery=None
    )
    await connection.connect()
    try:
        yield connection
    finally:
        await connection.close(timeout=2)


async def settle(future: asyncio.Future[Any]) -> BaseException | None:
    """Wait for a future's outcome (bounded) and return its exception, if any."""
    await asyncio.wait({future}, timeout=WAIT)
    assert future.done(), "no outcome in time"
    return future.exception()


async def wait_until(predicate: Any, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def published(broker: FakeBroker, count: int) -> list[Published]:
    return await asyncio.to_thread(broker.wait_published, count)


# --------------------------------------------------------------------------- encoding


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0"),
        (1500, "1500"),
        (2**32 - 1, "4294967295"),
        (timedelta(seconds=2), "2000"),
        (timedelta(milliseconds=1, microseconds=999), "1"),  # whole ms, rounded down
        ("60000", "60000"),
    ],
)
def test_expiration_conversion(value: Any, expected: str) -> None:
    assert expiration_ms(value) == expected


@pytest.mark.parametrize(
    "value",
    [-1, True, False, 1.5, 2**32, timedelta(milliseconds=-1), "-5", "1.5", "", None, b"10"],
)
def test_expiration_rejects_with_field_name(value: Any) -> None:
    with pytest.raises(LocalProtocolError, match="expiration"):
        expiration_ms(value)


async def test_publish_sets_message_id_persistent_and_expiration(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher(confirm=False)
    await pub.send(b"a", routing_key="q")
    await pub.send(b"b", routing_key="q", persistent=True, expiration=timedelta(seconds=1.5))
    await pub.send(b"c", routing_key="q", persistent=False, expiration=0)
    user = spec.BasicProperties(message_id="mine", content_type="text/plain", headers={"k": 1})
    await pub.send("é", routing_key="q", properties=user, persistent=True, expiration=10)
    got = await published(broker, 4)
    ids = [p.properties.message_id for p in got]
    assert all(ids) and len(set(ids)) == 4
    assert ids[3] == "mine"
    assert got[0].properties.delivery_mode is None and got[0].properties.expiration is None
    assert (got[1].properties.delivery_mode, got[1].properties.expiration) == (2, "1500")
    assert (got[2].properties.delivery_mode, got[2].properties.expiration) == (1, "0")
    props = got[3].properties
    assert (props.delivery_mode, props.expiration, props.content_type) == (2, "10", "text/plain")
    assert props.headers == {"k": 1}
    assert got[3].body == "é".encode()
    # The caller's properties object is not changed.
    assert user.delivery_mode is None and user.expiration is None


async def test_generated_message_id_when_user_properties_lack_one(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher(confirm=False)
    user = spec.BasicProperties(app_id="me")
    await pub.send(b"x", routing_key="q", properties=user)
    (got,) = await published(broker, 1)
    assert got.properties.message_id and got.properties.app_id == "me"
    assert user.message_id is None


async def test_invalid_input_raises_before_anything_is_sent(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher()
    with pytest.raises(LocalProtocolError, match="routing_key"):
        await pub.send(b"x", routing_key="r" * 300)
    with pytest.raises(LocalProtocolError, match="body"):
        await pub.send(12345)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="expiration"):
        await pub.send(b"x", expiration=-5)
    with pytest.raises(LocalProtocolError, match="expiration"):
        await pub.send(b"x", expiration=True)
    with pytest.raises(LocalProtocolError, match="message"):
        await pub.publish_batch(b"not a list")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        await pub.publish_batch([b"ok", OutgoingMessage(b"bad", expiration=-1)])
    assert pub.in_flight == 0
    await asyncio.sleep(0.05)
    assert broker.published == []


@pytest.mark.parametrize(
    "options",
    [
        {"max_in_flight": 0},
        {"max_in_flight": True},
        {"timeout": -1},
        {"confirm": False, "republish_unconfirmed": True},
    ],
)
async def test_invalid_options(conn: rabbitry.AsyncConnection, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        await conn.publisher(**options)


# --------------------------------------------------------------------------- confirms


async def test_ack_and_multiple_ack_resolve_exactly_the_covered_messages(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher()
    assert broker.sent(spec.ConfirmSelect)
    futures = [await pub.send(b"%d" % i, routing_key="q") for i in range(10)]
    got = await published(broker, 10)
    assert [p.seq for p in got] == list(range(1, 11))
    broker.ack(2)
    assert await settle(futures[1]) is None
    assert not futures[0].done()
    broker.ack(7, multiple=True)
    for future in futures[:7]:
        assert await settle(future) is None
    assert not any(f.done() for f in futures[7:])
    assert pub.in_flight == 3
    broker.ack(10, multiple=True)
    for future in futures:
        assert await settle(future) is None
    assert pub.in_flight == 0
    await pub.wait_for_confirms(timeout=WAIT)


async def test_nack_fails_with_nacked_naming_each_message(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher()
    futures = [await pub.send(b"x", routing_key="q") for _ in range(5)]
    await published(broker, 5)
    broker.ack(1)
    broker.nack(2)
    broker.nack(4, multiple=True)
    broker.ack(5)
    outcomes = [await settle(f) for f in futures]
    assert outcomes[0] is None and outcomes[4] is None
    for seq, outcome in zip((2, 3, 4), outcomes[1:4], strict=True):
        assert isinstance(outcome, Nacked)
        assert outcome.delivery_tag == seq


async def test_return_then_ack_fails_with_unroutable_and_the_ack_does_not_hide_it(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher(max_in_flight=2)
    ok = await pub.send(b"ok", routing_key="q", mandatory=True)
    lost = await pub.send(b"lost", routing_key="nowhere", mandatory=True)
    got = await published(broker, 2)
    broker.return_then_ack(got[1], multiple=True)  # one multiple ack covers both
    assert await settle(ok) is None
    error = await settle(lost)
    assert isinstance(error, Unroutable)
    assert error.message.body == b"lost"
    assert error.message.reply_code == 312
    assert error.message.routing_key == "nowhere"
    assert error.message.properties.message_id == got[1].properties.message_id
    # The ack freed the window slot of the returned message too.
    assert pub.in_flight == 0
    assert pub._core.book.returnable == {}


async def test_duplicate_message_ids_match_returns_oldest_first(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher(mandatory=True)
    props = spec.BasicProperties(message_id="same")
    first = await pub.send(b"1", routing_key="nowhere", properties=props)
    second = await pub.send(b"2", routing_key="nowhere", properties=props)
    got = await published(broker, 2)
    broker.return_message(got[0])
    broker.ack(2, multiple=True)
    assert isinstance(await settle(first), Unroutable)
    assert await settle(second) is None


async def test_return_without_mandatory_publish_in_flight_is_logged(
    broker: FakeBroker, conn: rabbitry.AsyncConnection, caplog: pytest.LogCaptureFixture
) -> None:
    pub = await conn.publisher()
    future = await pub.send(b"x", routing_key="q")  # not mandatory: not correlated
    (got,) = await published(broker, 1)
    broker.return_then_ack(got)
    assert await settle(future) is None
    assert "matches no mandatory publish" in caplog.text


# --------------------------------------------------------------------------- window


async def test_window_full_publish_waits_and_waiters_are_served_in_order(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher(max_in_flight=2)
    await pub.send(b"1", routing_key="q")
    await pub.send(b"2", routing_key="q")
    order: list[int] = []

    async def later(i: int) -> None:
        await pub.send(b"%d" % i, routing_key="q")
        order.append(i)

    tasks = [asyncio.create_task(later(i)) for i in (3, 4, 5)]
    await asyncio.sleep(0.05)
    assert order == [] and pub.in_flight == 2
    assert len(broker.published) == 2
    broker.ack(1)
    await wait_until(lambda: order == [3])
    broker.ack(3, multiple=True)
    await asyncio.gather(*tasks)
    assert order == [3, 4, 5]
    got = await published(broker, 5)
    assert [p.body for p in got] == [b"1", b"2", b"3", b"4", b"5"]
    broker.ack(5, multiple=True)
    await pub.wait_for_confirms(timeout=WAIT)


async def test_timeout_while_window_full_raises_and_sends_nothing(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher(max_in_flight=1)
    first = await pub.send(b"1", routing_key="q")
    with pytest.raises(PublishTimeout, match="no room") as caught:
        await pub.send(b"2", routing_key="q", timeout=0.05)
    assert isinstance(caught.value, Timeout) and isinstance(caught.value, TimeoutError)
    await asyncio.sleep(0.05)
    assert len(broker.published) == 1
    broker.ack(1)
    assert await settle(first) is None
    # The timed-out waiter left no trace: the window is usable again.
    second = await pub.send(b"3", routing_key="q", timeout=WAIT)
    await published(broker, 2)
    broker.ack(2)
    assert await settle(second) is None


async def test_a_slot_handed_to_a_publish_cancelled_in_the_same_pass_goes_to_the_next(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher(max_in_flight=1)
    waiting: list[asyncio.Task[asyncio.Future[None]]] = []
    release = pub._core.slots.release

    def release_then_cancel() -> None:
        release()  # hands the slot to the oldest waiting publish...
        waiting[0].cancel()  # ...which is cancelled before it resumes

    pub._core.release_slot_cb = release_then_cancel
    first = await pub.send(b"1", routing_key="q")
    for body in (b"2", b"3"):
        waiting.append(asyncio.create_task(pub.send(body, routing_key="q")))
    await wait_until(lambda: len(pub._core.slots.waiters) == 2)
    broker.ack(1)
    assert await settle(first) is None
    with pytest.raises(asyncio.CancelledError):
        await waiting[0]
    third = await asyncio.wait_for(waiting[1], WAIT)  # the slot went on to it
    got = await published(broker, 2)
    assert [p.body for p in got] == [b"1", b"3"]
    broker.ack(2)
    assert await settle(third) is None
    assert pub.in_flight == 0 and pub._core.slots.reserved == 0


async def test_confirm_deadline_fails_the_future_but_keeps_the_message_in_flight(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher(timeout=0.1)
    future = await pub.send(b"slow", routing_key="q")
    assert isinstance(await settle(future), PublishTimeout)
    (kept,) = pub.unconfirmed()
    assert kept.seq == 1 and kept.frames[0][1:3] == (pub.channel_id or 0).to_bytes(2, "big")
    assert pub.in_flight == 1
    broker.ack(1)
    await wait_until(lambda: pub.in_flight == 0)
    assert pub.unconfirmed() == []


async def test_unconfirmed_frames_can_be_readdressed(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher()
    big = b"z" * 300_000  # three body frames
    await pub.send(big, routing_key="q")
    (entry,) = pub.unconfirmed()
    moved = entry.frames_for(7)
    heads = [moved[0]] + [moved[i] for i in range(1, len(moved), 3)]
    assert len(heads) == 5  # method, header, 3 bodies
    assert all(head[1:3] == b"\x00\x07" for head in heads)
    assert b"".join(moved[i] for i in range(len(moved)) if i % 3 != 1)[20:] != b""
    assert [len(x) for x in moved] == [len(x) for x in entry.frames]
    await published(broker, 1)
    broker.ack(1)
    await pub.wait_for_confirms(timeout=WAIT)


# --------------------------------------------------------------------------- blocked


async def test_blocked_connection_makes_publishes_wait(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher()
    broker.block("low on memory")
    await wait_until(lambda: pub.is_blocked)
    assert pub.blocked_reason == "low on memory"
    task = asyncio.create_task(pub.send(b"x", routing_key="q"))
    await asyncio.sleep(0.05)
    assert not task.done() and broker.published == []
    with pytest.raises(PublishTimeout, match="blocked"):
        await pub.send(b"y", routing_key="q", timeout=0.05)
    broker.unblock()
    future = await asyncio.wait_for(task, WAIT)
    await published(broker, 1)
    assert not pub.is_blocked
    broker.ack(1)
    assert await settle(future) is None
    assert len(broker.published) == 1


# --------------------------------------------------------------------------- channel loss


async def test_refused_publish_fails_refused_later_ones_discarded_and_next_publish_reopens(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher()
    first_channel = pub.channel_id
    acked = await pub.send(b"ok", routing_key="q")
    unconfirmed = await pub.send(b"slow", routing_key="q")
    bad = await pub.send(b"bad", exchange="missing")
    after = await pub.send(b"after", routing_key="q")
    got = await published(broker, 4)
    broker.ack(1)
    broker.close_channel(got[2].channel, 404, "NOT_FOUND - no exchange 'missing' in vhost '/'")
    assert await settle(acked) is None
    # Processed before the refused one but not confirmed: may or may not be routed.
    before = await settle(unconfirmed)
    assert type(before) is PublishOutcomeUnknown and not before.discarded
    refused = await settle(bad)
    assert isinstance(refused, PublishRefused)
    assert (refused.reply_code, refused.delivery_tag) == (404, 3)
    assert "no exchange 'missing'" in refused.reply_text
    # Sent after the refused one: the broker discarded it unprocessed.
    later = await settle(after)
    assert isinstance(later, PublishOutcomeUnknown) and later.discarded
    for error in (before, refused, later):
        assert isinstance(error.__cause__, NotFound)
    assert pub.in_flight == 0
    fresh = await pub.send(b"fresh", routing_key="q")
    more = await published(broker, 5)
    assert more[4].channel != got[0].channel
    assert pub.channel_id == more[4].channel != first_channel
    assert len(broker.sent(spec.ConfirmSelect)) == 2
    broker.ack(1, channel=more[4].channel)
    assert await settle(fresh) is None


async def test_connection_lost_fails_in_flight_with_outcome_unknown(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher(max_in_flight=1)
    future = await pub.send(b"x", routing_key="q")
    waiting = asyncio.create_task(pub.send(b"y", routing_key="q"))
    await published(broker, 1)
    broker.drop()
    error = await settle(future)
    assert isinstance(error, PublishOutcomeUnknown)
    assert isinstance(error.__cause__, ConnectionLost)
    with pytest.raises(InvalidStateError):
        await asyncio.wait_for(waiting, WAIT)
    with pytest.raises(InvalidStateError):
        await pub.send(b"z", routing_key="q")


async def test_a_publish_as_recovery_reopens_the_channel_is_still_confirmed(
    broker: FakeBroker,
) -> None:
    """Recovery re-opens the publisher's channel, then selects confirm mode on it again.
    A message published in the first loop iteration that sees the new channel open
    (before the recovery task has run again) must be numbered for confirms like any
    other: it is sent in confirm mode and its future waits for the broker's ack. Sent
    ahead of confirm.select, the broker would never confirm (or nack) it, and the
    publisher would report it delivered at once."""
    policy = rabbitry.RecoveryPolicy(initial_delay=0.01, max_delay=0.05, jitter=0)
    conn = rabbitry.AsyncConnection(broker.url, heartbeat=0, connection_timeout=5, recovery=policy)
    await conn.connect()
    try:
        pub = await conn.publisher()
        channel = pub._core.channel
        assert channel is not None
        broker.drop()
        # Look every loop iteration: the first look at the re-opened channel comes
        # before the recovery task resumes (its wake-up is queued behind ours).
        deadline = time.monotonic() + WAIT
        while not (channel._suspended and channel._proto.state is ChannelState.OPEN):
            assert time.monotonic() < deadline, "the channel was not re-opened in time"
            await asyncio.sleep(0)
        future = await pub.send(b"m", routing_key="q")
        assert not future.done()
        sent = await published(broker, 1)
        assert (sent[0].body, sent[0].seq) == (b"m", 1)
        assert broker.connections == 2
        broker.ack(1)
        assert await settle(future) is None
    finally:
        await conn.close(timeout=2)


async def test_confirm_mode_survives_a_recovery_attempt_that_fails_while_reopening(
    broker: FakeBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """The connection drops again while recovery waits for channel.open-ok: the next
    attempt must still select confirm mode on the channel (the failed attempt's channel
    never got that far), so later publishes wait for the broker's ack. The failed
    attempt's requests all fail; none is left with an exception nobody retrieved."""
    policy = rabbitry.RecoveryPolicy(initial_delay=0.01, max_delay=0.05, jitter=0)
    conn = rabbitry.AsyncConnection(broker.url, heartbeat=0, connection_timeout=5, recovery=policy)
    await conn.connect()
    try:
        pub = await conn.publisher()
        opens = lambda: len(broker.sent(spec.ChannelOpen))  # noqa: E731
        assert opens() == 1
        broker.hold_channel_open = True
        broker.drop()
        await asyncio.to_thread(broker.wait_for, lambda: opens() == 2)
        broker.hold_channel_open = False
        broker.drop()
        await asyncio.to_thread(broker.wait_for, lambda: opens() == 3)
        await conn.wait_recovered(timeout=WAIT)
        assert broker.connections == 3
        future = await pub.send(b"m", routing_key="q")
        sent = await published(broker, 1)
        assert (sent[0].body, sent[0].seq) == (b"m", 1)
        assert not future.done()
        broker.ack(1)
        assert await settle(future) is None
    finally:
        await conn.close(timeout=2)
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


# --------------------------------------------------------------------------- batch


async def test_publish_batch_is_one_write_and_reports_each_outcome(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher()
    transport = conn._transport
    assert transport is not None
    writes: list[int] = []
    original = transport.write

    def counting(data: Any) -> None:
        writes.append(len(data))
        original(data)

    transport.write = counting  # type: ignore[method-assign]
    messages: list[OutgoingMessage | bytes] = [b"m%d" % i for i in range(300)]
    messages[5] = OutgoingMessage(b"lost", routing_key="nowhere", mandatory=True)
    messages[9] = OutgoingMessage(b"ttl", expiration=timedelta(seconds=3), persistent=True)
    task = asyncio.create_task(pub.publish_batch(messages, routing_key="q"))
    got = await published(broker, 300)
    assert len(writes) == 1, writes  # 300 messages, one write burst
    transport.write = original  # type: ignore[method-assign]
    assert got[9].routing_key == "q" and got[9].properties.expiration == "3000"
    assert got[9].properties.delivery_mode == 2
    assert got[5].routing_key == "nowhere" and got[5].mandatory
    broker.return_message(got[5])
    broker.nack(got[7].seq)
    broker.ack(300, multiple=True)
    outcomes = await asyncio.wait_for(task, WAIT)
    assert len(outcomes) == 300
    assert isinstance(outcomes[5], Unroutable)
    assert isinstance(outcomes[7], Nacked)
    assert [i for i, o in enumerate(outcomes) if o is not None] == [5, 7]
    assert pub.in_flight == 0


async def test_publish_batch_larger_than_the_window_goes_in_chunks(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher(max_in_flight=10)
    task = asyncio.create_task(pub.publish_batch([b"x"] * 25, routing_key="q"))
    for upto in (10, 20, 25):
        await published(broker, upto)
        await asyncio.sleep(0.02)
        assert len(broker.published) == upto
        broker.ack(upto, multiple=True)
    assert await asyncio.wait_for(task, WAIT) == [None] * 25


async def test_publish_batch_deadline(broker: FakeBroker, conn: rabbitry.AsyncConnection) -> None:
    pub = await conn.publisher(max_in_flight=2)
    outcomes = await pub.publish_batch([b"1", b"2", b"3"], routing_key="q", timeout=0.1)
    assert all(isinstance(o, PublishTimeout) for o in outcomes)
    assert len(broker.published) == 2  # the third never found room
    assert await pub.publish_batch([]) == []


# --------------------------------------------------------------------------- modes


async def test_fire_and_forget(broker: FakeBroker, conn: rabbitry.AsyncConnection) -> None:
    pub = await conn.publisher(confirm=False, max_in_flight=1)
    futures = [await pub.send(b"x", routing_key="q") for _ in range(5)]
    assert all(f.done() and f.exception() is None for f in futures)
    await pub.wait_for_confirms()
    await published(broker, 5)
    assert not broker.sent(spec.ConfirmSelect)
    assert [p.seq for p in broker.published] == [0] * 5
    assert await pub.publish_batch([b"a", b"b"], routing_key="q") == [None, None]


async def test_close_waits_for_confirms_then_refuses(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher()
    future = await pub.send(b"x", routing_key="q")
    await published(broker, 1)
    closing = asyncio.create_task(pub.close(timeout=WAIT))
    await asyncio.sleep(0.05)
    assert not closing.done()
    broker.ack(1)
    await asyncio.wait_for(closing, WAIT)
    assert await settle(future) is None
    assert pub.is_closed
    with pytest.raises(InvalidStateError):
        await pub.send(b"y", routing_key="q")
    await pub.close()  # idempotent


async def test_close_with_unconfirmed_fails_them_as_unknown(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher()
    future = await pub.send(b"x", routing_key="q")
    await published(broker, 1)
    outcome = asyncio.create_task(settle(future))  # someone waits for the outcome
    await asyncio.sleep(0)
    await pub.close(timeout=0.05)
    assert isinstance(await outcome, PublishOutcomeUnknown)


async def test_context_manager_and_repr(broker: FakeBroker, conn: rabbitry.AsyncConnection) -> None:
    broker.auto_ack = True
    async with await conn.publisher(max_in_flight=5) as pub:
        assert "in_flight=0/5" in repr(pub)
        assert (pub.confirm, pub.max_in_flight, pub.mandatory, pub.timeout) == (
            True,
            5,
            False,
            None,
        )
        assert pub.republish_unconfirmed is False
        future = await pub.send(b"x", routing_key="q")
    assert await settle(future) is None
    assert pub.is_closed


# --------------------------------------------------------------------------- sync twin


@pytest.fixture
def sync_conn(broker: FakeBroker) -> Iterator[rabbitry.Connection]:
    connection = rabbitry.Connection(broker.url, heartbeat=0, connection_timeout=5, recovery=None)
    connection.connect()
    try:
        yield connection
    finally:
        connection.close(timeout=2)


def test_sync_publish_confirm_return_and_batch(
    broker: FakeBroker, sync_conn: rabbitry.Connection
) -> None:
    pub = sync_conn.publisher(mandatory=True)
    assert isinstance(pub, Publisher)
    futures = [pub.publish(b"%d" % i, routing_key="q") for i in range(4)]
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    got = broker.wait_published(4)
    broker.return_message(got[1])
    broker.nack(3)
    broker.ack(4, multiple=True)
    assert futures[0].result(WAIT) is None
    assert isinstance(futures[1].exception(WAIT), Unroutable)
    assert isinstance(futures[2].exception(WAIT), Nacked)
    assert futures[3].result(WAIT) is None
    broker.auto_ack = True
    outcomes = pub.publish_batch(
        [b"a", OutgoingMessage(b"b", routing_key="other", mandatory=False)], routing_key="q"
    )
    assert outcomes == [None, None]
    assert broker.published[-1].routing_key == "other"
    pub.wait_for_confirms(timeout=WAIT)
    assert pub.unconfirmed() == []
    pub.close()
    with pytest.raises(InvalidStateError):
        pub.publish(b"x")


def test_sync_window_blocks_the_thread_until_a_confirm(
    broker: FakeBroker, sync_conn: rabbitry.Connection
) -> None:
    pub = sync_conn.publisher(max_in_flight=2)
    pub.publish(b"1", routing_key="q")
    pub.publish(b"2", routing_key="q")
    with pytest.raises(PublishTimeout, match="no room"):
        pub.publish(b"3", routing_key="q", timeout=0.05)
    done = threading.Event()
    box: list[concurrent.futures.Future[None]] = []

    def third() -> None:
        box.append(pub.publish(b"3", routing_key="q"))
        done.set()

    thread = threading.Thread(target=third)
    thread.start()
    assert not done.wait(0.1)
    broker.ack(1)
    assert done.wait(WAIT)
    thread.join()
    broker.wait_published(3)
    broker.ack(3, multiple=True)
    assert box[0].result(WAIT) is None
    pub.wait_for_confirms(timeout=WAIT)
    assert pub.in_flight == 0


def test_sync_blocked_and_reopen_after_channel_error(
    broker: FakeBroker, sync_conn: rabbitry.Connection
) -> None:
    pub = sync_conn.publisher()
    broker.block()
    deadline = time.monotonic() + WAIT
    while not pub.is_blocked:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    with pytest.raises(PublishTimeout, match="blocked"):
        pub.publish(b"x", routing_key="q", timeout=0.05)
    broker.unblock()
    while pub.is_blocked:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    first = pub.publish(b"x", routing_key="q")
    got = broker.wait_published(1)
    broker.close_channel(got[0].channel)
    error = first.exception(WAIT)
    assert isinstance(error, PublishOutcomeUnknown) and isinstance(error.__cause__, NotFound)
    # The next publish is encoded for the dead channel and re-addressed to a fresh one.
    second = pub.publish(b"y", routing_key="q")
    fresh = broker.wait_published(2)[1]
    assert fresh.channel != got[0].channel and fresh.body == b"y"
    broker.ack(1, channel=fresh.channel)
    assert second.result(WAIT) is None


def test_sync_timeout_on_confirm(broker: FakeBroker, sync_conn: rabbitry.Connection) -> None:
    pub = sync_conn.publisher(timeout=0.05)
    future = pub.publish(b"x", routing_key="q")
    assert isinstance(future.exception(WAIT), PublishTimeout)
    assert len(pub.unconfirmed()) == 1
    broker.ack(1)
    pub.wait_for_confirms(timeout=WAIT)


def test_sync_batches_from_threads_share_the_window_without_deadlock(
    broker: FakeBroker, sync_conn: rabbitry.Connection
) -> None:
    broker.auto_ack = True
    pub = sync_conn.publisher(max_in_flight=8)
    results: list[list[BaseException | None]] = []

    def work() -> None:
        results.append(pub.publish_batch([b"x"] * 50, routing_key="q", timeout=WAIT * 2))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 3)
    assert [r == [None] * 50 for r in results] == [True] * 4
    assert len(broker.published) == 200


# --------------------------------------------------------------------------- twins


def test_sync_close_sends_a_message_accepted_while_the_channel_reopens(
    broker: FakeBroker, sync_conn: rabbitry.Connection
) -> None:
    broker.auto_ack = True
    pub = sync_conn.publisher()
    first = pub.publish(b"x", routing_key="q")
    got = broker.wait_published(1)
    assert first.result(WAIT) is None
    broker.close_channel(got[0].channel)
    channel = pub._async._core.channel
    deadline = time.monotonic() + WAIT
    while channel is not None and channel.is_open:
        assert time.monotonic() < deadline, "the channel close never arrived"
        time.sleep(0.005)
    # Accepted: publish() returned a future, the message waits for a new channel.
    accepted = pub.publish(b"y", routing_key="q")
    pub.close(timeout=5)  # "waits for outstanding confirms, then closes"
    assert accepted.exception(WAIT) is None, "an accepted message was dropped on close"
    assert [p.body for p in broker.published] == [b"x", b"y"]


async def test_close_while_the_channel_reopens_closes_the_new_channel(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher()
    first = pub.channel_id
    assert first is not None
    broker.close_channel(first)
    await wait_until(lambda: pub._core.channel is not None and not pub._core.channel.is_open)
    broker.hold_confirm_select = True
    sending = asyncio.create_task(pub.send(b"x", routing_key="q"))
    # The replacement channel is open; its confirm.select has no answer yet.
    await wait_until(lambda: len(broker.sent(spec.ConfirmSelect)) == 2)
    second = broker.sent(spec.ConfirmSelect)[1][0]
    await pub.close(timeout=1)
    broker.send(second, spec.ConfirmSelectOk())
    with pytest.raises(rabbitry.AMQPError):
        await sending
    await wait_until(lambda: not [h for h in conn._channels.values() if h.channel.is_open])


def test_async_and_sync_classes_are_twins() -> None:
    from test_api_twins import _member_differences

    for async_cls, sync_cls in ((AsyncPublisher, Publisher), (AsyncChannelPool, ChannelPool)):
        assert _member_differences(async_cls, sync_cls) == []


async def test_connection_lost_while_blocked_releases_the_waiter(
    broker: FakeBroker, conn: rabbitry.AsyncConnection
) -> None:
    pub = await conn.publisher()
    broker.block()
    await wait_until(lambda: pub.is_blocked)
    waiting = asyncio.create_task(pub.send(b"x", routing_key="q"))
    await asyncio.sleep(0.02)
    broker.drop()
    with pytest.raises(InvalidStateError):
        await asyncio.wait_for(waiting, WAIT)
    assert not pub.is_blocked


def test_sync_publisher_is_closed_by_a_lost_connection_and_says_why(
    broker: FakeBroker, sync_conn: rabbitry.Connection
) -> None:
    pub = sync_conn.publisher()
    first = pub.publish(b"x", routing_key="q")
    broker.wait_published(1)
    broker.drop()
    assert isinstance(first.exception(WAIT), PublishOutcomeUnknown)
    deadline = time.monotonic() + WAIT
    while not pub.is_closed:  # the connection's end closes the publisher
        assert time.monotonic() < deadline
        time.sleep(0.005)
    with pytest.raises(InvalidStateError) as raised:
        pub.publish(b"y", routing_key="q")
    assert isinstance(raised.value.__cause__, ConnectionLost)
    assert pub.in_flight == 0


def test_sync_close_releases_threads_blocked_on_the_window(
    broker: FakeBroker, sync_conn: rabbitry.Connection
) -> None:
    pub = sync_conn.publisher(max_in_flight=1)
    first = pub.publish(b"1", routing_key="q")
    outcomes: list[BaseException | None] = []
    first.add_done_callback(lambda f: outcomes.append(f.exception()))
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            pub.publish(b"2", routing_key="q")
        except InvalidStateError as exc:
            errors.append(exc)

    thread = threading.Thread(target=blocked)
    thread.start()
    time.sleep(0.05)
    pub.close(timeout=0.1)
    thread.join(WAIT)
    assert not thread.is_alive() and len(errors) == 1
    assert isinstance(first.exception(WAIT), PublishOutcomeUnknown)
    assert len(broker.published) == 1

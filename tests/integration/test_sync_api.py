"""The thread-safe sync API (rabbitry.Connection / rabbitry.Channel) against a real broker.

Round trips, callbacks and their threads, many threads on one connection (the issue's
done-when: 8 publishing threads x 10k messages and 4 consuming threads, exactly once),
heartbeats while a callback blocks, bounded close and timeouts through a black-holed
proxy, and no leaked ``rabbitry-*`` threads after any test.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import Channel, Connection, Message, Properties
from rabbitry.config import parse_urls

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.integration.conftest import Names

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

#: Upper bound for waiting on something that should happen (never a timing assertion).
WAIT = 10.0
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def rabbitry_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if "rabbitry-" in t.name}


def connection_threads(conn: Connection) -> tuple[str, str]:
    io = conn.io_thread_name
    assert io is not None and io.startswith("rabbitry-io-")
    return io, io.replace("rabbitry-io-", "rabbitry-callbacks-", 1)


def threads_gone(names: tuple[str, ...] | tuple[str, str], timeout: float = WAIT) -> bool:
    return wait_until(lambda: not (set(names) & rabbitry_threads()), timeout)


@pytest.fixture(autouse=True)
def no_rabbitry_thread_leaks() -> Iterator[None]:
    before = rabbitry_threads()
    yield
    ok = wait_until(lambda: rabbitry_threads() <= before)
    assert ok, f"leaked threads: {sorted(rabbitry_threads() - before)}"


@pytest.fixture
def broker(url: str) -> tuple[str, int]:
    params = parse_urls(url)[0]
    return params.host, params.port


@pytest.fixture
def proxy(broker: tuple[str, int]) -> Iterator[TcpProxy]:
    p = TcpProxy(*broker).start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def sync_conn(url: str) -> Iterator[Connection]:
    conn = Connection(url, connection_timeout=5)
    conn.connect(timeout=WAIT)
    try:
        yield conn
    finally:
        conn.close(timeout=5)


@pytest.fixture
def ch(sync_conn: Connection) -> Channel:
    return sync_conn.channel(timeout=WAIT)


def ready_count(ch: Channel, queue: str) -> int:
    return ch.queue_declare(queue, passive=True, timeout=WAIT).message_count


def wait_ready(ch: Channel, queue: str, expected: int, timeout: float = WAIT) -> None:
    """Passive-declare until ``queue`` holds ``expected`` ready messages (counts lag)."""
    count: list[int] = []

    def check() -> bool:
        count.append(ready_count(ch, queue))
        return count[-1] == expected

    assert wait_until(check, timeout), f"{queue}: {count[-1]} ready, expected {expected}"


def publish_confirmed(ch: Channel, routing_key: str, *bodies: bytes, exchange: str = "") -> None:
    futures = [ch.basic_publish(exchange, routing_key, body) for body in bodies]
    for future in futures:
        assert isinstance(future, concurrent.futures.Future)
        assert future.result(WAIT) is None


def confirm_channel(conn: Connection) -> Channel:
    channel = conn.channel(timeout=WAIT)
    channel.confirm_select(timeout=WAIT)
    return channel


# =========================================================================== round trips


def test_declare_bind_publish_get_ack(sync_conn: Connection, ch: Channel, names: Names) -> None:
    exchange, queue = names.exchange(), names.queue()
    assert ch.exchange_declare(exchange, "direct", timeout=WAIT) is not None
    ok = ch.queue_declare(queue, timeout=WAIT)
    assert (ok.queue, ok.message_count, ok.consumer_count) == (queue, 0, 0)
    ch.queue_bind(queue, exchange, "rk", timeout=WAIT)

    ch.basic_publish(exchange, "rk", b"hello", properties=Properties(content_type="text/plain"))
    ch.basic_publish(exchange, "rk", "h\u00e9llo")  # str is UTF-8
    wait_ready(ch, queue, 2)

    first = ch.basic_get(queue, timeout=WAIT)
    assert isinstance(first, Message)
    assert first.body == b"hello"
    assert first.properties.content_type == "text/plain"
    assert (first.exchange, first.routing_key, first.redelivered) == (exchange, "rk", False)
    assert first.channel is ch
    first.ack()
    second = ch.basic_get(queue, timeout=WAIT)
    assert second is not None and second.body == "h\u00e9llo".encode()
    ch.basic_ack(second.delivery_tag)
    assert ch.basic_get(queue, timeout=WAIT) is None

    ch.queue_unbind(queue, exchange, "rk", timeout=WAIT)
    ch.basic_publish(exchange, "rk", b"unrouted")
    assert ready_count(ch, queue) == 0
    ch.queue_purge(queue, timeout=WAIT)
    assert ch.queue_delete(queue, timeout=WAIT).message_count == 0
    ch.exchange_delete(exchange, timeout=WAIT)
    assert sync_conn.is_open


def test_nack_and_reject(ch: Channel, names: Names) -> None:
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    ch.confirm_select(timeout=WAIT)
    publish_confirmed(ch, queue, b"one", b"two")

    m1 = ch.basic_get(queue, timeout=WAIT)
    assert m1 is not None and m1.body == b"one"
    m1.nack(requeue=True)
    again = ch.basic_get(queue, timeout=WAIT)
    assert again is not None and again.body == b"one" and again.redelivered
    again.reject(requeue=False)  # dropped (no dead-letter exchange)

    m2 = ch.basic_get(queue, timeout=WAIT)
    assert m2 is not None and m2.body == b"two"
    ch.basic_reject(m2.delivery_tag, requeue=True)
    m2 = ch.basic_get(queue, timeout=WAIT)
    assert m2 is not None and m2.redelivered
    ch.basic_nack(m2.delivery_tag, multiple=False, requeue=False)
    assert ch.basic_get(queue, timeout=WAIT) is None


def test_basic_recover_redelivers(ch: Channel, names: Names) -> None:
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    ch.confirm_select(timeout=WAIT)
    publish_confirmed(ch, queue, b"x")
    m = ch.basic_get(queue, timeout=WAIT)
    assert m is not None
    ch.basic_recover(requeue=True, timeout=WAIT)
    again = ch.basic_get(queue, timeout=WAIT)
    assert again is not None and again.body == b"x" and again.redelivered
    again.ack()


def test_consume_iterator_ends_when_idle(ch: Channel, names: Names) -> None:
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    ch.confirm_select(timeout=WAIT)
    publish_confirmed(ch, queue, *(b"m%d" % i for i in range(120)))

    bodies = []
    last = time.monotonic()
    for message in ch.consume(queue, prefetch=50, timeout=1):
        assert threading.current_thread() is threading.main_thread()
        assert message.channel is ch
        bodies.append(message.body)
        message.ack()
        last = time.monotonic()
    idle = time.monotonic() - last
    assert bodies == [b"m%d" % i for i in range(120)]
    assert idle >= 0.9, idle  # it ended after its idle timeout, not before
    # The consumer was cancelled and everything was acked.
    ok = ch.queue_declare(queue, passive=True, timeout=WAIT)
    assert ok.consumer_count == 0
    ch.close(timeout=WAIT)


def test_basic_consume_callback_runs_on_the_dispatcher_thread(
    sync_conn: Connection, ch: Channel, names: Names
) -> None:
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    seen: list[tuple[bytes, str]] = []
    done = threading.Event()

    def on_message(message: Message) -> None:
        seen.append((message.body, threading.current_thread().name))
        message.ack()
        if len(seen) == 50:
            done.set()

    tag = ch.basic_consume(queue, on_message, timeout=WAIT)
    assert isinstance(tag, str) and tag
    for i in range(50):
        ch.basic_publish("", queue, b"%d" % i)
    assert done.wait(WAIT)
    assert [body for body, _ in seen] == [b"%d" % i for i in range(50)]
    io, dispatcher = connection_threads(sync_conn)
    thread_names = {name for _, name in seen}
    assert thread_names == {dispatcher}
    assert io not in thread_names
    assert threading.main_thread().name not in thread_names
    ch.basic_cancel(tag, timeout=WAIT)
    assert ch.queue_declare(queue, passive=True, timeout=WAIT).consumer_count == 0


def test_confirm_mode_futures_resolve(ch: Channel, names: Names) -> None:
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    assert ch.basic_publish("", queue, b"before confirm mode") is None
    ch.confirm_select(timeout=WAIT)
    assert ch.confirm_mode
    futures = [ch.basic_publish("", queue, b"%d" % i) for i in range(500)]
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    done, not_done = concurrent.futures.wait(futures, timeout=WAIT)  # type: ignore[arg-type]
    assert not not_done
    assert all(f.result() is None for f in done)
    assert ready_count(ch, queue) == 501


def test_mandatory_return_runs_callback_on_the_dispatcher_thread(
    sync_conn: Connection, ch: Channel, names: Names
) -> None:
    returned: list[tuple[Message, str]] = []
    got = threading.Event()

    def on_return(message: Message) -> None:
        returned.append((message, threading.current_thread().name))
        got.set()

    ch.add_return_callback(on_return)
    ch.confirm_select(timeout=WAIT)
    nowhere = names.queue("nowhere")  # never declared
    future = ch.basic_publish("", nowhere, b"lost?", mandatory=True)
    assert future is not None
    assert future.result(WAIT) is None  # returned, then acked: confirmed as handled
    assert got.wait(WAIT)
    message, thread_name = returned[0]
    assert (message.reply_code, message.routing_key, message.body) == (312, nowhere, b"lost?")
    assert message.reply_text == "NO_ROUTE"
    _, dispatcher = connection_threads(sync_conn)
    assert thread_name == dispatcher
    assert sync_conn.is_open and ch.is_open


def test_tx_commit_and_rollback(ch: Channel, names: Names) -> None:
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    ch.tx_select(timeout=WAIT)
    ch.basic_publish("", queue, b"rolled back 1")
    ch.basic_publish("", queue, b"rolled back 2")
    ch.tx_rollback(timeout=WAIT)
    assert ready_count(ch, queue) == 0
    ch.basic_publish("", queue, b"committed")
    ch.tx_commit(timeout=WAIT)
    assert ready_count(ch, queue) == 1
    message = ch.basic_get(queue, no_ack=True, timeout=WAIT)
    assert message is not None and message.body == b"committed"


def test_one_mebibyte_body(sync_conn: Connection, names: Names) -> None:
    ch = confirm_channel(sync_conn)
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    body = bytes(range(256)) * 4096
    assert len(body) == 1024 * 1024
    publish_confirmed(ch, queue, body)
    message = ch.basic_get(queue, no_ack=True, timeout=WAIT)
    assert message is not None
    assert message.body == body


def test_precondition_failed_then_connection_still_usable(
    sync_conn: Connection, ch: Channel, names: Names
) -> None:
    queue = names.queue()
    ch.queue_declare(queue, durable=False, timeout=WAIT)
    with pytest.raises(rabbitry.PreconditionFailed) as info:
        ch.queue_declare(queue, durable=True, timeout=WAIT)
    assert info.value.reply_code == 406
    assert ch.is_closed
    assert isinstance(ch.close_exc, rabbitry.PreconditionFailed)
    with pytest.raises(rabbitry.InvalidStateError):
        ch.basic_publish("", queue, b"on a closed channel")
    assert sync_conn.is_open
    assert sync_conn.close_exc is None
    fresh = sync_conn.channel(timeout=WAIT)
    assert fresh.queue_declare(queue, passive=True, timeout=WAIT).queue == queue


def test_message_ack_from_another_thread(sync_conn: Connection, ch: Channel, names: Names) -> None:
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    ch.confirm_select(timeout=WAIT)
    publish_confirmed(ch, queue, b"ack me elsewhere")
    message = ch.basic_get(queue, timeout=WAIT)
    assert message is not None
    errors: list[BaseException] = []

    def ack() -> None:
        try:
            message.ack()
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=ack)
    worker.start()
    worker.join(WAIT)
    assert not errors
    # If the ack had not reached the broker, closing the channel would requeue it.
    ch.close(timeout=WAIT)
    other = sync_conn.channel(timeout=WAIT)
    time.sleep(0.2)
    assert ready_count(other, queue) == 0


def test_close_is_idempotent_and_later_use_fails(url: str) -> None:
    conn = Connection(url)
    conn.connect(timeout=WAIT)
    names_ = connection_threads(conn)
    assert set(names_) <= rabbitry_threads()
    conn.close()
    conn.close()
    assert conn.is_closed and not conn.is_open
    assert isinstance(conn.close_exc, rabbitry.ConnectionClosedByClient)
    assert threads_gone(names_)
    with pytest.raises(rabbitry.InvalidStateError):
        conn.channel(timeout=1)


def test_context_managers(url: str, names: Names) -> None:
    queue = names.queue()
    with Connection(url) as conn:
        io = connection_threads(conn)
        with conn.channel() as channel:
            channel.queue_declare(queue, timeout=WAIT)
        assert channel.is_closed
        assert conn.is_open
    assert conn.is_closed
    assert threads_gone(io)


# ====================================================================== many threads


@pytest.mark.timeout(90)
@pytest.mark.parametrize("layout", ["channel-per-thread", "shared-channel"])
def test_8_publishers_4_consumers_80k_exactly_once(
    sync_conn: Connection, names: Names, layout: str, caplog: pytest.LogCaptureFixture
) -> None:
    publishers, per_publisher, consumers = 8, 10_000, 4
    total = publishers * per_publisher
    queue = names.queue()
    setup = sync_conn.channel(timeout=WAIT)
    setup.queue_declare(queue, timeout=WAIT)

    shared = confirm_channel(sync_conn) if layout == "shared-channel" else None
    lock = threading.Lock()
    seen_ids: set[str] = set()
    seen_bodies: set[bytes] = set()
    deliveries = [0]
    all_received = threading.Event()
    errors: list[BaseException] = []
    start = threading.Barrier(publishers + consumers)
    deadline = time.monotonic() + 55

    def publish(t: int) -> None:
        try:
            ch = shared if shared is not None else confirm_channel(sync_conn)
            start.wait(WAIT)
            futures = []
            for i in range(per_publisher):
                key = f"{t}-{i}"
                futures.append(
                    ch.basic_publish("", queue, key.encode(), properties=Properties(message_id=key))
                )
            done, not_done = concurrent.futures.wait(
                futures,  # type: ignore[arg-type]
                timeout=max(1.0, deadline - time.monotonic()),
            )
            assert not not_done, f"{len(not_done)} confirms missing"
            for future in done:
                future.result()
        except BaseException as exc:
            errors.append(exc)

    def consume() -> None:
        try:
            start.wait(WAIT)
            while not all_received.is_set() and time.monotonic() < deadline:
                # A fresh channel per round: closing it requeues anything delivered to
                # a finished iterator but never yielded.
                ch = sync_conn.channel(timeout=WAIT)
                try:
                    for message in ch.consume(queue, prefetch=500, timeout=1):
                        message.ack()
                        with lock:
                            seen_ids.add(str(message.properties.message_id))
                            seen_bodies.add(message.body)
                            deliveries[0] += 1
                            if deliveries[0] >= total:
                                all_received.set()
                        if all_received.is_set() or time.monotonic() > deadline:
                            break
                finally:
                    ch.close(timeout=WAIT)
        except BaseException as exc:
            errors.append(exc)

    with caplog.at_level(logging.WARNING, logger="rabbitry"):
        threads = [threading.Thread(target=publish, args=(t,)) for t in range(publishers)]
        threads += [threading.Thread(target=consume) for _ in range(consumers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(70)
    assert not [t.name for t in threads if t.is_alive()]
    assert not errors, errors[:3]
    assert deliveries[0] == total
    assert len(seen_ids) == total
    assert seen_ids == {f"{t}-{i}" for t in range(publishers) for i in range(per_publisher)}
    assert len(seen_bodies) == total
    wait_ready(setup, queue, 0)
    assert setup.queue_declare(queue, passive=True, timeout=WAIT).consumer_count == 0
    assert sync_conn.is_open and sync_conn.close_exc is None
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not problems, problems[:3]


def test_publish_from_many_threads_on_one_channel_without_confirms(
    sync_conn: Connection, names: Names
) -> None:
    # Frames of concurrent publishes must never interleave (a torn frame would make
    # the broker close the connection with a frame/syntax error).
    ch = sync_conn.channel(timeout=WAIT)
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    body = b"x" * 200_000  # several frames each
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            barrier.wait(WAIT)
            for _ in range(20):
                ch.basic_publish("", queue, body)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publish) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 3)
    assert not errors
    wait_ready(ch, queue, 120)
    assert sync_conn.is_open


# ===================================================================== heartbeats


def _slow_consumer_round(conn: Connection, queue: str, block: float) -> tuple[float, float]:
    """Consume one message whose callback blocks ``block`` s; return (start, end)."""
    ch = conn.channel(timeout=WAIT)
    ch.queue_declare(queue, timeout=WAIT)
    span: list[float] = []
    returned = threading.Event()

    def slow(message: Message) -> None:
        span.append(time.monotonic())
        time.sleep(block)
        message.ack()
        span.append(time.monotonic())
        returned.set()

    ch.basic_consume(queue, slow, timeout=WAIT)
    ch.basic_publish("", queue, b"slow")
    assert returned.wait(block + WAIT)
    assert conn.is_open
    assert conn.close_exc is None
    # A further RPC works, on the same channel and on a new one.
    assert ch.queue_declare(queue, passive=True, timeout=WAIT).queue == queue
    assert conn.channel(timeout=WAIT).is_open
    return span[0], span[1]


def test_slow_handler_does_not_stop_heartbeats(url: str, names: Names) -> None:
    conn = Connection(url, heartbeat=1)
    conn.connect(timeout=WAIT)
    try:
        assert conn.heartbeat == 1
        start, end = _slow_consumer_round(conn, names.queue(), 3.5)
        assert end - start >= 3.5
    finally:
        conn.close(timeout=5)


def test_slow_handler_heartbeats_observed_on_the_wire(proxy: TcpProxy, names: Names) -> None:
    beats: list[float] = []

    def tap(direction: str, data: bytes) -> None:
        if direction == "upstream":
            now = time.monotonic()
            beats.extend([now] * data.count(HEARTBEAT_FRAME))

    proxy.tap(tap)
    conn = Connection(proxy.url(), heartbeat=1)
    conn.connect(timeout=WAIT)
    try:
        assert conn.heartbeat == 1
        start, end = _slow_consumer_round(conn, names.queue(), 3.5)
        during = [b for b in beats if start <= b <= end]
        assert len(during) >= 2, f"{len(during)} heartbeats sent while the handler blocked"
        assert not proxy.tap_errors
    finally:
        conn.close(timeout=5)


# ======================================================== bounded close and timeouts


def test_close_while_the_broker_is_unreachable_returns_in_bounded_time(
    proxy: TcpProxy,
) -> None:
    conn = Connection(proxy.url())
    conn.connect(timeout=WAIT)
    conn.channel(timeout=WAIT)
    threads = connection_threads(conn)
    proxy.blackhole()
    result: list[float] = []
    errors: list[BaseException] = []

    def close() -> None:
        t0 = time.monotonic()
        try:
            conn.close(timeout=2)
        except BaseException as exc:
            errors.append(exc)
        result.append(time.monotonic() - t0)

    closer = threading.Thread(target=close)
    closer.start()
    closer.join(15)
    assert not closer.is_alive(), "close() did not return"
    assert not errors
    assert result[0] >= 1.5, "close() returned before its timeout with the broker silent"
    assert threads_gone(threads, timeout=1.0)
    assert conn.is_closed


def test_close_while_a_consumer_callback_blocks_returns_in_bounded_time(
    url: str, names: Names
) -> None:
    conn = Connection(url)
    conn.connect(timeout=WAIT)
    threads = connection_threads(conn)
    ch = conn.channel(timeout=WAIT)
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    release = threading.Event()
    entered = threading.Event()
    after: list[BaseException | None] = []

    def stuck(message: Message) -> None:
        entered.set()
        release.wait(30)
        try:
            message.ack()  # the channel is gone by now
            after.append(None)
        except BaseException as exc:
            after.append(exc)

    ch.basic_consume(queue, stuck, timeout=WAIT)
    for _ in range(3):
        ch.basic_publish("", queue, b"m")
    assert entered.wait(WAIT)
    t0 = time.monotonic()
    conn.close(timeout=2)
    assert time.monotonic() - t0 < WAIT  # a deadline against a hang, not a measurement
    assert conn.is_closed
    io, _ = threads
    assert threads_gone((io,), timeout=1.0)
    release.set()
    assert threads_gone(threads), "the dispatcher thread outlived the blocking callback"
    assert after and isinstance(after[0], rabbitry.InvalidStateError)


def test_blocking_call_times_out_through_a_blackhole(proxy: TcpProxy, names: Names) -> None:
    conn = Connection(proxy.url())
    conn.connect(timeout=WAIT)
    try:
        ch = conn.channel(timeout=WAIT)
        proxy.blackhole()
        t0 = time.monotonic()
        with pytest.raises(rabbitry.Timeout) as info:
            ch.queue_declare(names.queue(), timeout=0.5)
        elapsed = time.monotonic() - t0
        assert isinstance(info.value, TimeoutError)
        assert 0.4 <= elapsed < WAIT, elapsed  # its own timeout ended it, not a deadline
        t0 = time.monotonic()
        with pytest.raises(rabbitry.Timeout):
            conn.channel(timeout=0.5)
        assert 0.4 <= time.monotonic() - t0 < WAIT
    finally:
        conn.close(timeout=1)


def test_connect_times_out_through_a_blackhole(proxy: TcpProxy) -> None:
    proxy.blackhole()
    conn = Connection(proxy.url())
    t0 = time.monotonic()
    with pytest.raises(rabbitry.Timeout):
        conn.connect(timeout=0.5)
    assert 0.4 <= time.monotonic() - t0 < WAIT
    assert not conn.is_open
    conn.close()  # no-op


def test_close_while_other_threads_are_mid_call(url: str, names: Names) -> None:
    """Threads blocked in calls without a timeout all return with an error on close()."""
    conn = Connection(url)
    conn.connect(timeout=WAIT)
    threads_ = connection_threads(conn)
    channels = [conn.channel(timeout=WAIT) for _ in range(4)]
    queue = names.queue()
    channels[0].queue_declare(queue, timeout=WAIT)
    outcomes: list[BaseException] = []
    busy = threading.Barrier(len(channels) + 1)

    def hammer(ch: Channel) -> None:
        busy.wait(WAIT)
        while True:
            try:
                ch.queue_declare(queue, passive=True)  # no timeout: only close ends it
                ch.basic_publish("", queue, b"x")
            except BaseException as exc:
                outcomes.append(exc)
                return

    workers = [threading.Thread(target=hammer, args=(ch,)) for ch in channels]
    for worker in workers:
        worker.start()
    busy.wait(WAIT)
    time.sleep(0.1)
    conn.close(timeout=5)
    for worker in workers:
        worker.join(WAIT)
    assert not [w for w in workers if w.is_alive()], "a caller hung after close()"
    assert len(outcomes) == len(channels)
    for exc in outcomes:
        assert isinstance(exc, rabbitry.AMQPError), repr(exc)
    assert threads_gone(threads_)


def test_connection_lost_wakes_a_blocked_consumer(proxy: TcpProxy, names: Names) -> None:
    conn = Connection(proxy.url(), recovery=None)
    conn.connect(timeout=WAIT)
    try:
        ch = conn.channel(timeout=WAIT)
        queue = names.queue()
        ch.queue_declare(queue, timeout=WAIT)
        outcome: list[BaseException | None] = []
        iterating = threading.Event()

        def consume_forever() -> None:
            try:
                iterating.set()
                for _ in ch.consume(queue):  # no idle timeout
                    pass
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        consumer = threading.Thread(target=consume_forever)
        consumer.start()
        assert iterating.wait(WAIT)
        assert wait_until(
            lambda: ch.queue_declare(queue, passive=True, timeout=WAIT).consumer_count == 1
        )
        assert proxy.reset() == 1
        consumer.join(WAIT)
        assert not consumer.is_alive(), "the consumer stayed blocked after the connection died"
        assert len(outcome) == 1
        assert isinstance(outcome[0], rabbitry.AMQPConnectionError), repr(outcome[0])
        assert isinstance(conn.wait_closed(timeout=WAIT), rabbitry.ConnectionLost)
        assert conn.is_closed
        assert isinstance(conn.close_exc, rabbitry.ConnectionLost)
        assert isinstance(ch.wait_closed(timeout=WAIT), rabbitry.ConnectionLost)
        with pytest.raises(rabbitry.AMQPError):
            ch.queue_declare(queue, passive=True, timeout=1)
    finally:
        t0 = time.monotonic()
        conn.close(timeout=2)
        assert time.monotonic() - t0 < WAIT


# ================================================ calls made from inside callbacks


def test_sync_calls_from_inside_a_callback(
    sync_conn: Connection, ch: Channel, names: Names
) -> None:
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    outcome: list[Any] = []
    done = threading.Event()

    def on_message(message: Message) -> None:
        try:
            # A blocking RPC on the message's own channel and on a new channel, and a
            # confirmed publish, all from the dispatcher thread.
            count = ch.queue_declare(queue, passive=True, timeout=5).consumer_count
            other = sync_conn.channel(timeout=5)
            other.confirm_select(timeout=5)
            future = other.basic_publish("", queue, b"from callback " + message.body)
            assert future is not None
            future.result(5)
            other.close(timeout=5)
            message.ack()
            outcome.append((message.body, count))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            if len(outcome) >= 2:
                done.set()

    tag = ch.basic_consume(queue, on_message, timeout=WAIT)
    ch.basic_publish("", queue, b"1")
    assert done.wait(WAIT * 2)
    ch.basic_cancel(tag, timeout=WAIT)
    assert outcome[0] == (b"1", 1)
    assert outcome[1] == (b"from callback 1", 1)


def test_close_from_inside_a_callback(url: str, names: Names) -> None:
    conn = Connection(url)
    conn.connect(timeout=WAIT)
    threads = connection_threads(conn)
    ch = conn.channel(timeout=WAIT)
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    closed = threading.Event()
    errors: list[BaseException] = []

    def on_message(message: Message) -> None:
        try:
            message.ack()
            conn.close(timeout=5)
        except BaseException as exc:
            errors.append(exc)
        closed.set()

    ch.basic_consume(queue, on_message, timeout=WAIT)
    ch.basic_publish("", queue, b"bye")
    assert closed.wait(WAIT)
    assert not errors
    assert conn.is_closed
    assert threads_gone(threads)


def test_close_callback_runs_on_the_dispatcher_thread(url: str) -> None:
    conn = Connection(url)
    conn.connect(timeout=WAIT)
    _, dispatcher = connection_threads(conn)
    got: list[tuple[BaseException, str]] = []
    conn.add_close_callback(lambda exc: got.append((exc, threading.current_thread().name)))
    conn.add_blocked_callback(lambda reason: None)
    conn.close(timeout=5)
    # Callbacks queued before the dispatcher stopped still ran.
    assert wait_until(lambda: bool(got), timeout=2)
    assert isinstance(got[0][0], rabbitry.ConnectionClosedByClient)
    assert got[0][1] == dispatcher


# ============================================================= regressions


def test_sync_call_from_a_callback_while_the_dispatcher_is_full(url: str, names: Names) -> None:
    conn = Connection(url)
    conn.callback_queue_size = 4  # small, so 20 deliveries overflow it
    conn.connect(timeout=WAIT)
    try:
        ch = conn.channel(timeout=WAIT)
        queue = names.queue()
        ch.queue_declare(queue, timeout=WAIT)
        ch.confirm_select(timeout=WAIT)
        publish_confirmed(ch, queue, *(b"%d" % i for i in range(20)))
        outcome: list[Any] = []
        done = threading.Event()

        def on_message(message: Message) -> None:
            if outcome:
                return
            # Let the other 19 deliveries arrive and overflow the queue first.
            dispatcher = conn._dispatcher
            outcome.append(wait_until(lambda: dispatcher is not None and dispatcher._paused))
            try:
                outcome.append(ch.queue_declare(queue, passive=True, timeout=WAIT).queue)
            except BaseException as exc:
                outcome.append(exc)
            done.set()

        ch.basic_consume(queue, on_message, no_ack=True, timeout=WAIT)
        assert done.wait(3 * WAIT)
        assert outcome == [True, queue], outcome  # the dispatcher was full, the call worked
    finally:
        conn.close(timeout=2)


def test_consume_iterator_releases_unyielded_messages(
    sync_conn: Connection, ch: Channel, names: Names
) -> None:
    # Regression: deliveries that reached the iterator but were never yielded stayed
    # unacked on the (still open) channel after the loop ended, invisible to others.
    queue = names.queue()
    ch.queue_declare(queue, timeout=WAIT)
    ch.confirm_select(timeout=WAIT)
    publish_confirmed(ch, queue, *(b"%d" % i for i in range(10)))
    for message in ch.consume(queue, prefetch=10, timeout=1):
        message.ack()
        break
    # The channel stays open; the 9 other messages should be back in the queue.
    other = sync_conn.channel(timeout=WAIT)
    wait_ready(other, queue, 9, timeout=3)


def test_close_with_a_full_callback_queue_ends_the_dispatcher(url: str, names: Names) -> None:
    # Regression: Dispatcher.stop gave up queuing its sentinel into a full queue and the
    # worker then waited in queue.get() forever: a leaked rabbitry-callbacks thread.
    conn = Connection(url)
    conn.callback_queue_size = 4
    conn.connect(timeout=WAIT)
    io, dispatcher_name = connection_threads(conn)
    dispatcher = conn._dispatcher
    assert dispatcher is not None
    release = threading.Event()
    try:
        ch = conn.channel(timeout=WAIT)
        queue = names.queue()
        ch.queue_declare(queue, timeout=WAIT)
        ch.confirm_select(timeout=WAIT)
        entered = threading.Event()

        def stuck(message: Message) -> None:
            entered.set()
            release.wait(30)

        ch.basic_consume(queue, stuck, no_ack=True, timeout=WAIT)
        # 1 running, then 4 queued: exactly full, nothing overflows, reading not paused.
        publish_confirmed(ch, queue, b"first")
        assert entered.wait(WAIT)
        publish_confirmed(ch, queue, *(b"%d" % i for i in range(4)))
        assert wait_until(lambda: dispatcher._queue.qsize() == 4)
        assert not dispatcher._paused
        t0 = time.monotonic()
        conn.close(timeout=2)
        assert time.monotonic() - t0 < WAIT
        release.set()
        assert threads_gone((io, dispatcher_name), timeout=3), "dispatcher thread leaked"
    finally:
        release.set()
        conn.close(timeout=2)
        if dispatcher.thread.is_alive():  # unstick it so the leak check of later tests passes
            wait_until(lambda: dispatcher._queue.qsize() == 0, timeout=3)
            dispatcher._queue.put(dispatcher._STOP)
            dispatcher.thread.join(WAIT)

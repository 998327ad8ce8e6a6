"""The sync ``Consumer``'s handler threads against the real broker.

The handler threads take the messages waiting for them from one queue, in delivery
order, and report back to the IO thread in bursts (``rabbitry.sync._consumer_threads``).
These tests pin what that must not change: a busy thread goes on without the IO thread,
the messages no thread has started go back to the queue on stop and are forgotten when
their channel closes, a copy of a message in flight waits for it (dedup), an envelope
keeps its place in the order, a handler that raises ``SystemExit`` fails only its
message, and a failing dedup store stalls neither the consumer nor its stop.
"""

from __future__ import annotations

import struct
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from rabbitry import Connection, Message, Properties
from rabbitry.consumer import MemoryDedupStore
from rabbitry.sync._connection import portal_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.integration.conftest import Names

WAIT = 10.0


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


@pytest.fixture
def sync_conn(url: str) -> Iterator[Connection]:
    connection = Connection(url, connection_timeout=5)
    connection.connect(timeout=WAIT)
    try:
        yield connection
    finally:
        connection.close(timeout=5)


def declare(conn: Connection, queue: str, arguments: dict[str, Any] | None = None) -> None:
    ch = conn.channel(timeout=WAIT)
    ch.queue_declare(queue, arguments=arguments, timeout=WAIT)
    ch.close(timeout=WAIT)


def publish(conn: Connection, queue: str, *messages: tuple[bytes, Properties | None]) -> None:
    ch = conn.channel(timeout=WAIT)
    ch.confirm_select(timeout=WAIT)
    futures = [ch.basic_publish("", queue, body, properties=props) for body, props in messages]
    for future in futures:
        assert future is not None
        future.result(WAIT)
    ch.close(timeout=WAIT)


def plain(*payloads: bytes) -> list[tuple[bytes, Properties | None]]:
    return [(body, None) for body in payloads]


def ready(conn: Connection, queue: str) -> int:
    ch = conn.channel(timeout=WAIT)
    try:
        return ch.queue_declare(queue, passive=True, timeout=WAIT).message_count
    finally:
        ch.close(timeout=WAIT)


def test_a_busy_handler_thread_takes_the_next_message_without_the_io_thread(
    sync_conn: Connection, names: Names
) -> None:
    queue = names.queue()
    declare(sync_conn, queue)
    publish(sync_conn, queue, *plain(*bodies(10)))
    release = threading.Event()
    seen: list[bytes] = []

    def handler(message: Message) -> None:
        if not seen:
            assert release.wait(WAIT)
        seen.append(message.body)

    io_blocked, io_release = threading.Event(), threading.Event()

    def block_io_thread() -> None:
        io_blocked.set()
        io_release.wait(WAIT)

    with sync_conn.consumer(queue, handler, prefetch=100) as consumer:
        try:
            assert wait_until(lambda: consumer.stats.delivered == 10)
            portal_of(sync_conn).submit(block_io_thread)
            assert io_blocked.wait(WAIT)
            release.set()
            # The IO thread is blocked: the handler thread finds the other nine queued.
            assert wait_until(lambda: len(seen) == 10)
            assert consumer.stats.acked == 0  # acks are the IO thread's, after it wakes
        finally:
            release.set()
            io_release.set()
        assert wait_until(lambda: consumer.stats.acked == 10)
    assert seen == bodies(10)
    assert ready(sync_conn, queue) == 0


def test_stop_requeues_the_messages_no_handler_thread_has_started(
    sync_conn: Connection, names: Names
) -> None:
    queue = names.queue()
    declare(sync_conn, queue)
    publish(sync_conn, queue, *plain(*bodies(10)))
    release = threading.Event()
    running: list[bytes] = []
    lock = threading.Lock()

    def handler(message: Message) -> None:
        with lock:
            running.append(message.body)
        assert release.wait(WAIT)

    consumer = sync_conn.consumer(queue, handler, concurrency=2, prefetch=100)
    consumer.start(timeout=WAIT)
    stopper: threading.Thread | None = None
    try:
        assert wait_until(lambda: len(running) == 2 and consumer.stats.delivered == 10)
        stopper = threading.Thread(target=consumer.stop, kwargs={"timeout": WAIT})
        stopper.start()
        # stop() gives back the eight waiting at once, while the two handlers still run.
        assert wait_until(lambda: consumer.stats.released == 8)
        assert consumer.stats.acked == 0
    finally:
        release.set()
        if stopper is not None:
            stopper.join(WAIT)
    assert stopper is not None and not stopper.is_alive()
    assert sorted(running) == bodies(2)
    assert consumer.stats.acked == 2
    assert ready(sync_conn, queue) == 8


def test_channel_closed_under_the_consumer_forgets_the_queued_messages(
    sync_conn: Connection, names: Names
) -> None:
    queue = names.queue()
    declare(sync_conn, queue)
    publish(sync_conn, queue, *plain(*bodies(5)))
    started, release = threading.Event(), threading.Event()
    seen: list[tuple[bytes, bool]] = []

    def handler(message: Message) -> None:
        if not seen:
            started.set()
            assert release.wait(WAIT)
        seen.append((message.body, message.redelivered))

    with sync_conn.consumer(queue, handler, prefetch=100) as consumer:
        try:
            assert wait_until(lambda: consumer.stats.delivered == 5)
            # m0 is in the handler (a delivery still queued when its channel dies is
            # forgotten, m0 too if the handler has not taken it yet)
            assert started.wait(WAIT)
            first = consumer.channel
            # An unknown delivery tag: the broker closes the channel (406).
            portal_of(sync_conn).submit(first.basic_ack, 999)
            assert wait_until(lambda: consumer.stats.resubscribed == 1)
            assert wait_until(lambda: consumer.stats.delivered == 10)
        finally:
            release.set()
        # The four queued behind the blocked handler were not handled on the dead
        # channel: they came back, after m0 itself, redelivered on the new subscription.
        assert wait_until(lambda: consumer.stats.acked == 5)
    assert seen == [(b"m0", False)] + [(body, True) for body in bodies(5)]
    assert ready(sync_conn, queue) == 0


def test_a_copy_of_a_message_in_flight_waits_for_it_and_is_deduplicated(
    sync_conn: Connection, names: Names
) -> None:
    queue = names.queue()
    declare(sync_conn, queue)
    publish(
        sync_conn,
        queue,
        (b"x", Properties(message_id="x")),
        (b"x", Properties(message_id="x")),
        (b"y", Properties(message_id="y")),
    )
    calls: list[bytes] = []
    lock = threading.Lock()
    holder: list[Any] = []

    def handler(message: Message) -> None:
        with lock:
            calls.append(message.body)
        if message.body == b"x":  # the copy has arrived meanwhile, and two threads are free
            assert wait_until(lambda: holder[0].stats.delivered == 3)

    consumer = sync_conn.consumer(
        queue, handler, concurrency=2, prefetch=100, dedup=MemoryDedupStore()
    )
    holder.append(consumer)
    with consumer:
        assert wait_until(lambda: consumer.stats.acked == 3)
    assert sorted(calls) == [b"x", b"y"]
    assert consumer.stats.deduplicated == 1
    assert ready(sync_conn, queue) == 0


def test_an_envelope_between_messages_keeps_its_place(sync_conn: Connection, names: Names) -> None:
    queue = names.queue()
    declare(sync_conn, queue)
    records = [b"r0", b"r1", b"r2"]
    envelope = b"".join(struct.pack(">I", len(r)) + r for r in records)
    spring = Properties(headers={"springBatchFormat": "lengthHeader4"})
    publish(
        sync_conn,
        queue,
        (b"m0", None),
        (envelope, spring),
        (b"m1", None),
        (b"m2", None),
    )
    seen: list[bytes] = []

    def handler(message: Message) -> None:
        seen.append(message.body)

    with sync_conn.consumer(queue, handler, prefetch=100) as consumer:
        assert wait_until(lambda: consumer.stats.acked == 4)
    assert seen == [b"m0", b"r0", b"r1", b"r2", b"m1", b"m2"]
    assert ready(sync_conn, queue) == 0


def test_a_handler_raising_system_exit_fails_only_its_message(
    sync_conn: Connection, names: Names
) -> None:
    queue, dlq = names.queue("work"), names.queue("dlq")
    declare(sync_conn, dlq)
    declare(sync_conn, queue, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    publish(sync_conn, queue, *plain(b"m0", b"exit", b"m2"))
    seen: list[bytes] = []

    def handler(message: Message) -> None:
        seen.append(message.body)
        if message.body == b"exit":
            raise SystemExit(3)

    with sync_conn.consumer(queue, handler) as consumer:
        assert wait_until(lambda: consumer.stats.acked == 2)
        assert wait_until(lambda: ready(sync_conn, dlq) == 1)
    assert seen == [b"m0", b"exit", b"m2"]
    assert consumer.stats.failed == 1
    assert sync_conn.is_open
    assert ready(sync_conn, queue) == 0


def test_auto_ack_consumer_hands_every_message_to_its_threads_in_order(
    sync_conn: Connection, names: Names
) -> None:
    queue = names.queue()
    declare(sync_conn, queue)
    publish(sync_conn, queue, *plain(*bodies(50)))
    seen: list[bytes] = []

    def handler(message: Message) -> None:
        seen.append(message.body)

    with sync_conn.consumer(queue, handler, ack="auto", prefetch=5) as consumer:
        assert wait_until(lambda: len(seen) == 50)
    assert seen == bodies(50)
    assert consumer.stats.acked == 0
    assert ready(sync_conn, queue) == 0


def test_an_auto_ack_handler_thread_gets_replies_on_its_own_connection_with_a_full_inbox(
    sync_conn: Connection, names: Names
) -> None:
    # The inbox fills (prefetch 5, 200 waiting) while each handler thread makes a
    # request on the consumer's own connection: its reply must be read although the
    # full inbox pauses reading.
    queue = names.queue()
    declare(sync_conn, queue)
    publish(sync_conn, queue, *plain(*bodies(200)))
    other = sync_conn.channel(timeout=WAIT)
    seen: list[bytes] = []

    def handler(message: Message) -> None:
        other.queue_declare(queue, passive=True, timeout=WAIT)
        seen.append(message.body)

    with sync_conn.consumer(queue, handler, ack="auto", prefetch=5) as consumer:
        assert wait_until(lambda: len(seen) == 200, 6 * WAIT), f"{len(seen)} of 200 handled"
    assert seen == bodies(200)
    assert consumer.stats.failed == 0
    other.close(timeout=WAIT)


class _FailingStore(MemoryDedupStore):
    """A dedup store whose ``seen`` fails for one id and whose ``add`` always fails."""

    def __init__(self, bad_id: str) -> None:
        super().__init__()
        self.bad_id = bad_id

    def seen(self, key: str) -> bool:
        if key == self.bad_id:
            raise ConnectionError("store unreachable")
        return super().seen(key)

    def add(self, key: str) -> None:
        raise ConnectionError("store unreachable")


def test_a_failing_dedup_store_neither_stalls_the_consumer_nor_its_stop(
    sync_conn: Connection, names: Names, caplog: pytest.LogCaptureFixture
) -> None:
    queue = names.queue()
    declare(sync_conn, queue)
    publish(sync_conn, queue, *[(body, Properties(message_id=body.decode())) for body in bodies(3)])
    seen: list[bytes] = []

    def handler(message: Message) -> None:
        seen.append(message.body)

    consumer = sync_conn.consumer(queue, handler, prefetch=100, dedup=_FailingStore("m0"))
    consumer.start(timeout=WAIT)
    stopper = threading.Thread(target=consumer.stop, daemon=True)
    try:
        # m0's check failed: it stays unsettled, and the two behind it are handled.
        assert wait_until(lambda: consumer.stats.acked == 2)
    finally:
        stopper.start()
    stopper.join(WAIT)
    assert not stopper.is_alive(), "stop() waited for a message that was done"
    assert seen == [b"m1", b"m2"]
    assert "store unreachable" in caplog.text
    assert ready(sync_conn, queue) == 1

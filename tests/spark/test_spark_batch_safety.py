"""Non-destructive batch reads next to delivery limits, connection resets and services.

The partition functions run here without Spark (what an executor's task runs), against
the broker at ``RABBITMQ_URL`` (the 3.x run and the ``--rabbitmq4`` run), through the TCP
fault proxy where a reset is needed.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from tests.spark.conftest import broker_address, depth, publish, through
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry.spark._batch import (
    WINDOW,
    DeliveryCountRefused,
    DeliveryLimitReached,
    QueueBusy,
    ReadInterrupted,
    browse_share,
    consume_share,
    limit_marker,
    plan_queue_read,
)
from rabbitry.spark._options import parse_read_options

if TYPE_CHECKING:
    from collections.abc import Iterator

pytest.importorskip("pyarrow")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def declare(conn: rabbitry.Connection) -> Iterator[Any]:
    """``declare(kind, **arguments)``: a uniquely named queue, deleted afterwards (with
    its delivery-limit marker)."""
    channel = conn.channel()
    names: list[str] = []

    def make(kind: str = "classic", **arguments: Any) -> str:
        name = f"rabbitry-spark-safety-{kind}-{uuid.uuid4().hex[:10]}"
        if kind != "classic":
            arguments["x-queue-type"] = kind
        channel.queue_declare(name, durable=True, arguments=arguments)
        names.append(name)
        return name

    yield make
    for name in names:
        channel.queue_delete(name)
        channel.queue_delete(limit_marker(name))


def _options(url: str, queue: str, kind: str, **extra: str) -> Any:
    options = {"url": url, "queue": queue, "queueType": kind, **extra}
    if kind == "quorum":
        options.setdefault("acceptDeliveryCount", "true")
    return parse_read_options(options)


def _read(options: Any) -> list[int]:
    """A planned, non-destructive read of the whole queue: the message bodies, in order."""
    snapshot = plan_queue_read(options)
    bodies: list[int] = []
    for batch in browse_share(options, 0, snapshot.ready, snapshot.delivery_limit):
        bodies += [int(b) for b in batch.column("body").to_pylist()]
    return bodies


def _drain(conn: rabbitry.Connection, queue: str) -> list[int]:
    """Consume (and acknowledge) everything in ``queue``."""
    channel = conn.channel()
    got = []
    try:
        while (message := channel.basic_get(queue, no_ack=True, timeout=10)) is not None:
            got.append(int(message.body))
    finally:
        channel.close()
    return got


# ---------------------------------------------------------------- delivery limit


@pytest.mark.parametrize("stated", ["argument 5", "broker default"])
def test_repeated_reads_never_make_the_broker_drop_a_message(
    url: str,
    conn: rabbitry.Connection,
    declare: Any,
    broker_version: tuple[int, ...],
    management_url: str | None,
    stated: str,
) -> None:
    if stated == "argument 5":
        queue = declare("quorum", **{"x-delivery-limit": 5})
        limit: int | None = 5
    else:
        queue = declare("quorum")
        limit = 20 if broker_version >= (4,) else None
    publish(conn, queue, 200)
    # The management API (the --rabbitmq4 run has one) reads the limit; else state it.
    told = {"managementUrl": management_url} if management_url else {}
    if not management_url and limit is not None:
        told = {"deliveryLimit": str(limit)}
    elif not management_url:
        told = {"deliveryLimit": "-1"}
    options = _options(url, queue, "quorum", **told)
    refused = 0
    for _ in range(25):
        try:
            rows = _read(options)
        except DeliveryLimitReached as exc:
            refused += 1
            assert exc.queue == queue and exc.limit == limit
            assert repr(queue) in str(exc) and "stream queue" in str(exc)
        else:
            assert sorted(rows) == list(range(200))
        _wait_depth(conn, queue, 200)  # the broker drops none
    if limit is None:
        assert refused == 0
    else:
        # The read that meets count limit-2 refuses, and so is every read after it.
        assert refused == 25 - (limit - 2)
    # The way out: consume the queue; emptying it lifts the refusal.
    destructive = _options(url, queue, "quorum", consume="destructive")
    consumed = [
        int(body)
        for batch in consume_share(destructive, plan_queue_read(destructive).ready, 0)
        for body in batch.column("body").to_pylist()
    ]
    assert sorted(consumed) == list(range(200))
    assert _read(options) == []


def test_a_quorum_read_whose_limit_is_unknown_is_refused(
    url: str, conn: rabbitry.Connection, declare: Any
) -> None:
    queue = declare("quorum")
    publish(conn, queue, 3)
    with pytest.raises(DeliveryCountRefused, match="option deliveryLimit") as info:
        plan_queue_read(_options(url, queue, "quorum"))
    assert "managementUrl" in str(info.value)


def test_an_abandoned_read_returns_only_what_it_handed_out_plus_one_window(
    url: str, conn: rabbitry.Connection, declare: Any
) -> None:
    # Spark stops reading after the first batch (df.limit): what the read never
    # fetched keeps its delivery count.
    queue = declare("quorum")
    total = 3 * WINDOW
    publish(conn, queue, total)
    options = _options(url, queue, "quorum", deliveryLimit="20")
    reader = browse_share(options, 0, total, plan_queue_read(options).delivery_limit)
    first = next(reader)
    reader.close()
    assert first.num_rows == WINDOW
    counts: dict[int | None, int] = {}
    for batch in browse_share(options, 0, total, plan_queue_read(options).delivery_limit):
        for count in batch.column("delivery_count").to_pylist():
            counts[count] = counts.get(count, 0) + 1
    assert counts == {1: WINDOW, None: total - WINDOW}


# ---------------------------------------------------------------- connection resets


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_a_reset_before_any_row_is_handed_out_reads_the_queue_again(
    url: str, conn: rabbitry.Connection, declare: Any, kind: str
) -> None:
    # One window: the rows reach Spark only once the whole share is held, so a reset
    # at any moment either restarts the read or comes after it.
    queue = declare(kind)
    total = WINDOW // 2
    publish(conn, queue, total)
    with TcpProxy(*broker_address(url)) as proxy:
        options = _options(through(proxy.url(), url), queue, kind, deliveryLimit="20")

        def reset_once_reading() -> None:
            deadline = time.monotonic() + 60
            while depth(conn, queue) == total and time.monotonic() < deadline:
                time.sleep(0.005)
            proxy.reset()

        resetter = threading.Thread(target=reset_once_reading)
        resetter.start()
        rows = _read(options)
        resetter.join()
    if kind == "classic":
        assert rows == list(range(total))
    else:
        assert sorted(rows) == list(range(total))
    _wait_depth(conn, queue, total)


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_a_reset_after_rows_reached_spark_fails_the_task(
    url: str, conn: rabbitry.Connection, declare: Any, kind: str
) -> None:
    queue = declare(kind)
    total = 3 * WINDOW
    publish(conn, queue, total)
    rows: list[int] = []
    with TcpProxy(*broker_address(url)) as proxy:
        options = _options(through(proxy.url(), url), queue, kind, deliveryLimit="20")
        snapshot = plan_queue_read(options)
        with pytest.raises(ReadInterrupted, match="handed to Spark"):
            for batch in browse_share(options, 0, snapshot.ready, snapshot.delivery_limit):
                rows += [int(b) for b in batch.column("body").to_pylist()]
                if len(rows) == WINDOW:
                    assert proxy.reset() >= 1
    assert len(rows) == WINDOW and len(set(rows)) == WINDOW
    _wait_depth(conn, queue, total)
    assert sorted(_drain(conn, queue)) == list(range(total))


@pytest.mark.parametrize("kind", ["classic", "quorum"])
def test_a_destructive_read_through_a_reset_neither_repeats_nor_loses(
    url: str, conn: rabbitry.Connection, declare: Any, kind: str
) -> None:
    queue = declare(kind)
    total = 6000
    publish(conn, queue, total)
    rows: list[int] = []
    with TcpProxy(*broker_address(url)) as proxy:
        options = _options(
            through(proxy.url(), url), queue, kind, consume="destructive", prefetch="1000"
        )
        try:
            for batch in consume_share(options, total, 0):
                rows += [int(b) for b in batch.column("body").to_pylist()]
                if len(rows) == 500:
                    assert proxy.reset() >= 1
        except ReadInterrupted:
            pass  # a loud failure is allowed; a wrong result is not
    assert len(rows) == len(set(rows)), "a message was returned twice"
    left = _drain(conn, queue)
    assert not set(rows) & set(left)
    assert sorted(rows + left) == list(range(total))


def _wait_depth(conn: rabbitry.Connection, queue: str, expected: int) -> None:
    deadline = time.monotonic() + 30
    while depth(conn, queue) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert depth(conn, queue) == expected


# ---------------------------------------------------------------- other consumers


@pytest.mark.parametrize(
    ("kind", "arguments"),
    [
        ("classic", {}),
        ("classic", {"x-single-active-consumer": True}),
        ("quorum", {}),
        ("quorum", {"x-single-active-consumer": True}),
    ],
    ids=["classic", "classic-sac", "quorum", "quorum-sac"],
)
def test_a_service_consuming_the_queue_during_a_read_is_never_refused(
    url: str, conn: rabbitry.Connection, declare: Any, kind: str, arguments: dict[str, Any]
) -> None:
    queue = declare(kind, **arguments)
    total = 3 * WINDOW
    publish(conn, queue, total)
    options = _options(url, queue, kind, deliveryLimit="20")
    snapshot = plan_queue_read(options)
    handled: list[int] = []
    errors: list[BaseException] = []
    started = threading.Event()

    def service() -> None:
        try:
            with rabbitry.Connection(url) as own:
                channel = own.channel()
                channel.basic_qos(100)

                def handle(message: Any) -> None:
                    handled.append(int(message.body))
                    message.ack()

                channel.basic_consume(queue, handle)
                started.set()
                deadline = time.monotonic() + 60
                while len(handled) < total and time.monotonic() < deadline:
                    time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)
            started.set()

    rows: list[int] = []
    thread = threading.Thread(target=service)
    with pytest.raises(QueueBusy, match="other consumer"):
        for batch in browse_share(options, 0, snapshot.ready, snapshot.delivery_limit):
            rows += [int(b) for b in batch.column("body").to_pylist()]
            if not thread.is_alive() and not started.is_set():
                thread.start()  # the service (re)connects while the read holds messages
                assert started.wait(30)
    thread.join()
    assert errors == [], f"the service's consume failed: {errors!r}"
    # The service got every message, the read's ones once it let go of them.
    assert sorted(set(handled)) == list(range(total))
    assert rows == list(range(len(rows))) or kind == "quorum"


def test_a_queue_with_a_consumer_is_refused_when_planned_naming_the_count(
    url: str, conn: rabbitry.Connection, declare: Any
) -> None:
    queue = declare("classic")
    publish(conn, queue, 10)
    channel = conn.channel()
    channel.basic_qos(1)
    channel.basic_consume(queue, lambda message: None)
    with pytest.raises(QueueBusy, match=r"has 1 consumer\(s\).*consume=destructive"):
        plan_queue_read(_options(url, queue, "classic"))
    channel.close()

"""Unit tests of the consumer's building blocks (no broker).

MemoryDedupStore on a fake clock (TTL, LRU order, eviction), ConsumerStats, the
argument validation of ``AsyncConnection.consumer(...)`` (every error names the field
it is about), the prefetch floor (``prefetch >= concurrency`` and ``>= batch_size``) and
the validation of what a batch handler returns. The broker-facing paths are in
``tests/integration/test_consumer.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

import rabbitry
from rabbitry._consumer.batches import failed_items
from rabbitry.consumer import (
    AsyncConsumer,
    ConsumerStats,
    DedupStore,
    MemoryDedupStore,
    Reject,
    Requeue,
    Retry,
    failed_messages,
)
from rabbitry.exceptions import ConfigurationError, InvalidStateError
from rabbitry.protocol.message import Message, Properties

URL = "amqp://guest:guest@127.0.0.1:5672/"


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def handler(message: Any) -> None:
    return None


def make_consumer(**options: Any) -> AsyncConsumer:
    # The constructor only validates and stores; nothing touches the network.
    return rabbitry.AsyncConnection(URL).consumer("q", handler, **options)


def message(tag: int) -> Message:
    return Message(f"m{tag}".encode(), Properties(), delivery_tag=tag)


# ----------------------------------------------------------------- MemoryDedupStore


def test_dedup_unknown_key_is_not_seen() -> None:
    store = MemoryDedupStore(clock=FakeClock())
    assert not store.seen("a")
    assert len(store) == 0


def test_dedup_added_key_is_seen_until_ttl_passes() -> None:
    clock = FakeClock()
    store = MemoryDedupStore(ttl=10.0, clock=clock)
    store.add("a")
    assert store.seen("a")
    clock.advance(10.0)  # exactly ttl old: still remembered (expiry is "older than ttl")
    assert store.seen("a")
    clock.advance(0.001)
    assert not store.seen("a")
    assert len(store) == 0, "an expired id is dropped when it is looked up"
    assert not store.seen("a")


def test_dedup_seen_does_not_extend_the_ttl() -> None:
    clock = FakeClock()
    store = MemoryDedupStore(ttl=10.0, clock=clock)
    store.add("a")
    for _ in range(3):
        clock.advance(4.0)
        store.seen("a")  # looked up at 4 s and 8 s (seen), 12 s (expired)
    assert not store.seen("a")


def test_dedup_add_again_restarts_the_ttl() -> None:
    clock = FakeClock()
    store = MemoryDedupStore(ttl=10.0, clock=clock)
    store.add("a")
    clock.advance(8.0)
    store.add("a")
    clock.advance(8.0)  # 16 s after the first add, 8 s after the second
    assert store.seen("a")
    assert len(store) == 1


def test_dedup_evicts_least_recently_added_past_max_size() -> None:
    store = MemoryDedupStore(max_size=3, clock=FakeClock())
    for key in "abcd":
        store.add(key)
    assert len(store) == 3
    assert not store.seen("a")
    assert store.seen("b") and store.seen("c") and store.seen("d")


def test_dedup_lookup_refreshes_lru_order() -> None:
    store = MemoryDedupStore(max_size=3, clock=FakeClock())
    for key in "abc":
        store.add(key)
    assert store.seen("a")  # a becomes the most recently used
    store.add("d")  # evicts b, the least recently used
    assert store.seen("a")
    assert not store.seen("b")
    assert store.seen("c") and store.seen("d")


def test_dedup_re_add_refreshes_lru_order() -> None:
    store = MemoryDedupStore(max_size=2, clock=FakeClock())
    store.add("a")
    store.add("b")
    store.add("a")
    store.add("c")  # evicts b
    assert store.seen("a") and store.seen("c")
    assert not store.seen("b")


def test_dedup_max_size_one() -> None:
    store = MemoryDedupStore(max_size=1, clock=FakeClock())
    store.add("a")
    store.add("b")
    assert len(store) == 1
    assert store.seen("b") and not store.seen("a")


def test_dedup_expired_entries_do_not_count_as_seen_after_eviction_churn() -> None:
    clock = FakeClock()
    store = MemoryDedupStore(max_size=100, ttl=5.0, clock=clock)
    for i in range(50):
        store.add(str(i))
        clock.advance(0.2)  # ids 0..24 are older than 5 s at the end
    assert not store.seen("0")
    assert not store.seen("24")
    assert store.seen("26")
    assert store.seen("49")


def test_dedup_default_clock_is_monotonic() -> None:
    store = MemoryDedupStore()
    store.add("x")
    assert store.seen("x")


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_size": 0}, "max_size"),
        ({"max_size": -5}, "max_size"),
        ({"ttl": 0}, "ttl"),
        ({"ttl": -1.0}, "ttl"),
    ],
)
def test_dedup_validation_names_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{field}:"):
        MemoryDedupStore(**options)


def test_dedup_store_protocol_accepts_custom_stores() -> None:
    class DictStore:
        def __init__(self) -> None:
            self.keys: set[str] = set()

        def seen(self, key: str) -> bool:
            return key in self.keys

        def add(self, key: str) -> None:
            self.keys.add(key)

    custom: DedupStore = DictStore()
    memory: DedupStore = MemoryDedupStore()
    consumer = make_consumer(dedup=custom)
    assert consumer.dedup is custom
    assert make_consumer(dedup=memory).dedup is memory


# ----------------------------------------------------------------- ConsumerStats


COUNTERS = {
    "acked",
    "deduplicated",
    "delivered",
    "dropped",
    "dropped_records",
    "failed",
    "parked",
    "released",
    "requeued",
    "resubscribed",
    "retried",
}


def test_stats_start_at_zero() -> None:
    stats = ConsumerStats()
    assert stats.as_dict() == dict.fromkeys(COUNTERS, 0)


def test_stats_as_dict_reflects_changes_and_is_a_copy() -> None:
    stats = ConsumerStats()
    stats.acked += 3
    stats.parked = 1
    snapshot = stats.as_dict()
    assert snapshot["acked"] == 3
    assert snapshot["parked"] == 1
    snapshot["acked"] = 99
    assert stats.acked == 3


def test_stats_reject_unknown_counters() -> None:
    stats = ConsumerStats()
    with pytest.raises(AttributeError):
        stats.acks = 1  # type: ignore[attr-defined]


def test_stats_repr_shows_counters() -> None:
    stats = ConsumerStats()
    stats.retried = 2
    text = repr(stats)
    assert text.startswith("ConsumerStats(")
    assert "'retried': 2" in text


def test_consumer_has_fresh_stats() -> None:
    a, b = make_consumer(), make_consumer()
    assert isinstance(a.stats, ConsumerStats)
    assert a.stats is not b.stats


# ----------------------------------------------------------------- argument validation


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"ack": "both"}, "ack"),
        ({"ack": None}, "ack"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": -1}, "concurrency"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"concurrency": "2"}, "concurrency"),
        ({"prefetch": -1}, "prefetch"),
        ({"prefetch": 65536}, "prefetch"),
        ({"prefetch": 2.0}, "prefetch"),
        ({"prefetch": True}, "prefetch"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": -3}, "batch_size"),
        ({"batch_size": 2.5}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"batch_size": 10, "batch_timeout": 0}, "batch_timeout"),
        ({"batch_size": 10, "batch_timeout": -0.5}, "batch_timeout"),
    ],
    ids=lambda value: repr(value),
)
def test_invalid_arguments_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{field}:"):
        make_consumer(**options)


def test_configuration_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        make_consumer(concurrency=0)


def test_handler_must_be_callable() -> None:
    conn = rabbitry.AsyncConnection(URL)
    with pytest.raises(ConfigurationError, match=r"^handler:"):
        conn.consumer("q", "not a function")  # type: ignore[arg-type]


def test_defaults() -> None:
    consumer = make_consumer()
    assert consumer.queue == "q"
    assert consumer.ack_mode == "manual"
    assert consumer.prefetch == 100
    assert consumer.concurrency == 1
    assert consumer.retry is None
    assert consumer.batch_size is None
    assert consumer.exclusive is False
    assert consumer.arguments is None
    assert consumer.dedup is None
    assert consumer.on_cancel is None
    assert consumer.resubscribe is True
    assert consumer.consumer_tag is None
    assert consumer.channel is None
    assert not consumer.is_running


def test_auto_ack_mode_is_accepted() -> None:
    assert make_consumer(ack="auto").ack_mode == "auto"


def test_batch_timeout_defaults_to_one_second_with_batches() -> None:
    assert make_consumer(batch_size=10).batch_timeout == 1.0
    assert make_consumer(batch_size=10, batch_timeout=0.25).batch_timeout == 0.25


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"prefetch": 10, "concurrency": 4}, 10),
        ({"prefetch": 2, "concurrency": 8}, 8),  # raised to one per handler
        ({"prefetch": 5, "batch_size": 50}, 50),  # a full batch must fit
        ({"prefetch": 5, "concurrency": 3, "batch_size": 7}, 7),
        ({"prefetch": 0, "concurrency": 8}, 0),  # 0 = unlimited, left alone
        ({"prefetch": 65535, "concurrency": 2}, 65535),
    ],
)
def test_prefetch_floor(options: dict[str, Any], expected: int) -> None:
    assert make_consumer(**options).prefetch == expected


@pytest.mark.parametrize("field", ["concurrency", "batch_size"])
def test_prefetch_floor_stays_encodable(field: str) -> None:
    try:
        consumer = make_consumer(**{field: 70_000})
    except ConfigurationError as exc:
        assert str(exc).startswith(f"{field}:")
        return
    assert consumer.prefetch <= 65535


def test_arguments_are_copied() -> None:
    arguments = {"x-priority": 5}
    consumer = make_consumer(arguments=arguments)
    arguments["x-priority"] = 1
    assert consumer.arguments == {"x-priority": 5}


def test_repr_of_a_new_consumer() -> None:
    text = repr(make_consumer())
    assert "AsyncConsumer" in text
    assert "'q'" in text
    assert "new" in text


async def test_stop_before_start_is_a_no_op() -> None:
    consumer = make_consumer()
    await consumer.stop()
    await consumer.stop(drain=False, timeout=0.1)
    assert not consumer.is_running


# ----------------------------------------------------------------- signals


def test_signals_are_distinct_exceptions() -> None:
    for signal in (Retry, Reject, Requeue):
        assert issubclass(signal, Exception)
    assert len({Retry, Reject, Requeue}) == 3
    assert not issubclass(Reject, Retry) and not issubclass(Retry, Reject)


def test_signals_are_exported_at_top_level() -> None:
    assert rabbitry.Retry is Retry  # type: ignore[attr-defined]
    assert rabbitry.Reject is Reject  # type: ignore[attr-defined]
    assert rabbitry.Requeue is Requeue  # type: ignore[attr-defined]


# ----------------------------------------------------------------- batch results


def test_batch_result_lists_failed_messages_with_a_default_retry() -> None:
    batch = [message(tag) for tag in (1, 2, 3)]
    failed = failed_items(batch, [batch[1]])
    assert len(failed) == 1
    failed_message, error = failed[0]
    assert failed_message is batch[1]
    assert isinstance(error, Retry)


def test_batch_result_may_carry_the_exception_per_message() -> None:
    batch = [message(tag) for tag in (1, 2, 3)]
    reason = Reject("bad payload")
    failed = failed_items(batch, [(batch[0], reason), (batch[2], None)])
    assert failed[0] == (batch[0], reason)
    assert failed[1][0] is batch[2]
    assert isinstance(failed[1][1], Retry)


def test_batch_result_empty_collection_means_none_failed() -> None:
    batch = [message(1)]
    assert failed_items(batch, []) == []
    assert failed_items(batch, ()) == []
    assert failed_items(batch, set()) == []


def test_batch_result_accepts_any_iterable() -> None:
    batch = [message(tag) for tag in (1, 2, 3)]
    failed = failed_items(batch, (m for m in batch if m.delivery_tag != 2))
    assert [m.delivery_tag for m, _ in failed] == [1, 3]


def test_failed_messages_helper() -> None:
    batch = [message(tag) for tag in (1, 2)]
    result = failed_messages(batch[1])
    assert [m for m, _ in failed_items(batch, result)] == [batch[1]]
    assert failed_items(batch, failed_messages()) == []


@pytest.mark.parametrize(
    "result",
    [True, 3, 1.5, "m1", b"m1", object()],
    ids=["bool", "int", "float", "str", "bytes", "object"],
)
def test_batch_result_must_be_a_collection(result: object) -> None:
    with pytest.raises(InvalidStateError, match="collection of the messages that failed"):
        failed_items([message(1)], result)


def test_batch_result_rejects_a_message_of_another_batch() -> None:
    batch = [message(1), message(2)]
    stranger = message(1)  # equal tag, different delivery object
    with pytest.raises(InvalidStateError, match="not in its batch"):
        failed_items(batch, [stranger])


def test_batch_result_rejects_things_that_are_not_messages() -> None:
    batch = [message(1)]
    with pytest.raises(InvalidStateError, match="not in its batch"):
        failed_items(batch, [1])
    with pytest.raises(InvalidStateError, match="not in its batch"):
        failed_items(batch, [b"m1"])


def test_batch_result_rejects_malformed_tuples() -> None:
    batch = [message(1)]
    with pytest.raises(InvalidStateError):
        failed_items(batch, [(batch[0], Retry(), "extra")])


def test_batch_result_lists_each_failed_message_once() -> None:
    batch = [message(1), message(2)]
    failed = failed_items(batch, [batch[0], batch[0]])
    assert len(failed) == 1

"""Unit tests of rabbitry.spark that need neither Spark nor a broker."""

from __future__ import annotations

import pickle
import queue as queue_module
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from tests.spark.conftest import refuse_like_a_classic_queue

from rabbitry.config import DEFAULT_URL
from rabbitry.exceptions import ConfigurationError, NotFound
from rabbitry.protocol.message import Message
from rabbitry.protocol.spec import BasicProperties
from rabbitry.recovery import State
from rabbitry.spark._batch import delivery_count_refused
from rabbitry.spark._core import AckLedger, QueueConsumer, SourceCancelled, _drain, split_range
from rabbitry.spark._options import parse_read_options, parse_write_options
from rabbitry.spark._rows import (
    READ_SCHEMA,
    check_write_columns,
    message_to_row,
    row_to_message,
)

# ---------------------------------------------------------------- options


def test_defaults_and_lower_cased_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RABBITMQ_URL", raising=False)
    # Spark lower-cases keys; values are strings.
    opts = parse_read_options({"queue": "q", "maxmessagesperbatch": "500", "queuetype": "Quorum"})
    assert opts.queue == "q"
    assert opts.queue_type == "quorum"
    assert opts.max_messages_per_batch == 500
    assert opts.prefetch >= 500
    assert opts.connect.urls == (DEFAULT_URL,)
    assert opts.consume == "requeue" and opts.accept_delivery_count is False


def test_default_url_is_rabbitmq_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RABBITMQ_URL", "amqp://u:p@broker.example:5673/v")
    assert parse_read_options({"queue": "q"}).connect.urls == ("amqp://u:p@broker.example:5673/v",)
    assert parse_write_options({}).connect.urls == ("amqp://u:p@broker.example:5673/v",)
    # an explicit option wins
    assert parse_read_options({"queue": "q", "url": "amqp://h/"}).connect.urls == ("amqp://h/",)


def test_several_urls() -> None:
    opts = parse_read_options({"queue": "q", "url": "amqp://a/, amqp://b/"})
    assert opts.connect.urls == ("amqp://a/", "amqp://b/")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "option queue: required"),
        ({"queue": "q", "queuetype": "lazy"}, "option queueType"),
        ({"queue": "q", "prefetch": "10", "maxmessagesperbatch": "100"}, "option prefetch"),
        ({"queue": "q", "prefetch": "x"}, "option prefetch: not an integer"),
        ({"queue": "q", "prefetch": "0"}, "option prefetch: must be in"),
        ({"queue": "q", "numpartitions": "0"}, "option numPartitions"),
        ({"queue": "q", "startingoffsets": "first"}, "option startingOffsets"),
        ({"queue": "q", "queuetype": "stream", "startingoffsets": "-1"}, "startingOffsets"),
        ({"queue": "q", "startingoffsets": "5"}, "only for queueType=stream"),
        (
            {"queue": "q", "queuetype": "stream", "startingoffsets": "9", "endingoffsets": "3"},
            "option endingOffsets",
        ),
        ({"queue": "q", "failondataloss": "maybe"}, "option failOnDataLoss"),
        ({"queue": "q", "consume": "yes"}, "option consume: must be requeue"),
        ({"queue": "q", "acceptdeliverycount": "ok"}, "option acceptDeliveryCount"),
        ({"queue": "q", "maxbatchwaitms": "0"}, "option maxBatchWaitMs"),
        ({"queue": "q", "exclusivewaitms": "-1"}, "option exclusiveWaitMs"),
        ({"queue": "q", "url": "http://x/"}, "option url"),
        ({"queue": "q", "tlscafile": "/ca.pem"}, "TLS options need amqps://"),
        ({"queue": "q", "url": "amqps://h/", "tlskeyfile": "/k"}, "option tlsKeyFile"),
    ],
)
def test_read_option_errors_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_read_options(options)


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("startingOffset", "startingOffsets"),
        ("maxMessage", "maxMessages"),
        ("failOnDataLos", "failOnDataLoss"),
        ("urls", "url"),
        ("queuetyp", "queueType"),
    ],
)
def test_a_misspelt_option_is_refused_naming_the_one_meant(key: str, meant: str) -> None:
    with pytest.raises(
        ConfigurationError, match=rf"not an option of format rabbitmq; did you mean {meant}\?"
    ):
        parse_read_options({"queue": "q", key: "1"})
    with pytest.raises(ConfigurationError, match=rf"did you mean {meant}\?"):
        parse_write_options({"exchange": "x", key: "1"})


# Every option of Spark's Kafka source and sink (Structured Streaming + Kafka
# Integration Guide, Spark 4), and what format rabbitmq does with it: "same" (an option
# of the same name and meaning), an alias (taken as the option named), or refused with
# a message naming what to use instead.
_KAFKA_OPTIONS: dict[str, str] = {
    "startingOffsets": "same",
    "endingOffsets": "same",
    "failOnDataLoss": "same",
    "maxOffsetsPerTrigger": "alias maxRecordsPerTrigger",
    "assign": "superStream",
    "subscribe": "queue",
    "subscribePattern": "superStream",
    "topic": "exchange",
    "startingTimestamp": "startingOffsets=timestamp:",
    "startingOffsetsByTimestamp": "startingOffsets=timestamp:",
    "startingOffsetsByTimestampStrategy": "startingOffsets=timestamp:",
    "endingTimestamp": "endingOffsets",
    "endingOffsetsByTimestamp": "endingOffsets",
    "minOffsetsPerTrigger": "maxRecordsPerTrigger",
    "maxTriggerDelay": "maxBatchWaitMs",
    "minPartitions": "numPartitions",
    "maxRecordsPerPartition": "numPartitions",
    "groupIdPrefix": "checkpoint",
    "kafkaConsumer.pollTimeoutMs": "pollTimeoutMs",
    "fetchOffset.numRetries": "probe",
    "fetchOffset.retryIntervalMs": "probe",
    "includeHeaders": "headers",
    "kafka.bootstrap.servers": "option url",
    "kafka.group.id": "option url",
    "kafka.security.protocol": "tls",
}

# Names of this source's options as other RabbitMQ connectors spell them.
_OTHER_NAMES: dict[str, str] = {
    "queueName": "option queue",
    "exchangeName": "option exchange",
    "streamName": "queueType=stream",
    "superStreamName": "option superStream",
    "routingKeys": "option routingKey",
    "exchangeType": "topology",
    "host": "option url",
    "hostname": "option url",
    "port": "option url",
    "username": "option url",
    "user": "option url",
    "password": "option url",
    "vhost": "option url",
    "virtualHost": "option url",
    "uri": "option url",
    "prefetchCount": "option prefetch",
    "qos": "option prefetch",
    "autoAck": "consume=destructive",
    "batchSize": "batchRecords",
    "maxMessagesPerTrigger": "maxMessagesPerBatch",
    "deliveryMode": "option persistent",
    "publisherConfirms": "maxInFlight",
    "ssl": "amqps://",
    "useSsl": "amqps://",
}


@pytest.mark.parametrize(("name", "decision"), sorted({**_KAFKA_OPTIONS, **_OTHER_NAMES}.items()))
def test_every_kafka_source_option_and_other_connectors_name_is_taken_or_refused(
    name: str, decision: str
) -> None:
    read = {"queue": "s", "queueType": "stream"}
    key = name.lower()  # as Spark hands keys over
    if decision == "same":
        value = {"failOnDataLoss": "false"}.get(name, "7")
        parse_read_options({**read, key: value})
        return
    if decision.startswith("alias "):
        target = decision.split()[1]
        assert parse_read_options({**read, key: "7"}) == parse_read_options({**read, target: "7"})
        with pytest.raises(ConfigurationError, match=rf"option {name}: .*option {target}"):
            parse_read_options({**read, key: "7", target: "8"})
        return
    # Refused, reads and writes alike, naming the key and what to use instead: ignoring
    # it would read or write with a default the user did not mean.
    for parse, options in ((parse_read_options, read), (parse_write_options, {"exchange": "x"})):
        with pytest.raises(ConfigurationError) as refused:
            parse({**options, key: "1"})
        message = str(refused.value)
        assert message.lower().startswith(f"option {key}: not an option of format rabbitmq")
        assert decision in message


def test_a_misspelt_kafka_option_is_refused_with_the_hint_of_the_kafka_option() -> None:
    with pytest.raises(ConfigurationError, match=r"nor is startingOffsetsByTimestamp.*timestamp:"):
        parse_read_options({"queue": "q", "startingoffsetbytimestamp": "{}"})
    with pytest.raises(ConfigurationError, match=r"did you mean maxOffsetsPerTrigger\?"):
        parse_read_options({"queue": "q", "maxoffsetpertrigger": "5"})


def test_options_spark_adds_are_ignored() -> None:
    parse_read_options({"queue": "q", "path": "/p", "checkpointLocation": "/c"})
    parse_write_options({"exchange": "x", "path": "/p", "checkpointLocation": "/c"})


def test_the_option_list_is_every_option_the_parsers_read_and_the_docs_list() -> None:
    import re
    from pathlib import Path

    from rabbitry.spark import _options

    source = Path(_options.__file__).read_text()
    read = set(re.findall(r'opts\.(?:text|integer|opt_int|flag|required)\(\s*"(\w+)"', source))
    assert read == _options.OPTION_NAMES
    docs = (Path(__file__).parents[2] / "docs" / "spark.md").read_text()
    rows = re.findall(r"^\| (`\w+`(?:, `\w+`)*) \|", docs, re.M)
    listed = {name for row in rows for name in re.findall(r"`(\w+)`", row)}
    assert _options.OPTION_NAMES <= listed


def test_tls_server_name_becomes_the_sni_of_every_url() -> None:
    opts = parse_read_options(
        {
            "queue": "q",
            "url": "amqps://a/,amqps://b/?heartbeat=5",
            "tlsservername": "rabbit.example",
        }
    )
    assert opts.connect.effective_urls() == [
        "amqps://a/?server_name_indication=rabbit.example",
        "amqps://b/?heartbeat=5&server_name_indication=rabbit.example",
    ]
    with pytest.raises(ConfigurationError, match=r"option tlsServerName: .*amqps://"):
        parse_read_options({"queue": "q", "tlsservername": "x"})


def test_stream_offsets() -> None:
    opts = parse_read_options(
        {"queue": "s", "queuetype": "stream", "startingoffsets": "10", "endingoffsets": "20"}
    )
    assert (opts.starting_offsets, opts.ending_offsets) == ("10", "20")
    opts = parse_read_options(
        {"queue": "s", "queuetype": "stream", "startingoffsets": "timestamp:1700000000"}
    )
    assert opts.starting_offsets == "timestamp:1700000000"
    # stream queues: prefetch is only credit, it may be below the batch size
    parse_read_options(
        {"queue": "s", "queuetype": "stream", "prefetch": "10", "maxmessagesperbatch": "100"}
    )


def test_write_options() -> None:
    opts = parse_write_options(
        {"exchange": "x", "routingkey": "k", "maxinflight": "50", "confirmtimeoutms": "1500"}
    )
    assert (opts.exchange, opts.routing_key, opts.max_in_flight) == ("x", "k", 50)
    assert opts.confirm_timeout == 1.5
    assert opts.mandatory is True  # unroutable rows fail the task unless opted out
    assert parse_write_options({"mandatory": "false"}).mandatory is False
    with pytest.raises(ConfigurationError, match="option mandatory"):
        parse_write_options({"mandatory": "sure"})
    with pytest.raises(ConfigurationError, match="option maxInFlight"):
        parse_write_options({"maxinflight": "0"})
    with pytest.raises(ConfigurationError, match="option confirmTimeoutMs"):
        parse_write_options({"confirmtimeoutms": "soon"})


def test_options_pickle_without_secrets_in_repr() -> None:
    opts = parse_read_options({"queue": "q", "url": "amqp://u:secret@h/"})
    assert pickle.loads(pickle.dumps(opts)) == opts
    assert "secret" not in repr(opts)


# ---------------------------------------------------------------- rows


def _message(tag: int = 1, **props: Any) -> Message:
    return Message(
        body=b"hi",
        properties=BasicProperties(**props),
        delivery_tag=tag,
        redelivered=True,
        exchange="ex",
        routing_key="rk",
    )


def test_message_to_row_matches_schema() -> None:
    when = datetime(2024, 1, 2, tzinfo=UTC)
    message = _message(
        7,
        message_id="m1",
        timestamp=when,
        content_type="text/plain",
        delivery_mode=2,
        headers={"x-delivery-count": 3, "n": 1, "t": {"a": [1, 2]}, "b": b"raw"},
    )
    row = message_to_row(message, "q", 41)
    assert READ_SCHEMA.startswith("body BINARY, routing_key STRING")
    assert READ_SCHEMA.count(", headers MAP<STRING, STRING>, properties STRUCT<") == 1
    assert len(row) == 12
    assert row[:9] == (b"hi", "rk", "ex", "q", 41, 7, True, 3, "m1")
    assert row[9] == when
    assert row[10] == {"x-delivery-count": "3", "n": "1", "t": '{"a": [1, 2]}', "b": "raw"}
    assert row[11][0] == "text/plain" and row[11][2] == 2


def test_stream_row_takes_the_stream_offset() -> None:
    row = message_to_row(_message(headers={"x-stream-offset": 99}), "s", 0, stream_offset=True)
    assert row[4] == 99


def test_write_columns() -> None:
    check_write_columns(["body", "routing_key", "headers"])
    check_write_columns(["VALUE"])
    with pytest.raises(ConfigurationError, match="unknown column"):
        check_write_columns(["body", "key"])
    with pytest.raises(ConfigurationError, match="'body'"):
        check_write_columns(["routing_key"])
    with pytest.raises(ConfigurationError, match="not both"):
        check_write_columns(["body", "value"])


def test_row_to_message() -> None:
    body, exchange, key, props = row_to_message(
        {"value": "text", "headers": [("a", "1")], "properties": {"content_type": "t/p"}},
        "default-key",
        "ex",
        "job:0:5",
    )
    assert (body, exchange, key) == (b"text", "ex", "default-key")
    assert props.message_id == "job:0:5"
    assert props.headers == {"a": "1"}
    assert props.content_type == "t/p"
    assert props.delivery_mode == 2
    _, _, key, props = row_to_message(
        {"body": b"x", "routing_key": "rk", "message_id": "mine"}, "", "", "gen", 1
    )
    assert (key, props.message_id, props.delivery_mode) == ("rk", "mine", 1)
    with pytest.raises(ConfigurationError, match="null body"):
        row_to_message({"body": None}, "", "", "id")


# ---------------------------------------------------------------- offsets and acks


def test_split_range() -> None:
    assert split_range(0, 10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_range(5, 7, 4) == [(5, 6), (6, 7)]
    assert split_range(3, 3, 2) == []


def test_ack_ledger() -> None:
    ledger = AckLedger()
    ledger.add(10, 10)
    ledger.add(20, 20)
    assert ledger.through(5) == (None, 0)
    assert ledger.through(10) == (10, 0)
    assert ledger.through(10) == (None, 0)  # idempotent
    ledger.add(30, 31)
    assert ledger.through(30) == (31, 0)  # both remaining batches at once
    assert len(ledger) == 0
    ledger.add(40, 45)
    assert ledger.reset() == 1
    assert ledger.through(40) == (None, 0)


def test_ack_ledger_never_acks_a_batch_of_an_older_epoch() -> None:
    ledger = AckLedger()
    ledger.add(10, 10, epoch=0)
    ledger.add(20, 25, epoch=0)
    ledger.add(30, 40, epoch=1)  # after the connection recovered
    # batches 1 and 2 died with the old connection: only batch 3 is acked
    assert ledger.through(30, epoch=1) == (40, 2)
    ledger.add(40, 45, epoch=1)
    assert ledger.through(40, epoch=2) == (None, 1)


class _FakeChannel:
    def __init__(self, messages: list[Message], depth: int = 0) -> None:
        self.messages = messages
        self.depth = depth
        self.acks: list[tuple[int, bool]] = []
        self.is_open = True
        self.qos = 0
        self.epoch = 0
        self.deleted: set[str] = set()
        self.consumes = 0

    def basic_qos(self, prefetch: int, **_: Any) -> None:
        self.qos = prefetch

    def basic_consume(
        self, queue: str, callback: Any, on_cancel: Any = None, arguments: Any = None
    ) -> str:
        refuse_like_a_classic_queue(queue, arguments)
        self.on_cancel = on_cancel
        self.consumes += 1
        for message in self.messages:
            callback(message)
        return "tag"

    def close(self) -> None:
        pass  # the one channel the fake connection hands out stays usable

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.acks.append((tag, multiple))

    def queue_declare(self, queue: str, passive: bool = False, **_: Any) -> Any:
        if queue in self.deleted:
            raise NotFound(f"NOT_FOUND - no queue '{queue}'")

        class Ok:
            message_count = self.depth
            consumer_count = 0

        return Ok()


class _FakeConnection:
    def __init__(self, channel: _FakeChannel) -> None:
        self._channel = channel
        self.is_open = True
        self.close_exc = None
        self.state = State.OPEN  # a closed fake connection is closed for good

    def channel(self) -> _FakeChannel:
        return self._channel

    def close(self, timeout: float | None = None) -> None:
        self.is_open = False


def _consumer(channel: _FakeChannel, batch: int = 3) -> QueueConsumer:
    opts = parse_read_options(
        {
            "queue": "q",
            "maxmessagesperbatch": str(batch),
            "polltimeoutms": "1",
            "idletimeoutms": "1",
        }
    )
    return QueueConsumer(opts, connect=lambda _c: _FakeConnection(channel))  # type: ignore[arg-type,return-value]


def test_queue_consumer_acks_previous_batch_on_next_read() -> None:
    channel = _FakeChannel([_message(tag) for tag in range(1, 8)])
    consumer = _consumer(channel)
    rows, end = consumer.read(0)
    assert [r[5] for r in rows] == [1, 2, 3] and end == 3
    assert channel.acks == []  # not committed yet
    rows, end = consumer.read(3)  # Spark asks for batch 2: batch 1 is in the commit log
    assert channel.acks == [(3, True)] and end == 6
    consumer.ack_through(6)  # commit(end)
    consumer.ack_through(6)  # idempotent
    assert channel.acks == [(3, True), (6, True)]
    rows, end = consumer.read(6)
    assert [r[4] for r in rows] == [6] and end == 7
    rows, end = consumer.read(7)  # no data: acks the last batch, returns start
    assert rows == [] and end == 7
    assert channel.acks[-1] == (7, True)


def test_available_now_budget_is_measured_before_consuming() -> None:
    channel = _FakeChannel([_message(tag) for tag in range(1, 8)], depth=4)
    consumer = _consumer(channel)
    assert consumer.prepare_available_now() == 4
    assert channel.qos == 0  # not consuming yet
    _, end = consumer.read(0)
    _, end = consumer.read(end)
    assert end == 4
    rows, end2 = consumer.read(end)
    assert rows == [] and end2 == 4
    assert channel.acks[-1] == (4, True)  # the last batch is acked too


def test_connection_loss_voids_tags_and_reconnects() -> None:
    channel = _FakeChannel([_message(tag) for tag in range(1, 4)])
    consumer = _consumer(channel)
    consumer.read(0)
    assert consumer._conn is not None
    consumer._conn.is_open = False  # type: ignore[misc]  # the connection died while Spark ran batch 1
    channel.is_open = True
    consumer.read(3)
    assert channel.acks == []  # the old tags are never sent on the new channel
    assert consumer.reconnects == 1


def test_batches_from_before_a_recovery_are_not_acked() -> None:
    channel = _FakeChannel([_message(tag) for tag in range(1, 7)])
    consumer = _consumer(channel)
    rows, end = consumer.read(0)  # tags 1..3, epoch 0
    channel.epoch = 1  # the connection recovered while Spark ran the batch
    # the buffered deliveries 4..6 predate the recovery: left to the broker
    rows, end2 = consumer.read(end)
    assert rows == [] and end2 == end
    assert channel.acks == []  # tag 3 of epoch 0 is void on the recovered channel
    assert (consumer.stale_batches, consumer.stale_deliveries) == (1, 3)
    fresh = _message(1)
    fresh.epoch = 1
    channel.messages = [fresh]
    assert consumer._inbox is not None
    consumer._inbox.put(fresh)  # redelivered after the recovery
    rows, end3 = consumer.read(end2)
    assert [r[6] for r in rows] == [True] and end3 == end2 + 1
    consumer.ack_through(end3)
    assert channel.acks == [(1, True)]


def test_a_trickle_does_not_hold_a_batch_open() -> None:
    # A steady stream never leaves an idle gap; the batch still closes at its max wait.
    class Trickle(queue_module.SimpleQueue[Message]):
        def get(self, block: bool = True, timeout: float | None = None) -> Message:
            time.sleep(0.01)
            return _message(1)

    taken = _drain(Trickle(), want=10**9, poll=1.0, idle=0.5, max_wait=0.2)
    assert 1 <= len(taken) < 10**9


def test_consumer_pickles_without_connection() -> None:
    channel = _FakeChannel([_message(1)])
    consumer = _consumer(channel)
    consumer._connect = None  # type: ignore[assignment]  # lambdas don't pickle
    consumer._conn = _FakeConnection(channel)  # type: ignore[assignment]
    consumer._inbox = queue_module.SimpleQueue()
    copy = pickle.loads(pickle.dumps(consumer))
    assert copy._conn is None and copy._inbox is None and len(copy._ledger) == 0


def test_broker_cancel_of_a_deleted_queue_fails_the_read() -> None:
    channel = _FakeChannel([_message(1)])
    consumer = _consumer(channel)
    consumer.read(0)
    channel.deleted.add("q")
    channel.on_cancel("ctag")
    with pytest.raises(SourceCancelled, match=r"queue 'q'.*does not exist"):
        consumer.read(1)


def test_a_consumer_cancelled_while_its_queue_exists_is_subscribed_again() -> None:
    # what a recovery that could not subscribe the consumer again (a quorum queue without
    # a leader yet) or a broker-side cancel leaves
    channel = _FakeChannel([_message(1)])
    consumer = _consumer(channel)
    consumer.read(0)
    channel.on_cancel("ctag")
    assert consumer.read(1) == ([], 1)
    channel.messages = [_message(2)]
    rows, end = consumer.read(1)
    assert [r[5] for r in rows] == [2] and end == 2
    assert channel.consumes == 2


def test_quorum_refusal_names_the_limit_of_each_broker_generation() -> None:
    four = delivery_count_refused("orders", "4.0.5")
    assert isinstance(four, ConfigurationError)
    assert str(four).startswith("option acceptDeliveryCount: queue 'orders' is a quorum queue")
    assert "20 by default on RabbitMQ 4.x" in str(four)
    assert "none by default on RabbitMQ 3.x" in str(delivery_count_refused("orders", "3.10.8"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"traceparent": "00-abc-def-01"}, "option traceparent: must be a W3C traceparent"),
        (
            {"traceparent": f"00-{'0' * 32}-{'1' * 16}-01"},
            "option traceparent: must be a W3C traceparent",
        ),
        ({"tracestate": "vendor=1"}, "option tracestate: needs option traceparent"),
    ],
)
def test_write_trace_context_options_are_checked(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_write_options(options)


def test_write_trace_context_options_are_kept() -> None:
    parent = f"00-{'a' * 32}-{'b' * 16}-01"
    options = parse_write_options({"TraceParent": parent, "tracestate": "vendor=1"})
    assert (options.traceparent, options.tracestate) == (parent, "vendor=1")
    assert parse_write_options({}).traceparent is None

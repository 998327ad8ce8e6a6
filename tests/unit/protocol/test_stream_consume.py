"""The stream and quorum consume rules (rabbitry.protocol.streams) the way an engine
applies them: checked against the channel's QoS before basic.consume is queued, so a
consumer the broker would refuse (closing the channel) never reaches it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from broker_peer import Pair

from rabbitry.exceptions import ConfigurationError
from rabbitry.protocol import spec
from rabbitry.protocol.streams import STREAM_OFFSET, check_consume
from rabbitry.record import RecordedQueue, TopologyRecord

if TYPE_CHECKING:
    from rabbitry.protocol.channel import ChannelProtocol


class Engine:
    """The engine's part: remember the QoS the broker confirmed, check, then send."""

    def __init__(self, record: TopologyRecord | None = None) -> None:
        self.pair = Pair()
        self.pair.handshake()
        self.channel: ChannelProtocol = self.pair.open_channel()
        self.qos: tuple[int, int, bool] | None = None
        self.record = record

    def basic_qos(self, count: int, global_: bool = False) -> None:
        self.channel.send_method(spec.BasicQos(prefetch_count=count, global_=global_))
        self.pair.assert_sent(spec.BasicQos, channel=1, prefetch_count=count)
        self.pair.broker_method(1, spec.BasicQosOk())
        self.qos = (count, 0, global_)

    def consume(
        self, queue: str, arguments: dict[str, Any] | None = None, no_ack: bool = False
    ) -> None:
        check_consume(queue, arguments, no_ack=no_ack, qos=self.qos, record=self.record)
        self.channel.send_method(spec.BasicConsume(queue=queue, no_ack=no_ack, arguments=arguments))


@pytest.mark.parametrize(
    "offset", ["first", "last", "next", 0, 2**63 - 1, datetime(2026, 1, 1, tzinfo=UTC)]
)
def test_a_stream_consumer_with_a_prefetch_and_a_valid_offset_is_sent(offset: object) -> None:
    engine = Engine()
    engine.basic_qos(10)
    engine.consume("s", {STREAM_OFFSET: offset})
    sent = engine.pair.assert_sent(spec.BasicConsume, channel=1, queue="s")
    assert isinstance(sent, spec.BasicConsume)
    assert sent.arguments is not None and STREAM_OFFSET in sent.arguments


@pytest.mark.parametrize("offset", ["earliest", -1, 2**63, True, 1.5, None])
def test_an_invalid_offset_is_refused_and_nothing_sent(offset: object) -> None:
    engine = Engine()
    engine.basic_qos(10)
    with pytest.raises(ConfigurationError, match="x-stream-offset"):
        engine.consume("s", {STREAM_OFFSET: offset})
    engine.pair.assert_nothing_sent()


def test_a_stream_consumer_without_a_prefetch_is_refused() -> None:
    engine = Engine()
    with pytest.raises(ConfigurationError, match="prefetch"):
        engine.consume("s", {STREAM_OFFSET: "first"})
    engine.pair.assert_nothing_sent()
    engine.basic_qos(0)
    with pytest.raises(ConfigurationError, match="prefetch"):
        engine.consume("s", {STREAM_OFFSET: "first"})
    engine.pair.assert_nothing_sent()


def test_a_stream_consumer_with_automatic_acks_is_refused() -> None:
    engine = Engine()
    engine.basic_qos(10)
    with pytest.raises(ConfigurationError, match="no_ack"):
        engine.consume("s", {STREAM_OFFSET: "next"}, no_ack=True)
    engine.pair.assert_nothing_sent()


def test_a_recorded_stream_needs_no_offset_argument_to_be_checked() -> None:
    record = TopologyRecord()
    record.add_queue(RecordedQueue("s", arguments={"x-queue-type": "stream"}))
    engine = Engine(record)
    with pytest.raises(ConfigurationError, match="prefetch"):
        engine.consume("s")
    engine.consume("classic")  # a queue the record does not know: no rule applies
    engine.pair.assert_sent(spec.BasicConsume, channel=1, queue="classic")


def test_an_offset_on_a_recorded_non_stream_queue_is_refused() -> None:
    record = TopologyRecord()
    record.add_queue(RecordedQueue("q", arguments={"x-queue-type": "quorum"}))
    engine = Engine(record)
    engine.basic_qos(10)
    with pytest.raises(ConfigurationError, match="only stream queues"):
        engine.consume("q", {STREAM_OFFSET: "first"})
    engine.pair.assert_nothing_sent()


def test_global_qos_is_refused_on_quorum_and_stream_queues() -> None:
    record = TopologyRecord()
    record.add_queue(RecordedQueue("q", arguments={"x-queue-type": "quorum"}))
    engine = Engine(record)
    engine.basic_qos(10, global_=True)
    with pytest.raises(ConfigurationError, match="global"):
        engine.consume("q")
    with pytest.raises(ConfigurationError, match="global"):
        engine.consume("s", {STREAM_OFFSET: "first"})
    engine.pair.assert_nothing_sent()
    engine.consume("classic")
    engine.pair.assert_sent(spec.BasicConsume, channel=1, queue="classic")

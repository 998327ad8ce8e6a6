"""The option names of format ``rabbitmq``, and the reader of Spark's raw option map.

Holds the catalogue (documented spelling of every option, Kafka aliases, names of other
connectors refused with a hint) and :class:`OptionMap`, which the parsers of
:mod:`rabbitry.spark._options` read typed values through. Pure Python (no pyspark).
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from ..exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["ALIASES", "FOREIGN_OPTIONS", "KNOWN_OPTIONS", "OPTION_NAMES", "OptionMap"]

# Documented spelling of every option, keyed by its lower-cased form.
_CONNECT_KEYS = (
    "url",
    "otel",
    "connectionName",
    "heartbeat",
    "tlsCaFile",
    "tlsCertFile",
    "tlsKeyFile",
    "tlsVerify",
    "tlsServerName",
)
# A super stream's layout (reads and writes).
_SUPER_STREAM_KEYS = ("superStream", "superStreamPartitions", "superStreamBindingKeys")
_READ_KEYS = (
    "queue",
    "queueType",
    "prefetch",
    "maxMessagesPerBatch",
    "maxRecordsPerTrigger",
    "startingOffsets",
    "endingOffsets",
    "numPartitions",
    "pollTimeoutMs",
    "idleTimeoutMs",
    "failOnDataLoss",
    "maxMessages",
    "consume",
    "acceptDeliveryCount",
    "exclusiveWaitMs",
    "deliveryLimit",
    "managementUrl",
    "maxBatchWaitMs",
    "recoveryTimeoutMs",
)
_WRITE_KEYS = (
    "exchange",
    "routingKey",
    "maxInFlight",
    "confirmTimeoutMs",
    "mandatory",
    "jobId",
    "persistent",
    "checkExchange",
    "batchRecords",
    "traceparent",
    "tracestate",
    "partitionKeyColumn",
)
# Read options given to a write (and the reverse) are ignored rather than refused: the
# same option map is often reused for both directions.
KNOWN_OPTIONS = {
    key.lower(): key for key in (*_CONNECT_KEYS, *_SUPER_STREAM_KEYS, *_READ_KEYS, *_WRITE_KEYS)
}


#: Every option of format ``rabbitmq`` (reads and writes), as docs/spark.md spells them.
OPTION_NAMES: frozenset[str] = frozenset(KNOWN_OPTIONS.values())

#: Options of Spark's Kafka source that mean what an option of this source means: taken
#: as that option (Kafka name → option).
ALIASES: dict[str, str] = {"maxOffsetsPerTrigger": "maxRecordsPerTrigger"}

_URL_PART = "part of option url (amqp://user:password@host:port/vhost)"
_STREAM_TIMESTAMP = (
    "startingOffsets=timestamp:<epoch seconds> (the first chunk published at or after that time)"
)

#: Names that users of Spark's Kafka source and sink, and of other RabbitMQ connectors,
#: type, which this source has no option for: each is refused, naming what to use.
FOREIGN_OPTIONS: dict[str, str] = {
    # Spark's Kafka source and sink.
    "subscribe": "use option queue (one queue or stream) or superStream (a super stream's "
    "partitions)",
    "subscribePattern": "no pattern subscriptions; use option queue or superStream",
    "assign": "use option superStream with superStreamPartitions or superStreamBindingKeys",
    "topic": "writes take option exchange and routingKey (or the columns exchange and "
    "routing_key), or superStream",
    "startingTimestamp": f"use {_STREAM_TIMESTAMP}",
    "startingOffsetsByTimestamp": f"use {_STREAM_TIMESTAMP}, or a JSON object of such "
    "values per partition queue in startingOffsets",
    "startingOffsetsByTimestampStrategy": f"no strategy; {_STREAM_TIMESTAMP} starts at the "
    "tail when nothing was published after the time",
    "endingTimestamp": "reads end at endingOffsets (an offset or latest); there is no "
    "ending by time",
    "endingOffsetsByTimestamp": "reads end at endingOffsets (an offset or latest); there "
    "is no ending by time",
    "minOffsetsPerTrigger": "no lower bound: a micro-batch takes what there is up to "
    "maxRecordsPerTrigger (streams) or maxMessagesPerBatch (queues)",
    "maxTriggerDelay": "no lower bound to wait for (see minOffsetsPerTrigger); a queue's "
    "micro-batch closes maxBatchWaitMs after its first message",
    "minPartitions": "use option numPartitions (offset ranges per micro-batch, per "
    "partition of a super stream)",
    "maxRecordsPerPartition": "use option numPartitions (offset ranges per micro-batch)",
    "groupIdPrefix": "there are no consumer groups: streams are read by offset, and the "
    "checkpoint holds the offsets",
    "kafkaConsumer.pollTimeoutMs": "use option pollTimeoutMs (how long a queue's "
    "micro-batch waits for its first message)",
    "fetchOffset.numRetries": "no offset fetch to retry: a stream's tail is read with a "
    "probe when each micro-batch is planned",
    "fetchOffset.retryIntervalMs": "no offset fetch to retry: a stream's tail is read with "
    "a probe when each micro-batch is planned",
    "includeHeaders": "the headers column is always read (drop it with df.drop('headers')) "
    "and written when given",
    # Other connectors' names of this source's options.
    "queueName": "use option queue",
    "exchangeName": "use option exchange",
    "streamName": "use option queue with queueType=stream",
    "superStreamName": "use option superStream",
    "routingKeys": "use option routingKey (one key), or a routing_key column",
    "exchangeType": "the exchange must exist (declare it with rabbitry.topology); a write "
    "only publishes to it",
    "host": _URL_PART,
    "hostname": _URL_PART,
    "port": _URL_PART,
    "username": _URL_PART,
    "user": _URL_PART,
    "password": _URL_PART,
    "vhost": _URL_PART,
    "virtualHost": _URL_PART,
    "uri": "use option url",
    "prefetchCount": "use option prefetch",
    "qos": "use option prefetch",
    "autoAck": "use option consume=destructive (batch reads); streaming reads acknowledge "
    "when Spark commits",
    "batchSize": "use option maxMessagesPerBatch (queue reads), maxRecordsPerTrigger "
    "(stream reads) or batchRecords (writes)",
    "maxMessagesPerTrigger": "use option maxMessagesPerBatch (queues) or "
    "maxRecordsPerTrigger (streams)",
    "deliveryMode": "use option persistent, or properties.delivery_mode per row",
    "publisherConfirms": "writes always wait for publisher confirms (maxInFlight, "
    "confirmTimeoutMs)",
    "ssl": "use an amqps:// URL in option url (and the tls* options)",
    "useSsl": "use an amqps:// URL in option url (and the tls* options)",
}

#: Spark's Kafka client settings (``kafka.bootstrap.servers``, ``kafka.group.id``, ...).
_KAFKA_PREFIX = "kafka."
_KAFKA_HINT = (
    "a Kafka client setting has no meaning here; the connection is option url (and the "
    "tls* options)"
)

_FOREIGN = {key.lower(): (key, hint) for key, hint in FOREIGN_OPTIONS.items()}
_ALIASES = {key.lower(): (key, target) for key, target in ALIASES.items()}
_TYPO_TARGETS = [*KNOWN_OPTIONS, *_ALIASES, *_FOREIGN]


def _refuse_foreign(key: str) -> None:
    """Refuse a Kafka (or other connector's) option name this source has no option for."""
    if key in _FOREIGN:
        name, hint = _FOREIGN[key]
        raise ConfigurationError(f"option {name}: not an option of format rabbitmq; {hint}")
    if key.startswith(_KAFKA_PREFIX):
        raise ConfigurationError(f"option {key}: not an option of format rabbitmq; {_KAFKA_HINT}")


class OptionMap:
    """Reads Spark's raw string options case-insensitively as typed values, refusing
    names of other connectors and typos, with errors naming the option as documented."""

    def __init__(self, options: Mapping[str, str]) -> None:
        # Unknown keys are ignored, not refused: Spark adds its own (path,
        # checkpointLocation, ...) to the options of sources and sinks. Names of Spark's
        # Kafka source and of other connectors are taken as the option they mean
        # (ALIASES) or refused naming what to use (FOREIGN_OPTIONS, kafka.*). A key one
        # letter or so away from any of these is a typo, refused: a misspelt
        # startingOffsets would read from the default offset without a word.
        self._raw = {str(key).lower(): value for key, value in options.items()}
        for key in list(self._raw):
            if key in KNOWN_OPTIONS:
                continue
            _refuse_foreign(key)
            if key in _ALIASES:
                name, target = _ALIASES[key]
                if target.lower() in self._raw:
                    raise ConfigurationError(
                        f"option {name}: Spark's Kafka name of option {target}, which is "
                        "given too; give one of them"
                    )
                self._raw[target.lower()] = self._raw.pop(key)
                continue
            close = difflib.get_close_matches(key, _TYPO_TARGETS, n=1, cutoff=0.85)
            if not close:
                continue
            if close[0] in _FOREIGN:
                name, hint = _FOREIGN[close[0]]
                raise ConfigurationError(
                    f"option {key}: not an option of format rabbitmq (nor is {name}); {hint}"
                )
            meant = KNOWN_OPTIONS.get(close[0]) or _ALIASES[close[0]][0]
            raise ConfigurationError(
                f"option {key}: not an option of format rabbitmq; did you mean {meant}?"
            )

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self._raw.get(name.lower())
        if value is None:
            return default
        return str(value)

    def required(self, name: str) -> str:
        value = self.text(name)
        if value is None or not value.strip():
            raise ConfigurationError(f"option {name}: required")
        return value.strip()

    def integer(self, name: str, default: int, low: int, high: int = 2**31 - 1) -> int:
        text = self.text(name)
        if text is None:
            return default
        try:
            value = int(text.strip())
        except ValueError:
            raise ConfigurationError(f"option {name}: not an integer: {text!r}") from None
        if not low <= value <= high:
            raise ConfigurationError(f"option {name}: must be in {low}..{high}, got {value}")
        return value

    def opt_int(self, name: str, low: int, high: int = 2**63 - 1) -> int | None:
        if self.text(name) is None:
            return None
        return self.integer(name, 0, low, high)

    def flag(self, name: str, default: bool) -> bool:
        text = self.text(name)
        if text is None:
            return default
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigurationError(f"option {name}: must be true or false, got {text!r}")

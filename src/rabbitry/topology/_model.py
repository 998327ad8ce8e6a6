"""The declarative model: Exchange, Queue, Binding and Topology, validated when built.

Every rule RabbitMQ enforces on a declaration that can be checked without the broker is
checked here, in ``__post_init__``, so a bad topology fails with a
:class:`~rabbitry.TopologyValidationError` naming the entity, the field and the rule
before anything is sent (a broker-side failure would close the channel, and an unknown
exchange type even closes the *connection* with 503 COMMAND_INVALID).

Typed fields are the canonical form of RabbitMQ's ``x-`` arguments: an argument given in
``arguments=`` that has a typed field is moved into that field (so
``Queue("q", message_ttl=5)`` and ``Queue("q", arguments={"x-message-ttl": 5})`` are
equal), and giving both with different values is an error. ``arguments`` keeps the
rest (plugin or newer arguments), which are sent as they are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from ..exceptions import TopologyValidationError
from ._checks import (
    MAX_AGE,
    check_arguments,
    check_boolean,
    check_declarable_name,
    check_encodable,
    check_integer,
    check_shortstr,
    is_reserved,
    lift_argument,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "BUILTIN_EXCHANGES",
    "BUILTIN_EXCHANGE_TYPES",
    "MAX_UINT32",
    "MODULUS_HASH",
    "OVERFLOW_MODES",
    "PLUGIN_EXCHANGE_TYPES",
    "QUEUE_ARGUMENTS",
    "QUEUE_TYPES",
    "SERVER_NAMED_PREFIX",
    "UNLIMITED_DELIVERIES",
    "Binding",
    "Exchange",
    "Queue",
    "entity_label",
    "field_for_argument",
    "format_expiration",
    "is_reserved",
]

#: Largest TTL / expiry RabbitMQ accepts (its ``MAX_EXPIRY_TIMER``), in milliseconds.
MAX_UINT32 = 2**32 - 1
BUILTIN_EXCHANGE_TYPES = ("direct", "topic", "fanout", "headers")
#: The exchange type of the ``rabbitmq_sharding`` plugin: the routing key's hash modulo
#: the number of bound queues picks exactly one of them (binding keys are ignored).
MODULUS_HASH = "x-modulus-hash"
#: Exchange types that plugins shipped with RabbitMQ add, and the plugin to enable.
PLUGIN_EXCHANGE_TYPES = {
    "x-consistent-hash": "rabbitmq_consistent_hash_exchange",
    MODULUS_HASH: "rabbitmq_sharding",
    "x-random": "rabbitmq_random_exchange",
    "x-recent-history": "rabbitmq_recent_history_exchange",
    "x-jms-topic": "rabbitmq_jms_topic_exchange",
    "x-delayed-message": "rabbitmq_delayed_message_exchange",
}
QUEUE_TYPES = ("classic", "quorum", "stream")
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
#: ``x-delivery-limit`` / ``delivery-limit`` value for "no limit" (RabbitMQ 4.0+, whose
#: quorum queues otherwise default to 20 deliveries; 3.x quorum queues had no default).
UNLIMITED_DELIVERIES = -1
_log = logging.getLogger("rabbitry.topology")


def entity_label(kind: str, name: str) -> str:
    """How messages name an entity: ``queue 'jobs'``, ``queue (server-named)``."""
    return f"{kind} {name!r}" if name else f"{kind} (server-named)"


# --------------------------------------------------------------------------- checks
# The general ones (strings, integers, argument tables, policy values) are in _checks.

#: The exchanges every RabbitMQ vhost has; they may appear in a topology (to bind to
#: them, or verify them) and ``apply`` checks them with a passive declare.
BUILTIN_EXCHANGES = (
    "amq.direct",
    "amq.fanout",
    "amq.headers",
    "amq.match",
    "amq.topic",
    "amq.rabbitmq.trace",
    "amq.rabbitmq.log",
)
#: The prefix of the names the broker gives server-named queues.
SERVER_NAMED_PREFIX = "amq.gen-"


def check_delivery_limit(entity: str, name: str, value: object) -> int:
    """A delivery limit: a count of at least 0, or -1 for unlimited (RabbitMQ 4.0+).

    Args:
        entity: The entity, for the error text.
        name: The field, for the error text.
        value: The value to check.

    Returns:
        The limit.

    Raises:
        TopologyValidationError: Not such a count.
    """
    # RabbitMQ 4.0 reads any negative value as "unlimited"; -1 is the documented one.
    if value == UNLIMITED_DELIVERIES and isinstance(value, int) and not isinstance(value, bool):
        return UNLIMITED_DELIVERIES
    return check_integer(entity, name, value, 0, None, " or -1 (unlimited, RabbitMQ 4.0+)")


# --------------------------------------------------------------------------- entities


@dataclass(frozen=True, eq=True)
class Exchange:
    """An exchange to declare.

    Args:
        name: the exchange name (not empty, not ``amq.*``).
        type: ``direct``, ``topic``, ``fanout``, ``headers``, or a plugin type starting
            with ``x-`` (``x-consistent-hash``, ``x-modulus-hash``, ``x-delayed-message``,
            see :data:`PLUGIN_EXCHANGE_TYPES`). The plugin must be enabled: RabbitMQ
            closes the whole connection on an unknown type.
        durable: survives a broker restart.
        auto_delete: deleted when its last binding is removed.
        internal: cannot be published to directly, only through exchange bindings.
        alternate_exchange: where messages go that no binding matches
            (``alternate-exchange`` argument).
        arguments: further arguments, sent as given (e.g. ``x-delayed-type``).

    Raises:
        TopologyValidationError: a field breaks a rule; the message names it.
    """

    name: str
    type: str = "direct"
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    alternate_exchange: str | None = None
    arguments: Mapping[str, Any] | None = None

    KIND: ClassVar[str] = "exchange"
    __hash__ = None  # type: ignore[assignment]  # arguments is a dict

    def __post_init__(self) -> None:
        entity = entity_label("exchange", self.name if isinstance(self.name, str) else "?")
        check_shortstr(entity, "name", self.name)
        if not self.name:
            raise TopologyValidationError(
                entity, "name", "must not be empty ('' is the default exchange, which exists)"
            )
        check_declarable_name(entity, self.name, BUILTIN_EXCHANGES)
        check_shortstr(entity, "type", self.type, empty=False)
        if self.type not in BUILTIN_EXCHANGE_TYPES and not self.type.startswith("x-"):
            raise TopologyValidationError(
                entity,
                "type",
                f"must be one of {', '.join(BUILTIN_EXCHANGE_TYPES)} or a plugin type "
                f"starting with 'x-', got {self.type!r}",
            )
        for flag in ("durable", "auto_delete", "internal"):
            check_boolean(entity, flag, getattr(self, flag))
        arguments = check_arguments(entity, self.arguments)
        lift_argument(self, entity, arguments, (("alternate_exchange", "alternate-exchange"),))
        if self.alternate_exchange is not None:
            check_shortstr(entity, "alternate_exchange", self.alternate_exchange, empty=False)
        if self.type == "x-delayed-message":
            delayed = arguments.get("x-delayed-type")
            if delayed not in BUILTIN_EXCHANGE_TYPES:
                raise TopologyValidationError(
                    entity,
                    "arguments['x-delayed-type']",
                    "an x-delayed-message exchange needs x-delayed-type, one of "
                    f"{', '.join(BUILTIN_EXCHANGE_TYPES)}, got {delayed!r}",
                )
        check_encodable(entity, arguments)
        object.__setattr__(self, "arguments", arguments or None)

    @property
    def label(self) -> str:
        """``exchange 'name'``: how messages name it."""
        return entity_label("exchange", self.name)

    def declare_arguments(self) -> dict[str, Any]:
        """The ``arguments`` table sent in exchange.declare."""
        result: dict[str, Any] = {}
        if self.alternate_exchange is not None:
            result["alternate-exchange"] = self.alternate_exchange
        result.update(self.arguments or {})
        return result


#: Typed queue fields and the x-argument each becomes, in the order they are sent.
QUEUE_ARGUMENTS: tuple[tuple[str, str], ...] = (
    ("queue_type", "x-queue-type"),
    ("message_ttl", "x-message-ttl"),
    ("expires", "x-expires"),
    ("dead_letter_exchange", "x-dead-letter-exchange"),
    ("dead_letter_routing_key", "x-dead-letter-routing-key"),
    ("max_length", "x-max-length"),
    ("max_length_bytes", "x-max-length-bytes"),
    ("overflow", "x-overflow"),
    ("max_priority", "x-max-priority"),
    ("delivery_limit", "x-delivery-limit"),
    ("single_active_consumer", "x-single-active-consumer"),
)
_ARGUMENT_FIELD = {argument: name for name, argument in QUEUE_ARGUMENTS}
#: Fields a stream queue cannot have (RabbitMQ: "invalid arg ... of queue type
#: rabbit_stream_queue"); retention is x-max-age / x-max-length-bytes instead.
_NOT_ON_STREAMS = (
    "message_ttl",
    "expires",
    "dead_letter_exchange",
    "dead_letter_routing_key",
    "max_length",
    "overflow",
    "max_priority",
    "delivery_limit",
)


@dataclass(frozen=True, eq=True)
class Queue:
    """A queue to declare.

    Args:
        name: the queue name; ``""`` asks the broker for one (classic queues only;
            bindings refer to such a queue by passing the ``Queue`` object itself).
        durable: survives a broker restart (quorum and stream queues must be durable).
        exclusive: used by this connection only, deleted with it.
        auto_delete: deleted when its last consumer goes away.
        queue_type: ``"classic"``, ``"quorum"`` or ``"stream"`` (``x-queue-type``);
            ``None`` leaves it to the broker (classic unless the vhost says otherwise).
        message_ttl: milliseconds a message may wait (``x-message-ttl``), 0..2^32-1.
        expires: milliseconds unused before the queue is deleted (``x-expires``), > 0.
        dead_letter_exchange: where rejected/expired/dropped messages go
            (``x-dead-letter-exchange``; ``""`` is the default exchange).
        dead_letter_routing_key: their new routing key (``x-dead-letter-routing-key``).
        max_length: most ready messages (``x-max-length``), >= 0.
        max_length_bytes: most bytes of ready bodies (``x-max-length-bytes``), >= 0.
        overflow: ``drop-head``, ``reject-publish`` or ``reject-publish-dlx``.
        max_priority: priorities supported, 0..255 (``x-max-priority``, classic only).
        delivery_limit: returns to the queue before the message is dead-lettered, or
            dropped without a dead-letter exchange (``x-delivery-limit``, quorum only);
            ``-1`` (:data:`UNLIMITED_DELIVERIES`) for no limit. ``None`` leaves it to the
            broker: unlimited on RabbitMQ 3.x, **20** on 4.0+.
        single_active_consumer: one consumer at a time gets messages.
        arguments: further arguments, sent as given (e.g. ``x-max-age`` for streams).

    Raises:
        TopologyValidationError: a field breaks a rule; the message names it.
    """

    name: str
    durable: bool = True
    exclusive: bool = False
    auto_delete: bool = False
    queue_type: str | None = None
    message_ttl: int | None = None
    expires: int | None = None
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str | None = None
    max_priority: int | None = None
    delivery_limit: int | None = None
    single_active_consumer: bool = False
    arguments: Mapping[str, Any] | None = None

    KIND: ClassVar[str] = "queue"
    __hash__ = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        entity = entity_label("queue", self.name if isinstance(self.name, str) else "?")
        check_shortstr(entity, "name", self.name)
        check_declarable_name(entity, self.name, SERVER_NAMED_PREFIX)
        arguments = check_arguments(entity, self.arguments)
        lift_argument(self, entity, arguments, QUEUE_ARGUMENTS)
        for flag in ("durable", "exclusive", "auto_delete", "single_active_consumer"):
            check_boolean(entity, flag, getattr(self, flag))
        self._check_fields(entity)
        max_age = arguments.get("x-max-age")
        if max_age is not None and not (
            isinstance(max_age, str) and MAX_AGE.fullmatch(max_age) is not None
        ):
            # RabbitMQ 3.10 answers a malformed x-max-age with 541 INTERNAL_ERROR,
            # which closes the whole connection.
            raise TopologyValidationError(
                entity,
                "arguments['x-max-age']",
                f"must be a number and a unit Y, M, D, h, m or s (e.g. '7D'), got {max_age!r}",
            )
        if "x-single-active-consumer" in arguments:
            check_boolean(
                entity,
                "arguments['x-single-active-consumer']",
                arguments["x-single-active-consumer"],
            )
        check_encodable(entity, arguments)
        object.__setattr__(self, "arguments", arguments or None)

    def _check_fields(self, entity: str) -> None:
        kind = self.queue_type
        if kind is not None:
            check_shortstr(entity, "queue_type", kind)
            if kind not in QUEUE_TYPES:
                raise TopologyValidationError(
                    entity,
                    "queue_type (x-queue-type)",
                    f"must be one of {', '.join(QUEUE_TYPES)}, got {kind!r}",
                )
        ms = " (milliseconds)"
        if self.message_ttl is not None:
            check_integer(
                entity, "message_ttl (x-message-ttl)", self.message_ttl, 0, MAX_UINT32, ms
            )
        if self.expires is not None:
            check_integer(entity, "expires (x-expires)", self.expires, 1, MAX_UINT32, ms)
        if self.max_length is not None:
            check_integer(entity, "max_length (x-max-length)", self.max_length, 0, None, "")
        if self.max_length_bytes is not None:
            check_integer(
                entity, "max_length_bytes (x-max-length-bytes)", self.max_length_bytes, 0, None, ""
            )
        if self.max_priority is not None:
            check_integer(entity, "max_priority (x-max-priority)", self.max_priority, 0, 255, "")
        if self.delivery_limit is not None:
            check_delivery_limit(entity, "delivery_limit (x-delivery-limit)", self.delivery_limit)
        if self.overflow is not None and self.overflow not in OVERFLOW_MODES:
            raise TopologyValidationError(
                entity,
                "overflow (x-overflow)",
                f"must be one of {', '.join(OVERFLOW_MODES)}, got {self.overflow!r}",
            )
        if self.dead_letter_exchange is not None:
            check_shortstr(
                entity, "dead_letter_exchange (x-dead-letter-exchange)", self.dead_letter_exchange
            )
        if self.dead_letter_routing_key is not None:
            check_shortstr(
                entity,
                "dead_letter_routing_key (x-dead-letter-routing-key)",
                self.dead_letter_routing_key,
            )
            if self.dead_letter_exchange is None:
                raise TopologyValidationError(
                    entity,
                    "dead_letter_routing_key (x-dead-letter-routing-key)",
                    "needs a dead_letter_exchange (RabbitMQ: routing_key_but_no_dlx_defined)",
                )
        if kind in ("quorum", "stream"):
            self._check_replicated(entity, kind)
        if self.delivery_limit is not None and kind != "quorum":
            raise TopologyValidationError(
                entity,
                "delivery_limit (x-delivery-limit)",
                f"only quorum queues have a delivery limit (queue_type is {kind!r})",
            )

    def _check_replicated(self, entity: str, kind: str) -> None:
        for flag, wanted in (("durable", True), ("exclusive", False), ("auto_delete", False)):
            if getattr(self, flag) is not wanted:
                raise TopologyValidationError(
                    entity, flag, f"{kind} queues must have {flag}={wanted}"
                )
        if not self.name:
            raise TopologyValidationError(
                entity, "name", f"{kind} queues cannot be server-named; give a name"
            )
        if kind == "quorum" and self.max_priority is not None:
            raise TopologyValidationError(
                entity, "max_priority (x-max-priority)", "quorum queues have no x-max-priority"
            )
        if kind == "stream":
            for name in _NOT_ON_STREAMS:
                if getattr(self, name) is not None:
                    argument = dict(QUEUE_ARGUMENTS)[name]
                    hint = " (use arguments={'x-max-age': ...})" if name == "message_ttl" else ""
                    raise TopologyValidationError(
                        entity, f"{name} ({argument})", f"stream queues do not support it{hint}"
                    )

    @property
    def label(self) -> str:
        """``queue 'name'`` (or ``queue (server-named)``): how messages name it."""
        return entity_label("queue", self.name)

    @property
    def server_named(self) -> bool:
        """The broker chooses the name (``name == ""``)."""
        return not self.name

    def declare_arguments(self) -> dict[str, Any]:
        """The ``arguments`` table sent in queue.declare, typed fields first."""
        result: dict[str, Any] = {}
        for name, argument in QUEUE_ARGUMENTS:
            value = getattr(self, name)
            if value is None or value is False:
                continue
            result[argument] = value
        result.update(self.arguments or {})
        return result


def field_for_argument(argument: str) -> str | None:
    """The typed :class:`Queue` field behind an x-argument, if it has one."""
    return _ARGUMENT_FIELD.get(argument)


@dataclass(frozen=True, eq=True)
class Binding:
    """A binding of a queue (or, with ``destination_type="exchange"``, an exchange) to
    exchange ``source``.

    ``source`` and ``destination`` are names, or the :class:`Exchange` / :class:`Queue`
    objects themselves; a server-named queue (``Queue("")``) can only be referred to by
    its object, and ``apply`` binds the name the broker assigned.

    Raises:
        TopologyValidationError: a field breaks a rule; the message names it.
    """

    source: str
    destination: str | Queue
    routing_key: str = ""
    arguments: Mapping[str, Any] | None = None
    destination_type: Literal["queue", "exchange"] = "queue"

    KIND: ClassVar[str] = "binding"
    __hash__ = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        source: object = self.source
        if isinstance(source, Exchange):
            object.__setattr__(self, "source", source.name)
        destination: object = self.destination
        if isinstance(destination, Exchange):
            object.__setattr__(self, "destination", destination.name)
            object.__setattr__(self, "destination_type", "exchange")
        elif isinstance(destination, Queue):
            object.__setattr__(self, "destination_type", "queue")
            if destination.name:
                object.__setattr__(self, "destination", destination.name)
        entity = "binding"
        check_shortstr(entity, "source", self.source)
        if not self.source:
            raise TopologyValidationError(
                entity, "source", "the default exchange '' cannot have bindings"
            )
        entity = f"binding from {self.source!r}"
        if self.destination_type not in ("queue", "exchange"):
            raise TopologyValidationError(
                entity,
                "destination_type",
                f"must be 'queue' or 'exchange', got {self.destination_type!r}",
            )
        if not isinstance(self.destination, Queue):
            check_shortstr(entity, "destination", self.destination)
            if not self.destination:
                raise TopologyValidationError(
                    entity,
                    "destination",
                    "must not be empty (pass the Queue object to bind a server-named queue)",
                )
        check_shortstr(entity, "routing_key", self.routing_key)
        arguments = check_arguments(entity, self.arguments)
        check_encodable(entity, arguments)
        object.__setattr__(self, "arguments", arguments or None)

    @property
    def destination_name(self) -> str:
        """The destination's name (``""`` for a server-named queue not yet declared)."""
        return self.destination.name if isinstance(self.destination, Queue) else self.destination

    @property
    def label(self) -> str:
        """``binding 'src' -> queue 'dst' (routing key 'k')``."""
        target = entity_label(self.destination_type, self.destination_name)
        text = f"binding {self.source!r} -> {target} (routing key {self.routing_key!r})"
        if self.arguments:
            text += f" {dict(self.arguments)}"
        return text

    def same_as(self, other: Binding) -> bool:
        """Whether ``other`` is the same binding on the broker.

        Args:
            other: another binding.

        Returns:
            Same source, destination, routing key and arguments (a server-named
            destination: the same ``Queue`` object).
        """
        if isinstance(self.destination, Queue) or isinstance(other.destination, Queue):
            if self.destination is not other.destination:
                return False
        elif self.destination != other.destination:
            return False
        return (
            self.source == other.source
            and self.destination_type == other.destination_type
            and self.routing_key == other.routing_key
            and (self.arguments or {}) == (other.arguments or {})
        )


def format_expiration(value: int | float | timedelta | str) -> str:
    """A per-message ``expiration`` property value: milliseconds as a string of digits.

    RabbitMQ requires the property to be a string of ASCII digits (a per-message TTL
    in 0..2^32-1 ms).

    Args:
        value: such a string, an int of milliseconds, or a timedelta (rounded to
            whole milliseconds).

    Returns:
        The milliseconds as a string of digits.

    Raises:
        TopologyValidationError: negative, too large, fractional ms given as a number,
            or a string that is not all digits.
    """
    entity, name = "message", "expiration"
    if isinstance(value, timedelta):
        ms = round(value.total_seconds() * 1000)
    elif isinstance(value, str):
        if not (value.isascii() and value.isdigit()):
            raise TopologyValidationError(
                entity, name, f"must be a string of digits (milliseconds), got {value!r}"
            )
        ms = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise TopologyValidationError(
            entity,
            name,
            f"must be milliseconds (int or digit string) or a timedelta, got {value!r}",
        )
    return str(check_integer(entity, name, ms, 0, MAX_UINT32, " (milliseconds)"))

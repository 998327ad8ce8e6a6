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

import contextlib
import logging
import re
from contextvars import ContextVar
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
    policy_choice,
    policy_int,
    policy_max_age,
    policy_str,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = [
    "BUILTIN_EXCHANGES",
    "BUILTIN_EXCHANGE_TYPES",
    "MAX_UINT32",
    "MODULUS_HASH",
    "OVERFLOW_MODES",
    "PLUGIN_EXCHANGE_TYPES",
    "POLICY_APPLY_TO",
    "POLICY_KEYS",
    "QUEUE_ARGUMENTS",
    "QUEUE_TYPES",
    "SERVER_NAMED_PREFIX",
    "UNLIMITED_DELIVERIES",
    "Binding",
    "Exchange",
    "Policy",
    "Queue",
    "broker_policies",
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


def _delivery_limit(entity: str, name: str, value: object) -> int:
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
            _delivery_limit(entity, "delivery_limit (x-delivery-limit)", self.delivery_limit)
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


# --------------------------------------------------------------------------- policies

#: What a policy may apply to (``apply-to``). RabbitMQ 3.12+ also knows the per-type
#: values; an older broker refuses them with 400 and the API's reason.
POLICY_APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams")
_QUEUE_MODES = ("default", "lazy")
_LOCATORS = ("client-local", "min-masters", "random", "balanced")


_MS = " (milliseconds)"
#: Policy keys rabbitry checks, what they apply to (``q``: queues, ``x``: exchanges)
#: and their rule. Queue keys are the ``x-`` arguments without the prefix and follow
#: the same rules (RabbitMQ validates policy values with the same checks).
POLICY_KEYS: dict[str, tuple[str, Any]] = {
    "message-ttl": ("q", policy_int(0, MAX_UINT32, _MS)),
    "expires": ("q", policy_int(1, MAX_UINT32, _MS)),
    "dead-letter-exchange": ("q", policy_str()),
    "dead-letter-routing-key": ("q", policy_str()),
    "dead-letter-strategy": ("q", policy_choice(("at-most-once", "at-least-once"))),
    "max-length": ("q", policy_int(0, None)),
    "max-length-bytes": ("q", policy_int(0, None)),
    "overflow": ("q", policy_choice(OVERFLOW_MODES)),
    "queue-mode": ("q", policy_choice(_QUEUE_MODES)),
    "queue-version": ("q", policy_choice((1, 2))),
    "delivery-limit": ("q", _delivery_limit),
    "max-age": ("q", policy_max_age),
    "stream-max-segment-size-bytes": ("q", policy_int(1, None)),
    "queue-master-locator": ("q", policy_choice(_LOCATORS)),
    "queue-leader-locator": ("q", policy_choice(_LOCATORS)),
    "consumer-timeout": ("q", policy_int(1, None, _MS)),
    "alternate-exchange": ("x", policy_str(empty=False)),
    "federation-upstream": ("qx", policy_str(empty=False)),
    "federation-upstream-set": ("qx", policy_str(empty=False)),
    # rabbitmq_sharding: shard queues per node for the exchanges it matches, and the
    # key they are bound with (it needs shards-per-node; x-modulus-hash ignores it).
    "shards-per-node": ("x", policy_int(1, None)),
    "routing-key": ("x", policy_str()),
}
#: Classic queue mirroring's keys. RabbitMQ 4.0 removed mirroring (its management API
#: answers 400); a ``Policy`` refuses them, and one read from a 3.x broker keeps them.
MIRRORING_KEYS = (
    "ha-mode",
    "ha-params",
    "ha-sync-mode",
    "ha-sync-batch-size",
    "ha-promote-on-shutdown",
    "ha-promote-on-failure",
)
_QUEUE_ONLY_APPLY = ("queues", "classic_queues", "quorum_queues", "streams")
_BROKER_POLICIES: ContextVar[bool] = ContextVar("rabbitry_broker_policies", default=False)


@contextlib.contextmanager
def broker_policies() -> Iterator[None]:
    """Within it, ``Policy`` keeps definition keys and values rabbitry would refuse.

    Used when reading what a broker already has (a definitions export, the management
    API): the broker validated the policy itself, and a plugin or a newer version may
    define keys missing from :data:`POLICY_KEYS`, or allow values rabbitry's checks do
    not know. Unknown keys are kept silently; a known key with a value that fails its
    check, and classic mirroring keys (from a 3.x broker), are kept with a warning
    logged on ``rabbitry.topology``, so one such policy never makes a whole vhost
    unreadable.
    """
    token = _BROKER_POLICIES.set(True)
    try:
        yield
    finally:
        _BROKER_POLICIES.reset(token)


@dataclass(frozen=True, eq=True)
class Policy:
    """A policy: settings the broker applies to every queue and/or exchange whose name
    matches ``pattern`` (``rabbitmqctl set_policy``, management ``PUT /api/policies``).

    Only the highest-priority matching policy applies to an entity. A policy can be
    changed at any time, unlike a queue's arguments. When a policy and a queue argument
    both set a key, RabbitMQ resolves it per key (see ``Topology.diff``).

    Args:
        name: the policy name (not empty).
        pattern: a regular expression matched against entity names (``"^orders\\."``;
            ``".*"`` for all). Checked with Python's ``re``, close to RabbitMQ's PCRE.
        apply_to: ``"all"``, ``"queues"`` or ``"exchanges"`` (3.12+ also
            ``"classic_queues"``, ``"quorum_queues"``, ``"streams"``).
        definition: the keys to set, e.g. ``{"message-ttl": 60000,
            "dead-letter-exchange": "dlx"}``: queue keys are the ``x-`` arguments
            without the prefix, checked by the same rules (see :data:`POLICY_KEYS`).
        priority: higher wins when several policies match (an integer, default 0).

    Raises:
        TopologyValidationError: a field or a definition key breaks a rule; the message
            names it.
    """

    name: str
    pattern: str
    apply_to: str = "all"
    definition: Mapping[str, Any] | None = None
    priority: int = 0

    KIND: ClassVar[str] = "policy"
    __hash__ = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        entity = entity_label("policy", self.name if isinstance(self.name, str) else "?")
        check_shortstr(entity, "name", self.name, empty=False)
        if not isinstance(self.pattern, str):
            raise TopologyValidationError(
                entity, "pattern", f"must be a str (a regular expression), got {self.pattern!r}"
            )
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise TopologyValidationError(
                entity, "pattern", f"must be a valid regular expression: {exc}"
            ) from None
        if self.apply_to not in POLICY_APPLY_TO:
            raise TopologyValidationError(
                entity,
                "apply_to",
                f"must be one of {', '.join(POLICY_APPLY_TO)}, got {self.apply_to!r}",
            )
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise TopologyValidationError(
                entity, "priority", f"must be an integer, got {self.priority!r}"
            )
        definition = check_arguments(entity, self.definition)
        if not definition:
            raise TopologyValidationError(
                entity, "definition", "must set at least one key (RabbitMQ refuses an empty one)"
            )
        for key, value in definition.items():
            field = f"definition[{key!r}]"
            if key.startswith("x-"):
                raise TopologyValidationError(
                    entity,
                    field,
                    f"policy keys have no 'x-' prefix: use {key[2:]!r} (queue arguments "
                    "are x-*, policy keys are not)",
                )
            from_broker = _BROKER_POLICIES.get()
            if key in MIRRORING_KEYS:
                if not from_broker:
                    raise TopologyValidationError(
                        entity,
                        field,
                        "classic queue mirroring (ha-* keys) was removed in RabbitMQ 4.0, "
                        "which refuses such policies; replicate with quorum queues "
                        "(queue_type='quorum') or streams instead",
                    )
                _log.warning(
                    "%s: %s: kept as read from the broker, but classic queue mirroring was "
                    "removed in RabbitMQ 4.0",
                    entity,
                    field,
                )
                continue
            known = POLICY_KEYS.get(key)
            if known is None:
                if from_broker:
                    continue
                raise TopologyValidationError(
                    entity,
                    field,
                    f"unknown policy key; known keys: {', '.join(sorted(POLICY_KEYS))}",
                )
            targets, check = known
            try:
                check(entity, field, value)
            except TopologyValidationError as exc:
                if not from_broker:
                    raise
                _log.warning("%s; kept as read from the broker", exc)
                continue
            if targets == "q" and self.apply_to == "exchanges":
                raise TopologyValidationError(
                    entity, field, "is a queue key but the policy applies to exchanges only"
                )
            if targets == "x" and self.apply_to in _QUEUE_ONLY_APPLY:
                raise TopologyValidationError(
                    entity, field, "is an exchange key but the policy applies to queues only"
                )
        if (
            "routing-key" in definition
            and "shards-per-node" not in definition
            and not _BROKER_POLICIES.get()
        ):
            raise TopologyValidationError(
                entity,
                "definition['routing-key']",
                "is a rabbitmq_sharding key and needs 'shards-per-node' in the same "
                "policy (the plugin refuses it alone)",
            )
        object.__setattr__(self, "definition", definition)

    @property
    def label(self) -> str:
        """``policy 'name'``: how messages name it."""
        return entity_label("policy", self.name)

    def applies_to_queue(self, name: str, queue_type: str | None = None) -> bool:
        """Whether this policy's pattern and ``apply_to`` select queue ``name``.

        Args:
            name: the queue name.
            queue_type: its type (``None``: ``classic``).

        Returns:
            ``True`` if the policy applies to the queue.
        """
        if self.apply_to == "exchanges":
            return False
        kind = queue_type or "classic"
        per_type = {"classic_queues": "classic", "quorum_queues": "quorum", "streams": "stream"}
        if self.apply_to in per_type and per_type[self.apply_to] != kind:
            return False
        return re.search(self.pattern, name) is not None

    def applies_to_exchange(self, name: str) -> bool:
        """Whether this policy's pattern and ``apply_to`` select exchange ``name``.

        Args:
            name: the exchange name.

        Returns:
            ``True`` if the policy applies to the exchange.
        """
        return self.apply_to in ("all", "exchanges") and re.search(self.pattern, name) is not None

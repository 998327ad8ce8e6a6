"""Policies: :class:`Policy`, the keys rabbitry checks, and reading a broker's own.

A policy's queue keys are the ``x-`` arguments of :mod:`rabbitry.topology._model`
without the prefix, checked by the same rules; exchange keys are the plugins' and the
alternate exchange's.
"""

from __future__ import annotations

import contextlib
import logging
import re
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..exceptions import TopologyValidationError
from ._checks import (
    check_arguments,
    check_shortstr,
    policy_choice,
    policy_int,
    policy_max_age,
    policy_str,
)
from ._model import MAX_UINT32, OVERFLOW_MODES, check_delivery_limit, entity_label

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = ["MIRRORING_KEYS", "POLICY_APPLY_TO", "POLICY_KEYS", "Policy", "broker_policies"]

_log = logging.getLogger("rabbitry.topology")

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
    "delivery-limit": ("q", check_delivery_limit),
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

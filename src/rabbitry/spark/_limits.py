"""The effective delivery limit of a quorum queue, and what a return does to a message.

A quorum queue counts how often each message went back to the queue (its
``x-delivery-count`` header, absent or 0 on the first delivery). When a message whose
count already equals the queue's *delivery limit* is returned once more, the broker
dead-letters it (to the queue's dead-letter exchange) or, with none, drops it. Measured
on RabbitMQ 3.10.8 and 4.0.5 with ``x-delivery-limit=2``: deliveries carry counts
``None, 1, 2``, and the third return removes the message.

Which returns count (measured on 3.10.8 and 4.0.5, quorum queue): every one of them.
``basic.nack requeue=true``, ``basic.reject requeue=true``, closing the channel or the
connection with the delivery unacknowledged, and ``basic.cancel`` followed by a nack or a
close all raise the count by one; ``basic.get`` followed by a close too. AMQP 0-9-1 has
no return that leaves the count alone on these versions (RabbitMQ 4.3 stops counting
``basic.nack requeue=true``; this module does not rely on that).

The limit comes from, in this order of preference:

* the queue's ``x-delivery-limit`` argument and the ``delivery-limit`` key of the policy
  (or operator policy) that applies to it; with both, the broker uses the smaller. AMQP
  0-9-1 cannot read either (``queue.declare`` answers only counts); the management API
  can (:class:`~rabbitry.management.ManagementClient`), so it is asked when the caller
  has one;
* a limit the user states (a Spark option such as ``deliveryLimit``);
* the broker's default: 20 on RabbitMQ 4.x, none on 3.x; used only when the management
  API showed that neither an argument nor a policy sets one.

When nothing is known (no management API, no stated limit), :func:`effective_delivery_limit`
returns a :class:`DeliveryLimit` with ``source="unknown"`` and ``limit=None``;
:attr:`DeliveryLimit.known` is then false and callers must take the safe side (refuse
to return messages, and say how to tell the limit).

Stable API (used by the batch reader and the streaming source):

* :class:`DeliveryLimit` (``queue``, ``limit``, ``source``, ``dead_letter_exchange``,
  ``dead_letter_routing_key``, ``server_version``; ``known``, ``can_return(count)``,
  ``returns_left(count)``, ``describe()``);
* :func:`effective_delivery_limit` (conn-free: the caller passes the broker version,
  the queue type and optional management client and stated limit);
* :func:`broker_default_limit`, :func:`delivery_count`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..management import ManagementClient
    from ..protocol.message import Message

__all__ = [
    "DEFAULT_LIMIT_4X",
    "DeliveryLimit",
    "LimitSource",
    "broker_default_limit",
    "delivery_count",
    "effective_delivery_limit",
]

logger = logging.getLogger("rabbitry.spark")

#: RabbitMQ 4.x's delivery limit for a quorum queue that sets none.
DEFAULT_LIMIT_4X: Final = 20

#: Where a :class:`DeliveryLimit` came from.
LimitSource = Literal[
    "argument",  # x-delivery-limit (read through the management API)
    "policy",  # a policy's or operator policy's delivery-limit (management API)
    "option",  # stated by the user
    "broker-default",  # neither argument nor policy: the broker's default
    "not-quorum",  # classic and stream queues have no delivery limit
    "unknown",  # a quorum queue whose limit could not be learned
]


def broker_default_limit(server_version: tuple[int, ...]) -> int | None:
    """The delivery limit a quorum queue has when nothing sets one.

    Args:
        server_version: the broker's version, e.g. ``(4, 0, 5)``.

    Returns:
        20 on RabbitMQ 4.x and later, ``None`` (no limit) on 3.x.
    """
    return DEFAULT_LIMIT_4X if server_version and server_version[0] >= 4 else None


def delivery_count(message: Message) -> int:
    """How often ``message`` went back to its quorum queue before this delivery.

    Args:
        message: a delivery.

    Returns:
        Its ``x-delivery-count`` header, 0 when absent (a first delivery, or a queue
        that does not count).
    """
    headers = message.properties.headers or {}
    value = headers.get("x-delivery-count")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclasses.dataclass(frozen=True)
class DeliveryLimit:
    """A queue's effective delivery limit and where it was learned.

    Attributes:
        queue: the queue.
        limit: the limit (a message whose count equals it is removed by its next
            return), or ``None``: no limit, or not known (see :attr:`known`).
        source: where ``limit`` came from (:data:`LimitSource`).
        dead_letter_exchange: where removed messages go, when known (``None``: dropped,
            or not known).
        dead_letter_routing_key: the routing key they get there, when set.
        server_version: the broker's version.
    """

    queue: str
    limit: int | None
    source: LimitSource
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    server_version: tuple[int, ...] = ()

    @property
    def known(self) -> bool:
        """False for a quorum queue whose limit could not be learned."""
        return self.source != "unknown"

    def returns_left(self, count: int) -> int | None:
        """How many more returns a message of ``count`` survives.

        Args:
            count: the delivery's ``x-delivery-count`` (see :func:`delivery_count`).

        Returns:
            ``limit - count`` (0: the next return removes it), ``None`` when unlimited.
            An unknown limit counts as 0.
        """
        if not self.known:
            return 0
        if self.limit is None:
            return None
        return max(0, self.limit - count)

    def can_return(self, count: int, *, spare: int = 1) -> bool:
        """Whether a delivery of ``count`` may be returned, keeping ``spare`` returns.

        The default keeps one return in hand for whoever reads the message next (a
        failed consumer, a dropped connection): a message is never returned onto its
        limit.

        Args:
            count: the delivery's ``x-delivery-count``.
            spare: returns that must remain after this one.

        Returns:
            True when unlimited, or when ``count + 1 + spare <= limit``.
        """
        left = self.returns_left(count)
        return left is None or left >= 1 + spare

    def describe(self) -> str:
        """One phrase for error messages: the limit, its source and the dead-letter target."""
        if not self.known:
            return (
                f"delivery limit of queue {self.queue!r} unknown (AMQP 0-9-1 cannot read "
                "x-delivery-limit or a delivery-limit policy; "
                f"{_default_phrase(self.server_version)})"
            )
        if self.limit is None:
            return f"queue {self.queue!r} has no delivery limit ({self.source})"
        where = (
            f"dead-lettered to exchange {self.dead_letter_exchange!r}"
            if self.dead_letter_exchange
            else "dropped (no dead-letter exchange)"
            if self.source != "option"
            else "dead-lettered or dropped"
        )
        return (
            f"queue {self.queue!r} has delivery limit {self.limit} ({self.source}); "
            f"a message returned more often is {where}"
        )


def _default_phrase(version: tuple[int, ...]) -> str:
    if broker_default_limit(version) is None:
        return "no limit by default on RabbitMQ 3.x"
    return f"{DEFAULT_LIMIT_4X} by default on RabbitMQ 4.x"


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _from_management(
    queue: str,
    arguments: Mapping[str, Any],
    policy: Mapping[str, Any],
    version: tuple[int, ...],
) -> DeliveryLimit:
    arg = _int(arguments.get("x-delivery-limit"))
    pol = _int(policy.get("delivery-limit"))
    if arg is not None and arg < 0:
        arg = None  # a negative limit means none (4.x)
    if pol is not None and pol < 0:
        pol = None
    dlx = arguments.get("x-dead-letter-exchange", policy.get("dead-letter-exchange"))
    dlk = arguments.get("x-dead-letter-routing-key", policy.get("dead-letter-routing-key"))
    common = {
        "dead_letter_exchange": str(dlx) if dlx else None,
        "dead_letter_routing_key": str(dlk) if dlk else None,
        "server_version": version,
    }
    if arg is not None and (pol is None or arg <= pol):
        return DeliveryLimit(queue, arg, "argument", **common)  # type: ignore[arg-type]
    if pol is not None:
        return DeliveryLimit(queue, pol, "policy", **common)  # type: ignore[arg-type]
    return DeliveryLimit(
        queue,
        broker_default_limit(version),
        "broker-default",
        **common,  # type: ignore[arg-type]
    )


def effective_delivery_limit(
    queue: str,
    queue_type: str,
    server_version: tuple[int, ...],
    *,
    stated: int | None = None,
    management: ManagementClient | None = None,
    vhost: str = "/",
) -> DeliveryLimit:
    """Learn the delivery limit that applies to ``queue``.

    Args:
        queue: the queue.
        queue_type: ``classic``, ``quorum`` or ``stream`` (only quorum queues count).
        server_version: the broker's version (``Connection.server_version``).
        stated: a limit the user states (used when the management API gives no answer;
            a limit the management API shows wins, and a stated one that differs is
            logged as a WARNING).
        management: a management client to read the queue's arguments and effective
            policy; ``None``: not available. An error from it is logged and the lookup
            goes on without it.
        vhost: the queue's virtual host, for the management API.

    Returns:
        The limit and where it came from; ``source="unknown"`` when nothing tells it.
    """
    if queue_type != "quorum":
        return DeliveryLimit(queue, None, "not-quorum", server_version=server_version)
    if management is not None:
        try:
            info = management.queue(queue, vhost)
        except Exception as exc:  # unreachable API, 401, 404: go on without it
            logger.warning(
                "rabbitmq: could not read the delivery limit of queue %r from the "
                "management API: %s",
                queue,
                exc,
            )
        else:
            found = _from_management(
                queue, info.arguments, info.effective_policy_definition, server_version
            )
            if stated is not None and stated != found.limit:
                logger.warning(
                    "rabbitmq: option deliveryLimit is %d but the management API shows %s; "
                    "using the broker's",
                    stated,
                    found.describe(),
                )
            return found
    if stated is not None:
        return DeliveryLimit(
            queue, stated if stated >= 0 else None, "option", server_version=server_version
        )
    return DeliveryLimit(queue, None, "unknown", server_version=server_version)

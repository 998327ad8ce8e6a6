"""Delayed retry and the parking lot: the policy, the topology it needs, and the move.

Theory of operation
-------------------
For a work queue ``Q`` and a :class:`RetryPolicy`, ``Topology.with_retry("Q", policy)``
adds (names are fixed so operators can find them)::

    Q.dlx                 direct exchange: the hub of the retry machinery
    Q.retry.<delay>       one queue per distinct delay, x-message-ttl = delay,
                          dead-lettering to Q.dlx with routing key "Q" (back to work)
    Q.parking-lot         where messages go after max_attempts (policy.parking_lot)
    bindings on Q.dlx     "Q" -> Q, "Q.retry.<delay>" -> that queue,
                          "Q.parking-lot" -> Q.parking-lot

and makes ``Q`` dead-letter to ``Q.dlx``. One queue per delay because RabbitMQ expires
messages only at the head of a queue: with one TTL per queue, arrival order is expiry
order and no message waits behind a longer one. Messages come back through ``Q.dlx``,
not through the application's exchange, so other queues bound there never see a retry.

Two ways to move a failed message, chosen by the number of distinct delays:

* **One delay — broker-driven.** The work queue's ``x-dead-letter-routing-key`` is the
  retry queue; a failure is ``basic.nack(requeue=False)``; RabbitMQ dead-letters it to
  the retry queue, expires it after the delay, and dead-letters it back. The client
  never republishes, so the broker's ``x-death`` entry for (``Q``, ``rejected``) counts
  the failures exactly; that count is the attempt number. Nothing is published, so
  nothing can be lost between a publish and an ack.
* **Several delays (backoff tiers) — client republish.** A dead-letter exchange sends
  every rejected message to one place, so the tier has to be chosen by the client: it
  republishes the message to ``Q.dlx`` with the tier's routing key, with publisher
  confirms and ``mandatory``, and acks the original only after the broker confirmed.
  The attempt count travels in our own header, ``x-rabbitry-attempts``: RabbitMQ 4.x
  ignores an ``x-death`` header set by a publisher, so it cannot be carried that way.
  Here the work queue dead-letters to the parking lot, which catches messages rejected
  outside the policy (e.g. quorum ``x-delivery-limit``).

After ``max_attempts`` handler invocations (or at once for a non-retryable error) the
message is republished, confirmed, to ``Q.parking-lot`` with headers saying why, then
the original is acked. Both paths are correct on RabbitMQ 3.10 and 4.x.

Quorum queues and their delivery limit
--------------------------------------
A quorum queue counts every *return* of a message (``nack``/``reject`` with requeue, a
handler raising ``Requeue``, a channel or connection closed with the message unacked)
and dead-letters it with reason ``delivery_limit`` once the count passes the queue's
delivery limit; without a dead-letter exchange it is dropped. RabbitMQ 4.0 made 20 the
default. So, for a quorum work queue, ``with_retry``:

* sets the work queue's delivery limit explicitly (``delivery_limit=``, default
  :data:`WORK_QUEUE_DELIVERY_LIMIT` = 20, the same on 3.x and 4.x), unless the queue
  already has one;
* gives the retry queues and the parking lot :data:`HELPER_DELIVERY_LIMIT`
  (2^31 - 1, never reached): inspecting a parking lot takes messages without acking
  them and gives them back, which counts, and a parking lot must never drop a message.
  (``-1``, 4.x's "unlimited", is not used: RabbitMQ 3.x dead-letters at the first
  return with it.)
* requires the client-republish path (several delays, or ``republish=True``): the work
  queue then dead-letters to the parking lot, so a ``delivery_limit`` dead-letter is
  parked, with the broker's ``x-first-death-reason: delivery_limit`` and ``x-death``
  headers saying why. With the broker-driven path it would go to the retry queue and,
  on its way back, into a dead-letter cycle without a ``rejected`` step, which RabbitMQ
  drops silently; ``with_retry`` refuses that combination (unless the work queue's
  limit is ``-1``, unlimited, on RabbitMQ 4.x only).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import Counter
from typing import TYPE_CHECKING, Any, Literal

from ..exceptions import (
    InvalidStateError,
    NotFound,
    PublishOutcomeUnknown,
    PublishRefused,
    Timeout,
    TopologyError,
)
from ..protocol.spec import BasicProperties
from ._retry_policy import (
    ATTEMPTS_HEADER,
    DELIVERY_LIMIT_REASON,
    EXCEPTION_MESSAGE_HEADER,
    EXCEPTION_TYPE_HEADER,
    FIRST_FAILURE_HEADER,
    HELPER_DELIVERY_LIMIT,
    LAST_FAILURE_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    PARKED_REASON_HEADER,
    WORK_QUEUE_DELIVERY_LIMIT,
    RetryDecision,
    RetryNames,
    RetryPolicy,
    delay_label,
    dlx_name,
    parking_lot_name,
    retry_queue_name,
)

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import datetime

    from ..aio.channel import AsyncChannel
    from ..protocol.message import Message

__all__ = [
    "ATTEMPTS_HEADER",
    "DELIVERY_LIMIT_REASON",
    "EXCEPTION_MESSAGE_HEADER",
    "EXCEPTION_TYPE_HEADER",
    "FIRST_FAILURE_HEADER",
    "HELPER_DELIVERY_LIMIT",
    "LAST_FAILURE_HEADER",
    "ORIGINAL_EXCHANGE_HEADER",
    "ORIGINAL_ROUTING_KEY_HEADER",
    "PARKED_REASON_HEADER",
    "WORK_QUEUE_DELIVERY_LIMIT",
    "RetryDecision",
    "RetryNames",
    "RetryPolicy",
    "delay_label",
    "dlx_name",
    "handle_failure",
    "parking_lot_name",
    "retry_queue_name",
]

logger = logging.getLogger("rabbitry.retry")


# --------------------------------------------------------------------------- the move


class _ReturnWatch:
    """Counts basic.return per (exchange, routing key) on one channel.

    RabbitMQ sends the basic.return of an unroutable mandatory message before its
    basic.ack, so a count taken before publishing and compared after the confirm says
    whether our message came back.
    """

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()

    def __call__(self, message: Message) -> None:
        self.counts[(message.exchange, message.routing_key)] += 1


_WATCHES: weakref.WeakKeyDictionary[AsyncChannel, _ReturnWatch] = weakref.WeakKeyDictionary()


def _watch(channel: AsyncChannel) -> _ReturnWatch:
    watch = _WATCHES.get(channel)
    if watch is None:
        watch = _WATCHES[channel] = _ReturnWatch()
        channel.add_return_callback(watch)
    return watch


def _properties(original: BasicProperties, headers: Mapping[str, Any]) -> BasicProperties:
    values = {name: getattr(original, name) for name in BasicProperties.FIELDS}
    values["headers"] = dict(headers)
    # The delay is ours and a parked message must not vanish: drop a per-message TTL
    # (RabbitMQ removes it on dead-lettering for the same reason).
    values["expiration"] = None
    return BasicProperties(**values)


async def handle_failure(
    channel: AsyncChannel,
    message: Message,
    exc: BaseException,
    policy: RetryPolicy,
    *,
    queue: str | None = None,
    retryable: bool | None = None,
    now: datetime | None = None,
    timeout: float | None = 30.0,
) -> Literal["retry", "park", "drop"]:
    """Move a message whose handler failed: retry it, park it, or drop it; then settle it.

    Every republish (tier retry, parking lot) is confirmed by the broker, and returned
    if unroutable, before the original is acked; if anything fails the original stays
    unacknowledged (the broker redelivers it) and the error propagates. The channel is
    put in confirm mode if it is not (it must not be transactional).

    Args:
        channel: the channel the message was delivered on (the ack must go there).
        message: the failed delivery (not yet acked).
        exc: what the handler raised.
        policy: the retry policy (the one given to ``Topology.with_retry``).
        queue: the work queue (default: ``policy.queue``).
        retryable: overrides ``policy.is_retryable(exc)``.
        now: the failure time (default: now).
        timeout: seconds to wait for the confirm.

    Returns:
        ``"retry"``, ``"park"`` or ``"drop"``.

    Raises:
        TopologyError: the republished message was unroutable (the retry topology is
            not declared).
        Nacked, Timeout, ChannelClosed...: the move was not confirmed.
        InvalidStateError: the message was already acked or rejected.
    """
    if message.settled:
        raise InvalidStateError(f"delivery {message.delivery_tag} was already settled")
    if getattr(channel, "epoch", 0) != message.epoch:
        # The connection recovered since the delivery: its tag is dead and the broker
        # redelivers the message; moving it now would leave a copy behind, and acking
        # the stale tag would hit another delivery on the new channel.
        raise InvalidStateError(
            f"delivery {message.delivery_tag} arrived before the connection recovered"
        )
    decision = policy.plan(message, exc, now, queue=queue, retryable=retryable)
    if decision.via == "nack":
        channel.basic_nack(message.delivery_tag, requeue=False)
        message.settled = True
        return decision.kind
    if decision.via == "ack":
        logger.warning(
            "dropping delivery %s after %d attempts (no parking lot): %r",
            message.delivery_tag,
            decision.attempts,
            exc,
        )
        channel.basic_ack(message.delivery_tag)
        message.settled = True
        return decision.kind
    if not channel.confirm_mode:
        await channel.confirm_select(timeout=timeout)
    watch = _watch(channel)
    route = (decision.exchange, decision.routing_key)
    before = watch.counts[route]
    confirm = await channel.basic_publish(
        decision.exchange,
        decision.routing_key,
        message.body,
        properties=_properties(message.properties, decision.headers),
        mandatory=True,
    )
    assert confirm is not None  # confirm mode
    try:
        async with asyncio.timeout(timeout):
            await confirm
    except (PublishRefused, PublishOutcomeUnknown) as exc:
        if isinstance(exc.__cause__, NotFound):  # the channel died of a 404 on publish
            raise TopologyError(
                f"moving a failed message failed: exchange {decision.exchange!r} does not "
                "exist. Is the retry topology declared (Topology.with_retry(...).apply)? "
                "The original was not acked; the broker will deliver it again."
            ) from exc
        raise
    except TimeoutError:
        raise Timeout(
            f"the broker did not confirm the {decision.kind} move within {timeout} s"
        ) from None
    if watch.counts[route] != before:
        raise TopologyError(
            f"moving a failed message to exchange {decision.exchange!r} with routing key "
            f"{decision.routing_key!r} failed: unroutable. Is the retry topology declared "
            "(Topology.with_retry(...).apply)?"
        )
    channel.basic_ack(message.delivery_tag)
    message.settled = True
    return decision.kind

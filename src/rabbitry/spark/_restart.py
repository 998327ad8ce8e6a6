"""Quorum queues in the streaming source: refusing a restart that could lose messages.

A quorum queue raises a message's ``x-delivery-count`` at every return, and removes it
(dead-letters or drops it) at the return after the count reached the queue's delivery
limit. A failed run of a streaming query returns the batch it held; the offset of that
batch records the highest count of its messages, so the restart that replays it can be
refused before it reads anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exceptions import DeliveryLimitRefused
from ._batch_plan import lookup_limit
from ._limits import DeliveryLimit, broker_default_limit

if TYPE_CHECKING:
    from ._options import ReadOptions

__all__ = ["DeliveryLimitRefused", "queue_delivery_limit", "restart_check"]


def queue_delivery_limit(options: ReadOptions) -> DeliveryLimit:
    """The delivery limit of the read's quorum queue, as far as AMQP 0-9-1 tells.

    AMQP 0-9-1 cannot read an ``x-delivery-limit`` argument or a ``delivery-limit``
    policy: the limit comes from ``managementUrl`` or ``deliveryLimit``; without either
    the broker's default is assumed (20 on RabbitMQ 4.x, none on 3.x).
    """
    conn = options.connect.connect(" [spark limit check]")
    try:
        version = conn.server_version
        found = lookup_limit(options, conn)
    finally:
        conn.close(timeout=5)
    if found.known:
        return found
    return DeliveryLimit(
        options.queue, broker_default_limit(version), "broker-default", server_version=version
    )


def restart_check(options: ReadOptions, start: int, end: int, count: int | None) -> None:
    """Refuse the restart of a streaming query whose failed batch could lose messages.

    ``count`` is the highest ``x-delivery-count`` of batch ``[start, end)`` when it was
    read; the failed run returned its messages, so they are at ``count + 1`` now. If
    reading them once more and failing again would take them to the queue's delivery
    limit, the restart is refused before anything is read: with
    ``acceptDeliveryCount=true`` it goes on while one more failure leaves them in the
    queue, never when the next return would remove them.

    Raises:
        DeliveryLimitRefused: naming the queue, the limit and the way out.
    """
    if options.queue_type != "quorum" or count is None:
        return
    limit = queue_delivery_limit(options)
    now = count + 1
    left = limit.returns_left(now)
    if left is None or left >= 2 or (left == 1 and options.accept_delivery_count):
        return
    if left == 1:
        risk = "one more failed run takes them to the limit, after which any return removes them"
        way_out = (
            "fix what fails the batch (the sink) and restart with acceptDeliveryCount=true "
            "(a failure then still leaves them in the queue), raise the queue's limit (a "
            "delivery-limit policy), or move the messages aside (e.g. rabbitry dlq, or a "
            "shovel to another queue)"
        )
    else:
        risk = "the next return removes them, so no restart may read them"
        way_out = (
            "raise the queue's limit (a delivery-limit policy) or move the messages aside "
            "(e.g. rabbitry dlq, or a shovel to another queue), and fix what fails the "
            "batch (the sink)"
        )
    raise DeliveryLimitRefused(
        f"rabbitmq source {options.queue!r}: refusing to restart: the messages of the "
        f"failed batch [{start}, {end}) were delivered with x-delivery-count up to "
        f"{count} and returned when the run failed, so they are at {now}; "
        f"{limit.describe()}; {risk}. Nothing was read. Way out: {way_out}",
        options.queue,
        limit.limit,
    )

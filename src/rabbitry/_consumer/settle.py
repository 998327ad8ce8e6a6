"""Settling a consumer's deliveries, and the failure path of the ones its handler failed.

:class:`Settler` acks, nacks and rejects each delivery once, on the channel it arrived
on (never on a channel that replaced it). :class:`FailurePath` sends a failed message
where the consumer's retry policy or its queue's dead-lettering says: a retry or parking queue,
the dead-letter exchange, back to the queue (:class:`~rabbitry.exceptions.Requeue`), or
nowhere. :func:`check_failure_path` is ``start()``'s check that those places exist.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .._support.failure_log import FailureLog
from ..exceptions import AMQPError, ConfigurationError, Reject, Requeue
from ..observability import _state as _obs

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..aio.connection import AsyncConnection
    from ..protocol.message import Message
    from ..topology._retry import RetryDecision, RetryPolicy
    from .stores import ConsumerStats

__all__ = ["UNKNOWN", "FailurePath", "Settler", "check_failure_path"]

logger = logging.getLogger("rabbitry.consumer")

#: ``Settler.dead_letter`` before start() has looked (or when it cannot know).
UNKNOWN = object()

#: Seconds to wait before requeueing a message whose retry/parking move failed.
_FAILED_MOVE_PAUSE = 1.0
#: Handler failures logged with a traceback per consumer and interval (then counted).
_FAILURE_LOG_BURST = 10
_FAILURE_LOG_INTERVAL = 60.0


class _Owner(Protocol):
    """What :class:`FailurePath` reads of its consumer (it also names it in its logs and
    hands it to the observability hooks)."""

    @property
    def queue(self) -> str: ...

    @property
    def retry(self) -> RetryPolicy | None: ...


class Settler:
    """Settles each delivery once, on the channel it arrived on, counting the acks.

    Args:
        owner: the consumer (named in the logs).
        manual: manual acks (with auto acks nothing is ever settled).
        stats: the consumer's counters.
    """

    __slots__ = ("manual", "owner", "stats")

    def __init__(self, owner: object, *, manual: bool, stats: ConsumerStats) -> None:
        self.owner = owner
        self.manual = manual
        self.stats = stats

    def ack(self, message: Message) -> None:
        """Ack ``message`` (with manual acks), unless it is settled; count it.

        Args:
            message: a delivery of the consumer.
        """
        if self.manual and self.settle(message, "ack"):
            self.stats.acked += 1

    def settle(self, message: Message, how: str, **options: Any) -> bool:
        """Ack/nack/reject ``message`` on its own channel, once.

        Args:
            message: a delivery of the consumer.
            how: ``"ack"``, ``"nack"`` or ``"reject"``.
            **options: ``multiple`` (ack), ``requeue`` (nack, reject).

        Returns:
            ``False`` if it was settled before or cannot be settled (channel gone).
        """
        if message.settled:
            return False
        channel = message.channel
        if channel is not None and getattr(channel, "epoch", 0) != message.epoch:
            # The connection recovered since this delivery: its tag died with the old
            # connection (the broker redelivers the message). Sending it now would ack
            # whatever has that number on the new channel, or close it with 406.
            logger.warning(
                "consumer %s: not %sing delivery %s: it arrived before the connection "
                "recovered (the broker redelivers it)",
                self.owner,
                how,
                message.delivery_tag,
            )
            message.settled = True
            return False
        if channel is None or channel.is_closed:
            # The channel (and its delivery tags) are gone: the broker requeues the
            # message itself; sending the tag on another channel would be a 406.
            logger.warning(
                "consumer %s: not %sing delivery %s: its channel is closed (the broker "
                "will redeliver it)",
                self.owner,
                how,
                message.delivery_tag,
            )
            return False
        try:
            if how == "ack":
                channel.basic_ack(message.delivery_tag, options.get("multiple", False))
            elif how == "nack":
                channel.basic_nack(message.delivery_tag, False, options.get("requeue", True))
            else:
                channel.basic_reject(message.delivery_tag, options.get("requeue", False))
        except AMQPError as exc:
            logger.warning(
                "consumer %s: %s of %s failed: %r", self.owner, how, message.delivery_tag, exc
            )
            return False
        message.settled = True
        return True


class FailurePath:
    """Sends the messages the handler failed on where the consumer's retry policy or
    its queue's dead-lettering says (retry, park, requeue, dead-letter, drop), logs it
    in words at a bounded rate, and counts it.

    Args:
        owner: the consumer (for its queue and retry policy, its logs and the
            observability hooks).
        settler: settles the consumer's deliveries.
    """

    __slots__ = ("dead_letter", "failures", "owner", "settler", "stats")

    def __init__(self, owner: _Owner, settler: Settler) -> None:
        self.owner = owner
        self.settler = settler
        self.stats = settler.stats
        #: Handler failures, logged in words at a bounded rate (flushed on stop).
        self.failures = FailureLog(
            logger,
            repr(owner.queue),
            burst=_FAILURE_LOG_BURST,
            interval=_FAILURE_LOG_INTERVAL,
            schedule=_call_later,
        )
        #: The queue's dead-letter exchange as far as start() could tell: a name, None
        #: (it has none) or UNKNOWN (not declared through this connection's topology).
        self.dead_letter: object = UNKNOWN

    async def fail(
        self, message: Message, exc: BaseException, records: tuple[int, int] | None = None
    ) -> None:
        """The handler failed on ``message``: retry, park, requeue or dead-letter it.

        Whatever happens is logged at ERROR with the handler's traceback (rate-limited,
        see :class:`~rabbitry._support.failure_log.FailureLog`), in words.

        Args:
            message: the delivery the handler failed on.
            exc: what the handler raised.
            records: ``(failed, total)`` for a batch envelope: the words and the counts
                say how many records went with it.
        """
        self.stats.failed += 1
        size = 1 if records is None else records[1]
        tag: Any = message.delivery_tag
        if records is not None:
            tag = f"{tag} (a batch envelope: {records[0]} of its {size} records failed)"
        if _obs.active is not None:
            _obs.active.handler_failed(self.owner, message, exc)
        if not self.settler.manual:
            self.failures.failure(
                tag, exc, "lost: auto-acked message (the broker forgot it when it sent it)",
                "lost",
            )  # fmt: skip
            return
        if isinstance(exc, Requeue):
            if self.settler.settle(message, "nack", requeue=True):
                self.stats.requeued += 1
                self.failures.failure(tag, exc, "requeued (the handler raised Requeue)", "requeued")
            else:
                self.failures.failure(tag, exc, _NOT_SETTLED, "not settled")
            return
        policy = self.owner.retry
        if policy is None:
            if not self.settler.settle(message, "nack", requeue=False):
                self.failures.failure(tag, exc, _NOT_SETTLED, "not settled")
                return
            dead_letter = self.dead_letter
            if dead_letter is None:
                self.stats.dropped += 1
                self.stats.dropped_records += size
                action = "dropped: the queue has no dead-letter exchange"
                kind = "dropped"
            elif dead_letter is UNKNOWN:
                action = (
                    "rejected: dead-lettered if the queue has a dead-letter exchange "
                    "(by argument or policy), else dropped by the broker"
                )
                kind = "rejected"
            else:
                action = f"dead-lettered to exchange {dead_letter!r}"
                kind = "dead-lettered"
            self.failures.failure(tag, exc, action, kind)
            return
        from ..topology._retry import handle_failure

        retryable = False if isinstance(exc, Reject) else None
        try:
            decision = policy.plan(message, exc, queue=self.owner.queue, retryable=retryable)
        except ValueError:
            decision = None
        try:
            outcome = await handle_failure(
                message.channel,
                message,
                exc,
                policy,
                queue=self.owner.queue,
                retryable=retryable,
            )
        except (AMQPError, ValueError) as failure:
            # The move was not confirmed, so the original must not be acked. Leaving it
            # unacked would hold a prefetch slot until the channel closes (a stalled
            # consumer) and a later batch's multiple-ack could cover it (a lost message):
            # put it back on its queue instead, after a pause so that a move that keeps
            # failing (retry topology deleted) is not a hot loop.
            self.failures.failure(
                tag,
                exc,
                f"requeued in {_FAILED_MOVE_PAUSE:.1f} s: moving it failed ({failure})",
                "requeued (move failed)",
            )
            await asyncio.sleep(_FAILED_MOVE_PAUSE)
            if self.settler.settle(message, "nack", requeue=True):
                self.stats.requeued += 1
            return
        message.settled = True
        if _obs.active is not None:
            _obs.active.moved(self.owner, message, outcome, decision)
        if outcome == "park":
            self.stats.parked += 1
        elif outcome == "retry":
            self.stats.retried += 1
        else:
            self.stats.dropped += 1
            self.stats.dropped_records += size
        self.failures.failure(tag, exc, _describe(outcome, decision), _KINDS[outcome])


def _call_later(delay: float, callback: Callable[[], None]) -> object:
    return asyncio.get_running_loop().call_later(delay, callback)


_NOT_SETTLED = "not settled: its channel is closed (the broker delivers it again)"
_KINDS = {"retry": "retried", "park": "parked", "drop": "dropped"}


def _describe(outcome: str, decision: RetryDecision | None) -> str:
    """What a retry policy did with a failed message, in words."""
    if decision is None or decision.kind != outcome:
        return {"retry": "retried", "park": "parked", "drop": "dropped"}.get(outcome, outcome)
    if outcome == "retry":
        return (
            f"sent for a retry in {decision.delay:g} s via {decision.routing_key} "
            f"(attempt {decision.attempts} failed)"
        )
    if outcome == "park":
        return f"parked in {decision.routing_key} after {decision.attempts} attempt(s)"
    return f"dropped after {decision.attempts} attempt(s): the policy has no parking lot"


async def check_failure_path(
    connection: AsyncConnection, queue: str, policy: RetryPolicy | None, timeout: float | None
) -> object:
    """Passive-check that failed messages of ``queue`` have somewhere to go.

    The exchange and queues ``policy`` needs, or (without a policy) the queue's
    dead-letter exchange when the connection's topology record says it has one.

    Args:
        connection: the consumer's connection (its topology record tells about
            ``queue``).
        queue: the queue consumed from.
        policy: the consumer's retry policy, if any.
        timeout: seconds for each passive declare (``None``: no limit).

    Returns:
        The queue's dead-letter exchange as far as it can tell (for
        :attr:`FailurePath.dead_letter`): a name, ``None`` or :data:`UNKNOWN`.

    Raises:
        ConfigurationError: something is missing (the message names what).
    """
    from ..topology._session import missing_entities

    record = getattr(connection, "topology_record", None)
    recorded = record.queue(queue) if record is not None else None
    if policy is None:
        if recorded is None:
            return UNKNOWN
        dlx = recorded.arguments.get("x-dead-letter-exchange")
        dead_letter = dlx if isinstance(dlx, str) else None
        if isinstance(dlx, str) and dlx:
            missing = await missing_entities(connection, [("exchange", dlx)], timeout)
            if missing:
                raise ConfigurationError(
                    f"consumer of queue {queue!r}: its dead-letter exchange {dlx!r} "
                    "does not exist, so every failed message would be dropped by the "
                    "broker; declare the exchange first"
                )
        return dead_letter
    names = policy.names(queue)
    wanted: list[tuple[Literal["exchange", "queue"], str]] = [("exchange", names.dlx)]
    wanted += [("queue", name) for name in names.retry_queues]
    if names.parking_lot is not None:
        wanted.append(("queue", names.parking_lot))
    problems = [f"{kind} {name!r}" for kind, name in await missing_entities(
        connection, wanted, timeout
    )]  # fmt: skip
    if policy.broker_driven and recorded is not None:
        # One delay: the broker moves failed messages, through the work queue's own
        # dead-letter arguments. A passive declare cannot read them; the record can.
        arguments = recorded.arguments
        expected = (names.dlx, names.retry_queues[0])
        actual = (
            arguments.get("x-dead-letter-exchange"),
            arguments.get("x-dead-letter-routing-key"),
        )
        if actual != expected:
            problems.append(
                f"queue {queue!r} dead-lettering to {expected[0]!r} with routing key "
                f"{expected[1]!r} (it was declared with {actual[0]!r} / {actual[1]!r})"
            )
    if problems:
        raise ConfigurationError(
            f"consumer of queue {queue!r}: retry={policy!r} needs "
            f"{', '.join(problems)}, which the broker does not have; failed messages "
            f"would be lost. Declare it with Topology.with_retry({queue!r}, "
            "policy).apply(connection) before starting the consumer"
        )
    return UNKNOWN

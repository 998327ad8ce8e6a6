"""Automatic recovery of one :class:`~rabbitry.AsyncConnection`: reconnect, then replay.

The connection starts a :class:`Recovery` when it dies for a reason worth retrying
(:func:`rabbitry.recovery.is_recoverable`) and hands it a port to drive it through
(:class:`~rabbitry.aio._recovery_port.RecoveryPort`, which implements :class:`Port`);
each channel is driven through its
:class:`~rabbitry.aio._lifecycle.ChannelEvents`. :meth:`Recovery.run` then

1. reconnects across the configured addresses with the policy's backoff, giving up at
   once on an error that no retry can heal (:func:`rabbitry.recovery.is_permanent`) or
   after ``max_attempts``;
2. re-opens every live channel with its number, QoS, confirm and tx modes;
3. re-declares the topology record (what ``Topology.apply`` and the channel methods
   declared): exchanges, queues (a server-named queue gets a new name, and the bindings
   and consumers follow it), bindings;
4. subscribes every live consumer again, with its tag and callback;
5. sends again the unconfirmed publishes kept for it.

Nothing that could not be restored passes silently: each entity, consumer or channel
that failed is logged at ERROR with the cause and reported to the connection's
``on_recovery_error`` callbacks; a lost consumer ends through its cancel path (the
``on_cancel`` callback, or :class:`rabbitry.ConsumerCancelled` from an iterator); a
lost channel is closed with the cause, which later calls on it name.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import (
    AMQPError,
    ChannelClosedByBroker,
    ConnectionLost,
    NotFound,
    ResourceLocked,
)
from ..recovery import RecoveryPolicy, is_permanent
from ._declare import bind_described, declare_described_exchange, declare_described_queue

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..config import ConnectionParameters
    from ..protocol import spec
    from ..protocol.channel import ChannelProtocol
    from ..record import RecordedBinding, RecordedQueue, TopologyRecord
    from ._lifecycle import ChannelEvents
    from .channel import AsyncChannel

__all__ = ["Port", "Recovery", "redeclare_queue"]

logger = logging.getLogger("rabbitry.connection")


class Port(Protocol):
    """What recovery uses of its connection (the connection hands it a
    :class:`~rabbitry.aio._recovery_port.RecoveryPort`).

    The connection creates its recovery and imports this module; recovery knows it only
    through these members.
    """

    @property
    def closing(self) -> bool: ...

    @property
    def params(self) -> ConnectionParameters: ...

    @property
    def is_open(self) -> bool: ...

    @property
    def close_exc(self) -> AMQPError | None: ...

    @property
    def topology_record(self) -> TopologyRecord: ...

    def candidates(self) -> list[ConnectionParameters]: ...

    async def connect(self, params: ConnectionParameters) -> None: ...

    def end_attempt(self, reason: AMQPError | None = None) -> None: ...

    def channels(self) -> list[ChannelEvents[AsyncChannel]]: ...

    def reopen(self, channel_id: int) -> ChannelProtocol: ...

    async def open_channel(self, timeout: float) -> AsyncChannel: ...

    def report(self, kind: str, name: str, exc: AMQPError) -> None: ...

    def renamed(self, old: str, new: str) -> None: ...

    def recovered(self) -> None: ...

    def give_up(self, exc: AMQPError) -> None: ...


#: Seconds each re-declaration, re-subscription and re-opened channel may take.
_STEP_TIMEOUT = 30.0


class _Aborted(Exception):
    """An entity failed to re-declare and the policy says abort."""

    def __init__(self, cause: AMQPError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Recovery:
    """The reconnect loop and the replay of one connection (one instance per outage)."""

    def __init__(self, port: Port, policy: RecoveryPolicy) -> None:
        self._port = port
        self._policy = policy
        #: What could not be restored in the last replay: ``(kind, name, cause)``.
        self.losses: list[tuple[str, str, AMQPError]] = []

    async def run(self, last: BaseException | None) -> None:
        """Reconnect and replay until it works, the policy gives up, or close() runs.

        A bug in the replay must not leave the connection RECOVERING forever with
        nobody working on it: any unexpected exception ends the connection, logged.
        """
        try:
            await self._run(last)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("recovery of the connection to %s failed", self._port.params.address)
            cause = ConnectionLost(f"recovery failed: {exc!r}")
            cause.__cause__ = exc
            self._port.end_attempt()
            self._port.give_up(cause)

    async def _run(self, last: BaseException | None) -> None:
        port = self._port
        policy = self._policy
        attempt = 0
        while not port.closing:
            await asyncio.sleep(policy.delay(attempt))
            attempt += 1
            candidates = port.candidates()
            if policy.shuffle_hosts:
                random.shuffle(candidates)
            # The address that just failed goes last: it is the least likely to answer
            # (a killed node refuses at once, but a frozen one holds a connect until its
            # connection_timeout), so a cluster client fails over to a live node first.
            lost = next((i for i, p in enumerate(candidates) if p is port.params), None)
            if lost is not None and len(candidates) > 1:
                candidates.append(candidates.pop(lost))
            connected = False
            for params in candidates:
                try:
                    await port.connect(params)
                except (AMQPError, OSError, TimeoutError) as exc:
                    if isinstance(exc, AMQPError) and is_permanent(exc):
                        logger.error(
                            "recovery: %s refused the connection for a reason no retry "
                            "can heal: %r",
                            params.address,
                            exc,
                        )
                        port.give_up(exc)
                        return
                    last = exc
                    logger.info(
                        "recovery attempt %d to %s failed: %r", attempt, params.address, exc
                    )
                    continue
                connected = True
                break
            if connected:
                self.losses = []
                try:
                    await self._replay()
                except _Aborted as abort:
                    port.give_up(abort.cause)
                    return
                except (AMQPError, OSError, TimeoutError) as exc:
                    last = exc
                    logger.info("recovery attempt %d failed during replay: %r", attempt, exc)
                    port.end_attempt(ConnectionLost("recovery replay failed"))
                    continue
                if not port.is_open:
                    # The new connection dropped at the end of the replay, where no step
                    # was waiting to fail (e.g. while a scratch channel closed): its
                    # channels are suspended again, so this attempt did not recover.
                    last = port.close_exc
                    logger.info(
                        "recovery attempt %d: the connection dropped as the replay ended: %r",
                        attempt,
                        last,
                    )
                    port.end_attempt()
                    continue
                if self.losses:
                    logger.info(
                        "connection to %s recovered; %d item(s) could not be restored "
                        "(reported above)",
                        port.params.address,
                        len(self.losses),
                    )
                else:
                    logger.info("connection to %s recovered", port.params.address)
                port.recovered()
                return
            if policy.max_attempts is not None and attempt >= policy.max_attempts:
                cause = last if isinstance(last, AMQPError) else ConnectionLost(str(last))
                port.give_up(cause)
                return

    # ------------------------------------------------------------------ reporting

    def _report(self, kind: str, name: str, exc: AMQPError) -> None:
        """Something could not be restored: ERROR log and the recovery-error event."""
        self.losses.append((kind, name, exc))
        logger.error("recovery: could not restore %s %r: %r", kind, name, exc)
        self._port.report(kind, name, exc)

    # ------------------------------------------------------------------ replay

    async def _replay(self) -> None:
        """Re-open channels (numbers, QoS, modes), then the topology, then consumers."""
        port = self._port
        live = port.channels()
        for hooks in live:
            if not hooks.channel.is_closed:
                await hooks.resume(port.reopen(hooks.channel.channel_id))
        renamed = await self._replay_topology()
        for hooks in live:
            if not hooks.channel.is_closed:
                await self._resubscribe(hooks, renamed)
        for hooks in live:  # last: their queues and consumers exist again
            if not hooks.channel.is_closed:
                hooks.republish()

    async def _resubscribe(
        self, hooks: ChannelEvents[AsyncChannel], renamed: dict[str, str]
    ) -> None:
        """Subscribe a channel's consumers again; report each that cannot be.

        A consumer's queue is checked first on a scratch channel (a missing queue would
        close the application's channel, taking its other consumers with it); if the
        broker still refuses the consume, that channel is closed with the cause and each
        of its consumers is reported and ended.
        """
        specs = hooks.consumer_specs()
        if not specs:
            return
        scratch: AsyncChannel | None = None
        try:
            for method in specs:
                tag = method.consumer_tag
                queue = renamed.get(method.queue, method.queue)
                if scratch is None or scratch.is_closed:
                    scratch = await self._port.open_channel(_STEP_TIMEOUT)
                try:
                    await scratch.queue_declare(queue, passive=True, timeout=_STEP_TIMEOUT)
                except ChannelClosedByBroker as exc:
                    self._report("consumer", f"{tag} on queue {queue}", exc)
                    hooks.lose_consumer(tag, exc)
                    continue
                try:
                    await hooks.resubscribe_one(method, renamed)
                except ChannelClosedByBroker as exc:
                    self._report("consumer", f"{tag} on queue {queue}", exc)
                    hooks.lose_consumer(tag, exc)
                    for other in hooks.consumer_specs():
                        self._report("consumer", other.consumer_tag, exc)
                        hooks.lose_consumer(other.consumer_tag, exc)
                    self._report("channel", str(hooks.channel.channel_id), exc)
                    hooks.mark_lost(exc)
                    return
        finally:
            if scratch is not None and scratch.is_open:
                await scratch.close(timeout=10.0)

    async def _replay_topology(self) -> dict[str, str]:
        port = self._port
        record = port.topology_record
        renamed: dict[str, str] = {}
        if not len(record):
            return renamed
        channel = await port.open_channel(_STEP_TIMEOUT)
        try:
            for exchange in record.exchanges:
                if not exchange.name or exchange.name.startswith("amq."):
                    continue
                channel = await self._declare_entity(
                    channel,
                    "exchange",
                    exchange.name,
                    lambda ch, e=exchange: declare_described_exchange(ch, e, timeout=_STEP_TIMEOUT),  # type: ignore[misc]
                )
            for queue in record.queues:
                replies: list[spec.QueueDeclareOk] = []

                async def declare(
                    ch: AsyncChannel,
                    q: RecordedQueue = queue,
                    replies: list[spec.QueueDeclareOk] = replies,
                ) -> None:
                    replies.append(await declare_described_queue(ch, q, timeout=_STEP_TIMEOUT))

                channel = await self._declare_entity(channel, "queue", queue.name, declare)
                if replies and replies[0].queue != queue.name:
                    old, new = queue.name, replies[0].queue
                    record.rename_queue(old, new)
                    renamed[old] = new
                    port.renamed(old, new)
            for binding in record.bindings:
                label = f"{binding.source}->{binding.destination}:{binding.routing_key}"
                channel = await self._declare_entity(
                    channel,
                    "binding",
                    label,
                    lambda ch, b=binding: bind_described(ch, b, timeout=_STEP_TIMEOUT),  # type: ignore[misc]
                    restore=lambda ch, b=binding: self._redeclare_ends(ch, b),  # type: ignore[misc]
                )
        finally:
            if channel.is_open:
                await channel.close(timeout=10.0)
        return renamed

    async def _declare_entity(
        self,
        channel: AsyncChannel,
        kind: str,
        name: str,
        declare: Callable[[AsyncChannel], Awaitable[Any]],
        restore: Callable[[AsyncChannel], Awaitable[Any]] | None = None,
    ) -> AsyncChannel:
        """Run one re-declaration; report and skip (or abort) if the broker refuses it.

        ``restore`` handles a 404 (an end of a binding deleted while recovery runs, e.g.
        by another client): it declares the recorded ends again before the next try.
        """
        port = self._port
        for attempt in range(5):
            try:
                await declare(channel)
                return channel
            except ChannelClosedByBroker as exc:
                channel = await port.open_channel(_STEP_TIMEOUT)
                if isinstance(exc, ResourceLocked) and attempt < 4:
                    # The dead connection's exclusive queue may not be gone yet.
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                if isinstance(exc, NotFound) and restore is not None and attempt < 4:
                    logger.info("recovery: %s %r: %r; declaring its ends again", kind, name, exc)
                    await asyncio.sleep(0.05 * 2**attempt)
                    try:
                        await restore(channel)
                    except ChannelClosedByBroker as again:
                        logger.info("recovery: restoring %r failed: %r", name, again)
                        channel = await port.open_channel(_STEP_TIMEOUT)
                    continue
                self._report(kind, name, exc)
                if self._policy.on_entity_error == "abort":
                    raise _Aborted(exc) from exc
                return channel
        return channel

    async def _redeclare_ends(self, channel: AsyncChannel, binding: RecordedBinding) -> None:
        """Declare a binding's recorded source exchange and destination again."""
        record = self._port.topology_record
        ends = [(binding.source, "exchange"), (binding.destination, binding.destination_type)]
        for name, kind in ends:
            if kind == "exchange":
                exchange = record.exchange(name)
                if exchange is not None and name and not name.startswith("amq."):
                    await declare_described_exchange(channel, exchange, timeout=_STEP_TIMEOUT)
            else:
                queue = record.queue(name)
                if queue is not None and not queue.server_named:
                    await declare_described_queue(channel, queue, timeout=_STEP_TIMEOUT)


async def redeclare_queue(
    record: TopologyRecord, channel: AsyncChannel, name: str, *, timeout: float | None = None
) -> str | None:
    """Declare a recorded queue again, then its recorded bindings to it.

    Used when a queue disappeared under a consumer (deleted, or expired by
    ``x-expires``). A server-named queue gets a new name, which the record follows.

    Args:
        record: the connection's topology record.
        channel: an open channel; a broker error closes it (the error propagates).
        name: the queue's recorded name.
        timeout: seconds per declaration.

    Returns:
        The queue's name now, or ``None`` if no queue called ``name`` is recorded.
    """
    queue = record.queue(name)
    if queue is None:
        return None
    reply = await declare_described_queue(channel, queue, timeout=timeout)
    current: str = reply.queue
    record.rename_queue(name, current)
    for binding in record.bindings_of(current):
        if binding.destination_type == "queue" and binding.destination == current:
            await bind_described(channel, binding, timeout=timeout)
    return current

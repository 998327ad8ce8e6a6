"""Automatic recovery of one :class:`~rabbitry.AsyncConnection`: reconnect, then replay.

The connection hands a :class:`Recovery` its lost state when it dies for a reason worth
retrying (:func:`rabbitry.recovery.is_recoverable`). :meth:`Recovery.run` then

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
from ..protocol.connection import ConnectionState
from ..recovery import RecoveryPolicy, is_permanent

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..config import ConnectionParameters
    from ..protocol import spec
    from ..protocol.connection import ConnectionProtocol
    from ..protocol.events import Event
    from ..record import RecordedBinding, RecordedExchange, RecordedQueue, TopologyRecord
    from .channel import AsyncChannel

__all__ = ["Recovery", "declare_binding", "declare_exchange", "declare_queue", "redeclare_queue"]

logger = logging.getLogger("rabbitry.connection")


class _Connection(Protocol):
    """What recovery uses of its :class:`~rabbitry.aio.connection.AsyncConnection`.

    The connection creates its recovery and imports this module; recovery knows it only
    through these members.
    """

    params: ConnectionParameters
    _candidates: list[ConnectionParameters]
    _channels: dict[int, AsyncChannel]
    _closing: bool
    close_exc: AMQPError | None
    topology_record: TopologyRecord

    async def _connect_one(self, params: ConnectionParameters) -> None: ...

    async def _open_channel(
        self,
        channel_id: int | None,
        timeout: float | None,
        *,
        record: bool = True,
        internal: bool = False,
    ) -> AsyncChannel: ...

    def _reset_attempt(self) -> None: ...

    def _handle_events(self, events: list[Event]) -> None: ...

    def _give_up(self, exc: AMQPError) -> None: ...

    def _recovery_done(self) -> None: ...

    def _notify_recovery_error(self, kind: str, name: str, exc: AMQPError) -> None: ...

    def _notify_renamed(self, old: str, new: str) -> None: ...


#: Seconds each re-declaration, re-subscription and re-opened channel may take.
_STEP_TIMEOUT = 30.0


class _Aborted(Exception):
    """An entity failed to re-declare and the policy says abort."""

    def __init__(self, cause: AMQPError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Recovery:
    """The reconnect loop and the replay of one connection (one instance per outage)."""

    def __init__(
        self,
        connection: _Connection,
        policy: RecoveryPolicy,
        protocol: Callable[[], ConnectionProtocol | None],
    ) -> None:
        self._conn = connection
        self._policy = policy
        # The connection's protocol object of the current attempt (None between them).
        self._protocol = protocol
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
            logger.exception("recovery of the connection to %s failed", self._conn.params.address)
            cause = ConnectionLost(f"recovery failed: {exc!r}")
            cause.__cause__ = exc
            self._conn._reset_attempt()
            self._conn._give_up(cause)

    async def _run(self, last: BaseException | None) -> None:
        conn = self._conn
        policy = self._policy
        attempt = 0
        while not conn._closing:
            await asyncio.sleep(policy.delay(attempt))
            attempt += 1
            candidates = list(conn._candidates)
            if policy.shuffle_hosts:
                random.shuffle(candidates)
            # The address that just failed goes last: it is the least likely to answer
            # (a killed node refuses at once, but a frozen one holds a connect until its
            # connection_timeout), so a cluster client fails over to a live node first.
            lost = next((i for i, p in enumerate(candidates) if p is conn.params), None)
            if lost is not None and len(candidates) > 1:
                candidates.append(candidates.pop(lost))
            connected = False
            for params in candidates:
                try:
                    await conn._connect_one(params)
                except (AMQPError, OSError, TimeoutError) as exc:
                    conn._reset_attempt()
                    if isinstance(exc, AMQPError) and is_permanent(exc):
                        logger.error(
                            "recovery: %s refused the connection for a reason no retry "
                            "can heal: %r",
                            params.address,
                            exc,
                        )
                        conn._give_up(exc)
                        return
                    last = exc
                    logger.info(
                        "recovery attempt %d to %s failed: %r", attempt, params.address, exc
                    )
                    continue
                conn.params = params
                connected = True
                break
            if connected:
                self.losses = []
                proto = self._protocol()
                try:
                    await self._replay()
                except _Aborted as abort:
                    conn._give_up(abort.cause)
                    return
                except (AMQPError, OSError, TimeoutError) as exc:
                    last = exc
                    logger.info("recovery attempt %d failed during replay: %r", attempt, exc)
                    proto = self._protocol()
                    if proto is not None and proto.state is ConnectionState.OPEN:
                        proto.abort(ConnectionLost("recovery replay failed"))
                        conn._handle_events(proto.events_received())
                    conn._reset_attempt()
                    continue
                if self._protocol() is not proto or proto is None or not proto.is_open:
                    # The new connection dropped at the end of the replay, where no step
                    # was waiting to fail (e.g. while a scratch channel closed): its
                    # channels are suspended again, so this attempt did not recover.
                    last = conn.close_exc
                    logger.info(
                        "recovery attempt %d: the connection dropped as the replay ended: %r",
                        attempt,
                        last,
                    )
                    conn._reset_attempt()
                    continue
                if self.losses:
                    logger.info(
                        "connection to %s recovered; %d item(s) could not be restored "
                        "(reported above)",
                        conn.params.address,
                        len(self.losses),
                    )
                else:
                    logger.info("connection to %s recovered", conn.params.address)
                conn._recovery_done()
                return
            if policy.max_attempts is not None and attempt >= policy.max_attempts:
                cause = last if isinstance(last, AMQPError) else ConnectionLost(str(last))
                conn._give_up(cause)
                return

    # ------------------------------------------------------------------ reporting

    def _report(self, kind: str, name: str, exc: AMQPError) -> None:
        """Something could not be restored: ERROR log and the recovery-error event."""
        self.losses.append((kind, name, exc))
        logger.error("recovery: could not restore %s %r: %r", kind, name, exc)
        self._conn._notify_recovery_error(kind, name, exc)

    # ------------------------------------------------------------------ replay

    async def _replay(self) -> None:
        """Re-open channels (numbers, QoS, modes), then the topology, then consumers."""
        conn = self._conn
        proto = self._protocol()
        assert proto is not None
        live = [conn._channels[i] for i in sorted(conn._channels)]
        for channel in live:
            if not channel.is_closed:
                await channel._resume(proto.open_channel(channel.channel_id))
        renamed = await self._replay_topology()
        for channel in live:
            if not channel.is_closed:
                await self._resubscribe(channel, renamed)
        for channel in live:  # last: their queues and consumers exist again
            if not channel.is_closed:
                channel._republish()

    async def _resubscribe(self, channel: AsyncChannel, renamed: dict[str, str]) -> None:
        """Subscribe a channel's consumers again; report each that cannot be.

        A consumer's queue is checked first on a scratch channel (a missing queue would
        close the application's channel, taking its other consumers with it); if the
        broker still refuses the consume, that channel is closed with the cause and each
        of its consumers is reported and ended.
        """
        specs = channel._consumer_specs()
        if not specs:
            return
        scratch: AsyncChannel | None = None
        try:
            for method in specs:
                tag = method.consumer_tag
                queue = renamed.get(method.queue, method.queue)
                if scratch is None or scratch.is_closed:
                    scratch = await self._conn._open_channel(
                        None, _STEP_TIMEOUT, record=False, internal=True
                    )
                try:
                    await scratch.queue_declare(queue, passive=True, timeout=_STEP_TIMEOUT)
                except ChannelClosedByBroker as exc:
                    self._report("consumer", f"{tag} on queue {queue}", exc)
                    channel._lose_consumer(tag, exc)
                    continue
                try:
                    await channel._resubscribe_one(method, renamed)
                except ChannelClosedByBroker as exc:
                    self._report("consumer", f"{tag} on queue {queue}", exc)
                    channel._lose_consumer(tag, exc)
                    for other in channel._consumer_specs():
                        self._report("consumer", other.consumer_tag, exc)
                        channel._lose_consumer(other.consumer_tag, exc)
                    self._report("channel", str(channel.channel_id), exc)
                    channel._mark_lost(exc)
                    return
        finally:
            if scratch is not None and scratch.is_open:
                await scratch.close(timeout=10.0)

    async def _replay_topology(self) -> dict[str, str]:
        conn = self._conn
        record = conn.topology_record
        renamed: dict[str, str] = {}
        if not len(record):
            return renamed
        channel = await conn._open_channel(None, _STEP_TIMEOUT, record=False, internal=True)
        try:
            for exchange in record.exchanges:
                if not exchange.name or exchange.name.startswith("amq."):
                    continue
                channel = await self._declare_entity(
                    channel,
                    "exchange",
                    exchange.name,
                    lambda ch, e=exchange: declare_exchange(ch, e),  # type: ignore[misc]
                )
            for queue in record.queues:
                replies: list[spec.QueueDeclareOk] = []

                async def declare(
                    ch: AsyncChannel,
                    q: RecordedQueue = queue,
                    replies: list[spec.QueueDeclareOk] = replies,
                ) -> None:
                    replies.append(await declare_queue(ch, q))

                channel = await self._declare_entity(channel, "queue", queue.name, declare)
                if replies and replies[0].queue != queue.name:
                    old, new = queue.name, replies[0].queue
                    record.rename_queue(old, new)
                    renamed[old] = new
                    conn._notify_renamed(old, new)
            for binding in record.bindings:
                label = f"{binding.source}->{binding.destination}:{binding.routing_key}"
                channel = await self._declare_entity(
                    channel,
                    "binding",
                    label,
                    lambda ch, b=binding: declare_binding(ch, b),  # type: ignore[misc]
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
        conn = self._conn
        for attempt in range(5):
            try:
                await declare(channel)
                return channel
            except ChannelClosedByBroker as exc:
                channel = await conn._open_channel(None, _STEP_TIMEOUT, record=False, internal=True)
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
                        channel = await conn._open_channel(
                            None, _STEP_TIMEOUT, record=False, internal=True
                        )
                    continue
                self._report(kind, name, exc)
                if self._policy.on_entity_error == "abort":
                    raise _Aborted(exc) from exc
                return channel
        return channel

    async def _redeclare_ends(self, channel: AsyncChannel, binding: RecordedBinding) -> None:
        """Declare a binding's recorded source exchange and destination again."""
        record = self._conn.topology_record
        ends = [(binding.source, "exchange"), (binding.destination, binding.destination_type)]
        for name, kind in ends:
            if kind == "exchange":
                exchange = record.exchange(name)
                if exchange is not None and name and not name.startswith("amq."):
                    await declare_exchange(channel, exchange)
            else:
                queue = record.queue(name)
                if queue is not None and not queue.server_named:
                    await declare_queue(channel, queue)


async def declare_exchange(channel: AsyncChannel, exchange: RecordedExchange) -> None:
    """Declare a recorded exchange again."""
    await channel.exchange_declare(
        exchange.name,
        exchange.type,
        durable=exchange.durable,
        auto_delete=exchange.auto_delete,
        internal=exchange.internal,
        arguments=dict(exchange.arguments) or None,
        timeout=_STEP_TIMEOUT,
    )


async def declare_queue(
    channel: AsyncChannel, queue: RecordedQueue, *, timeout: float | None = _STEP_TIMEOUT
) -> spec.QueueDeclareOk:
    """Declare a recorded queue again; a server-named one asks for a new name."""
    return await channel.queue_declare(
        "" if queue.server_named else queue.name,
        durable=queue.durable,
        exclusive=queue.exclusive,
        auto_delete=queue.auto_delete,
        arguments=dict(queue.arguments) or None,
        timeout=timeout,
    )


async def declare_binding(
    channel: AsyncChannel, binding: RecordedBinding, *, timeout: float | None = _STEP_TIMEOUT
) -> None:
    """Bind a recorded binding again (queue or exchange destination)."""
    bind = channel.exchange_bind if binding.destination_type == "exchange" else channel.queue_bind
    await bind(
        binding.destination,
        binding.source,
        binding.routing_key,
        arguments=dict(binding.arguments) or None,
        timeout=timeout,
    )


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
    reply = await declare_queue(channel, queue, timeout=timeout)
    current: str = reply.queue
    record.rename_queue(name, current)
    for binding in record.bindings_of(current):
        if binding.destination_type == "queue" and binding.destination == current:
            await declare_binding(channel, binding, timeout=timeout)
    return current

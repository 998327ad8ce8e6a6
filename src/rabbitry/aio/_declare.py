"""AsyncChannel's exchange and queue methods: declare, bind, unbind, purge, delete.

:class:`DeclareMethods` is a base of :class:`~rabbitry.aio.channel.AsyncChannel` with
its own state (the channel's requests, the record). Each method sends its request and
waits for the broker's reply; when the channel records
(the recovery policy's ``record_channel_topology``), what it declared, bound or deleted
then goes into the connection's topology record, which recovery declares again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..protocol import spec
from ..record import RecordedBinding, RecordedExchange, RecordedQueue

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..record import TopologyRecord
    from ._requests import Requests

__all__ = [
    "DeclareMethods",
    "bind_described",
    "declare_described_exchange",
    "declare_described_queue",
]


class DeclareMethods:
    """The exchange and queue methods of :class:`~rabbitry.aio.channel.AsyncChannel`:
    each sends one request and records what it changed.

    Args:
        requests: the channel's requests.
        record: where what the channel declares, binds and deletes goes (``None``:
            not recorded).
    """

    def __init__(self, requests: Requests, record: TopologyRecord | None) -> None:
        self._requests = requests
        self._record = record

    # -- exchange

    async def exchange_declare(
        self,
        exchange: str,
        type: str = "direct",
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.ExchangeDeclareOk:
        """Declare an exchange (``passive``: only check that it exists).

        Args:
            exchange: the exchange name.
            type: ``direct``, ``fanout``, ``topic``, ``headers`` or a plugin's type.
            passive: only check that the exchange exists.
            durable: it survives a broker restart.
            auto_delete: deleted when its last binding is removed.
            internal: clients cannot publish to it (only exchange-to-exchange bindings).
            arguments: e.g. ``{"alternate-exchange": "unrouted"}``.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's declare-ok.

        Raises:
            NotFound: ``passive``, and there is no such exchange (the channel closes).
            PreconditionFailed: it exists with other settings (the channel closes).
            AccessRefused: no permission, or a name starting with ``amq.`` (the channel
                closes).
        """
        method = spec.ExchangeDeclare(
            exchange=exchange,
            type=type,
            passive=passive,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
        result: spec.ExchangeDeclareOk = await self._requests.call(method, timeout)
        if self._record is not None and not passive:
            self._record.add_exchange(
                RecordedExchange(
                    exchange, type, durable, auto_delete, internal, dict(arguments or {})
                )
            )
        return result

    async def exchange_delete(
        self, exchange: str, *, if_unused: bool = False, timeout: float | None = None
    ) -> spec.ExchangeDeleteOk:
        """Delete an exchange.

        Args:
            exchange: the exchange name.
            if_unused: only if it has no bindings.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's delete-ok.

        Raises:
            PreconditionFailed: ``if_unused``, and it has bindings (the channel closes).
        """
        method = spec.ExchangeDelete(exchange=exchange, if_unused=if_unused)
        result: spec.ExchangeDeleteOk = await self._requests.call(method, timeout)
        if self._record is not None:
            self._record.forget_exchange(exchange)
        return result

    async def exchange_bind(
        self,
        destination: str,
        source: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.ExchangeBindOk:
        """Bind exchange ``destination`` to exchange ``source`` (RabbitMQ extension).

        Args:
            destination: the exchange that receives the messages.
            source: the exchange they are published to.
            routing_key: the binding key.
            arguments: binding arguments (for a headers exchange, the headers to match).
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's bind-ok.

        Raises:
            NotFound: one of the exchanges does not exist (the channel closes).
        """
        method = spec.ExchangeBind(
            destination=destination, source=source, routing_key=routing_key, arguments=arguments
        )
        result: spec.ExchangeBindOk = await self._requests.call(method, timeout)
        if self._record is not None:
            self._record.add_binding(
                RecordedBinding(source, destination, routing_key, dict(arguments or {}), "exchange")
            )
        return result

    async def exchange_unbind(
        self,
        destination: str,
        source: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.ExchangeUnbindOk:
        """Remove an exchange-to-exchange binding.

        Args:
            destination: the exchange that received the messages.
            source: the exchange they were published to.
            routing_key: the binding key.
            arguments: the binding's arguments.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's unbind-ok.
        """
        method = spec.ExchangeUnbind(
            destination=destination, source=source, routing_key=routing_key, arguments=arguments
        )
        result: spec.ExchangeUnbindOk = await self._requests.call(method, timeout)
        if self._record is not None:
            self._record.forget_binding(
                RecordedBinding(source, destination, routing_key, dict(arguments or {}), "exchange")
            )
        return result

    # -- queue

    async def queue_declare(
        self,
        queue: str = "",
        *,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.QueueDeclareOk:
        """Declare a queue; ``queue=""`` asks the broker for a name.

        Args:
            queue: the queue name (``""``: a server-named queue).
            passive: only check that the queue exists.
            durable: it survives a broker restart.
            exclusive: used by this connection only, deleted when it closes.
            auto_delete: deleted when its last consumer is cancelled.
            arguments: e.g. ``{"x-queue-type": "quorum"}``.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The reply, with ``queue``, ``message_count`` and ``consumer_count``.

        Raises:
            NotFound: ``passive``, and there is no such queue (the channel closes).
            PreconditionFailed: it exists with other settings (the channel closes).
            ResourceLocked: it is exclusive to another connection (the channel closes).
        """
        method = spec.QueueDeclare(
            queue=queue,
            passive=passive,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        result: spec.QueueDeclareOk = await self._requests.call(method, timeout)
        if self._record is not None and not passive:
            self._record.add_queue(
                RecordedQueue(
                    result.queue,
                    durable,
                    exclusive,
                    auto_delete,
                    dict(arguments or {}),
                    server_named=not queue,
                )
            )
        return result

    async def queue_bind(
        self,
        queue: str,
        exchange: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.QueueBindOk:
        """Bind a queue to an exchange.

        Args:
            queue: the queue.
            exchange: the exchange.
            routing_key: the binding key.
            arguments: binding arguments (for a headers exchange, the headers to match).
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's bind-ok.

        Raises:
            NotFound: the queue or the exchange does not exist (the channel closes).
        """
        method = spec.QueueBind(
            queue=queue, exchange=exchange, routing_key=routing_key, arguments=arguments
        )
        result: spec.QueueBindOk = await self._requests.call(method, timeout)
        if self._record is not None:
            self._record.add_binding(
                RecordedBinding(exchange, queue, routing_key, dict(arguments or {}))
            )
        return result

    async def queue_unbind(
        self,
        queue: str,
        exchange: str,
        routing_key: str = "",
        *,
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> spec.QueueUnbindOk:
        """Remove a queue binding.

        Args:
            queue: the queue.
            exchange: the exchange.
            routing_key: the binding key.
            arguments: the binding's arguments.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The broker's unbind-ok.
        """
        method = spec.QueueUnbind(
            queue=queue, exchange=exchange, routing_key=routing_key, arguments=arguments
        )
        result: spec.QueueUnbindOk = await self._requests.call(method, timeout)
        if self._record is not None:
            self._record.forget_binding(
                RecordedBinding(exchange, queue, routing_key, dict(arguments or {}))
            )
        return result

    async def queue_purge(self, queue: str, *, timeout: float | None = None) -> spec.QueuePurgeOk:
        """Remove all ready messages from a queue.

        Args:
            queue: the queue.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The reply, with the ``message_count`` removed.

        Raises:
            NotFound: there is no such queue (the channel closes).
        """
        result: spec.QueuePurgeOk = await self._requests.call(spec.QueuePurge(queue=queue), timeout)
        return result

    async def queue_delete(
        self,
        queue: str,
        *,
        if_unused: bool = False,
        if_empty: bool = False,
        timeout: float | None = None,
    ) -> spec.QueueDeleteOk:
        """Delete a queue.

        Args:
            queue: the queue.
            if_unused: only if it has no consumers.
            if_empty: only if it has no messages.
            timeout: seconds to wait for the broker's reply (``None``: no limit); then
                :class:`Timeout`.

        Returns:
            The reply, with the ``message_count`` it held.

        Raises:
            PreconditionFailed: ``if_unused`` and it has consumers, or ``if_empty`` and
                it has messages (the channel closes).
        """
        method = spec.QueueDelete(queue=queue, if_unused=if_unused, if_empty=if_empty)
        result: spec.QueueDeleteOk = await self._requests.call(method, timeout)
        if self._record is not None:
            self._record.forget_queue(queue)
        return result


# ------------------------------------------------------------ declare from a description
#
# One way to declare what a description says, for everything that declares from one:
# Topology.apply (from its model, through the description it records), recovery's
# replay of the topology record, and a consumer re-declaring its vanished queue.


async def declare_described_exchange(
    channel: DeclareMethods,
    exchange: RecordedExchange,
    *,
    passive: bool = False,
    timeout: float | None,
) -> spec.ExchangeDeclareOk:
    """Declare the exchange ``exchange`` describes.

    Args:
        channel: an open channel.
        exchange: the description (name, type, flags, arguments).
        passive: only check that it exists (an ``amq.*`` exchange).
        timeout: seconds to wait for the broker (``None``: no limit).

    Returns:
        The broker's exchange.declare-ok.

    Raises:
        PreconditionFailed: it exists with other properties (the channel closes).
    """
    result: spec.ExchangeDeclareOk = await channel.exchange_declare(
        exchange.name,
        exchange.type,
        passive=passive,
        durable=exchange.durable,
        auto_delete=exchange.auto_delete,
        internal=exchange.internal,
        arguments=dict(exchange.arguments) or None,
        timeout=timeout,
    )
    return result


async def declare_described_queue(
    channel: DeclareMethods,
    queue: RecordedQueue,
    *,
    passive: bool = False,
    timeout: float | None,
) -> spec.QueueDeclareOk:
    """Declare the queue ``queue`` describes; a server-named one asks for a new name.

    Args:
        channel: an open channel.
        queue: the description (name, flags, arguments, whether the server names it).
        passive: only check that it exists.
        timeout: seconds to wait for the broker (``None``: no limit).

    Returns:
        The broker's queue.declare-ok (the name in use, message and consumer counts).

    Raises:
        PreconditionFailed: it exists with other properties (the channel closes).
        ResourceLocked: it is another connection's exclusive queue (the channel closes).
    """
    result: spec.QueueDeclareOk = await channel.queue_declare(
        "" if queue.server_named else queue.name,
        passive=passive,
        durable=queue.durable,
        exclusive=queue.exclusive,
        auto_delete=queue.auto_delete,
        arguments=dict(queue.arguments) or None,
        timeout=timeout,
    )
    return result


async def bind_described(
    channel: DeclareMethods, binding: RecordedBinding, *, timeout: float | None
) -> None:
    """Bind what ``binding`` describes (a queue or an exchange destination).

    Args:
        channel: an open channel.
        binding: the description (source, destination and its type, key, arguments).
        timeout: seconds to wait for the broker (``None``: no limit).

    Raises:
        NotFound: the source or the destination does not exist (the channel closes).
    """
    bind = channel.exchange_bind if binding.destination_type == "exchange" else channel.queue_bind
    await bind(
        binding.destination,
        binding.source,
        binding.routing_key,
        arguments=dict(binding.arguments) or None,
        timeout=timeout,
    )

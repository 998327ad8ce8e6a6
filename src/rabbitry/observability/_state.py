"""The one switch the library's hot paths look at: ``active`` is ``None`` until
:func:`rabbitry.observability.instrument` installs the hooks.

This module imports nothing, so the publisher, the consumer and the connection can read
``_state.active`` on every message for the price of an attribute load and a ``None``
check, with or without OpenTelemetry installed.

The engine reads it too, so it sits below the objects it reports on and cannot import
them: :class:`Hooks` names them (the publisher, the consumer, the outbox publisher, the
connection, the retry decision) in its docstrings and types them ``Any``; the
implementation (``observability._otel``) types them exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from ..protocol.message import Message
    from ..protocol.spec import BasicProperties

# What the hooks are given, named for the reader (the modules that define them import
# this one): rabbitry.AsyncPublisher, rabbitry.AsyncConsumer, rabbitry.AsyncOutboxPublisher,
# the engine's AsyncConnection, rabbitry.topology.RetryDecision, rabbitry.AsyncChannelPool,
# and the messages of
# publish_batch (OutgoingMessage or a body).
_AsyncPublisher = Any
_AsyncConsumer = Any
_AsyncOutboxPublisher = Any
_AsyncConnection = Any
_RetryDecision = Any
_AsyncChannelPool = Any
_OutgoingMessageOrBody = Any


class Hooks(Protocol):
    """What the library calls while instrumented (see ``observability._otel``)."""

    def publish(
        self,
        publisher: _AsyncPublisher,
        exchange: str,
        routing_key: str,
        properties: BasicProperties | None,
    ) -> tuple[BasicProperties | None, Callable[[Any], None] | None]:
        """Start a publish span, inject its context; returns the properties to send
        and ``finish(future)`` to call with the future of the outcome, or ``None`` when
        nothing would be recorded."""
        ...

    def publish_batch(
        self,
        publisher: _AsyncPublisher,
        messages: Iterable[_OutgoingMessageOrBody],
        exchange: str,
        routing_key: str,
        properties: BasicProperties | None,
    ) -> tuple[Iterable[_OutgoingMessageOrBody], Callable[[Any], None] | None]:
        """As :meth:`publish` for each message of a batch; ``finish(future)`` takes the
        future of the list of outcomes (``None``: nothing would be recorded)."""
        ...

    def records_process(self) -> bool:
        """Whether :meth:`process` would record a span or a measurement now (with only
        the API's no-op providers it would not: the consumer then skips it)."""
        ...

    async def process(
        self,
        consumer: _AsyncConsumer,
        work: Message | list[Message],
        handling: Awaitable[None],
    ) -> None:
        """Await ``handling`` (``consumer``'s handling of ``work``, not started yet)
        inside a process span."""
        ...

    def handler_failed(
        self, consumer: _AsyncConsumer, message: Message, exc: BaseException
    ) -> None:
        """The handler raised ``exc`` for ``message`` (inside its process span)."""
        ...

    def moved(
        self,
        consumer: _AsyncConsumer,
        message: Message,
        outcome: str,
        decision: _RetryDecision | None,
    ) -> None:
        """The retry policy retried, parked or dropped ``message``."""
        ...

    def consumer_started(self, consumer: _AsyncConsumer, connection: _AsyncConnection) -> None:
        """``consumer`` subscribed on ``connection`` (loop thread)."""
        ...

    def outbox_started(self, publisher: _AsyncOutboxPublisher) -> None:
        """An outbox publisher started delivering (loop thread)."""
        ...

    def connection_created(self, connection: _AsyncConnection) -> None:
        """``connection`` was made (any thread)."""
        ...

    def pool_created(self, pool: _AsyncChannelPool) -> None:
        """A channel pool was made (its waiters and lent channels are reported)."""
        ...


#: The installed hooks, or ``None`` (not instrumented).
active: Hooks | None = None

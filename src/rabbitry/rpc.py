"""Request/reply over RabbitMQ's direct reply-to: :class:`AsyncRpcClient`, :class:`AsyncRpcServer`.

A client publishes a request with ``reply_to`` set to the pseudo-queue
``amq.rabbitmq.reply-to`` and a fresh ``correlation_id``; the server's handler answers
it, and the server publishes the answer to the request's ``reply_to`` with the same
``correlation_id``. The broker hands the reply straight to the client's channel: no
reply queue is declared, nothing is stored. The thread-safe twins are in
``rabbitry.sync.rpc`` (``Connection.rpc_client()`` / ``Connection.rpc_server()``).

What a call can raise:

* :class:`~rabbitry.exceptions.RpcTimeout` (also a ``rabbitry.Timeout``): no reply
  within the call's ``timeout``; it names the routing key and the timeout. A reply that
  arrives later is dropped and counted (``client.late_replies``); late replies are
  logged at ERROR, rate-limited with counts (a few in full per minute, then one
  summary line with the number dropped).
* :class:`~rabbitry.exceptions.RpcUnroutable`: no queue is bound for the routing key
  (requests are mandatory, so the broker returns them at once).
* :class:`~rabbitry.exceptions.RpcInterrupted`: the connection (or the client's
  channel) was lost while the call waited; ``reason`` says why. The server may or may not
  have handled the request. The client itself keeps working: once the connection has
  recovered, new calls go through.
* :class:`~rabbitry.exceptions.RpcRemoteError`: the server's handler raised; the reply
  carried the error's type and text instead of a body.

A request expires with its call: a call with a ``timeout`` sends its request with the
per-message TTL (``expiration``) set to the time the call has left when it is sent
(rounded up to the millisecond), so that a request whose caller gave up is dropped by
the broker instead of being run by a server that starts (or catches up) later. An
``expiration`` set on ``properties`` that is shorter is kept; a longer one is shortened
to the call's. Only a request still in the queue expires: one a server has already
received runs (its reply then arrives late). ``timeout=None`` sets no TTL.

How a server treats requests (the rule; its ERROR records are rate-limited with counts:
a few in full per minute, then one summary line, and one more when the server stops):

* The handler returns the reply body (``bytes``, or ``str`` sent as UTF-8); the server
  publishes it to ``reply_to`` with the request's ``correlation_id`` and then acks the
  request.
* The handler raises: the error is logged at ERROR with its traceback, the server
  answers with an error reply (empty body, header ``x-rpc-error`` = ``"Type: text"``,
  which the client raises as ``RpcRemoteError``) and acks the request. A request that
  failed once is not retried: a retry would usually fail the same way while the caller
  waits.
* A request without ``reply_to`` (or without ``correlation_id``) cannot be answered: it
  is logged at ERROR and rejected without requeue (the queue's dead-letter exchange
  gets it, if it has one).
* A reply that cannot be published (the server's channel or connection failed) is
  logged at ERROR; the request was handled and is acked, not run again; its caller gets
  ``RpcTimeout`` (or ``RpcInterrupted`` if its own connection failed too).
"""

from __future__ import annotations

import asyncio
import logging
import math
import traceback
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ._support.failure_log import RateLimitedLog
from .aio.channel import Subscription
from .aio.connection import remove_callback
from .consumer import AsyncConsumer
from .exceptions import (
    AMQPError,
    ConfigurationError,
    InvalidStateError,
    Reject,
    RpcInterrupted,
    RpcRemoteError,
    RpcTimeout,
    RpcUnroutable,
)
from .protocol.message import Message
from .protocol.spec import BasicProperties
from .recovery import State

if TYPE_CHECKING:
    from .aio.channel import AsyncChannel
    from .aio.connection import AsyncConnection

__all__ = [
    "ERROR_HEADER",
    "REPLY_TO",
    "AsyncRpcClient",
    "AsyncRpcServer",
    "ReplyBody",
    "RpcHandler",
]

logger = logging.getLogger(__name__)

#: The pseudo-queue of RabbitMQ's direct reply-to.
REPLY_TO = "amq.rabbitmq.reply-to"
#: The header of an error reply: ``"<exception type>: <text>"``.
ERROR_HEADER = "x-rpc-error"
#: What a handler may return: the reply body.
ReplyBody = bytes | bytearray | memoryview | str
#: ``async def handler(request: Message) -> bytes | str``.
RpcHandler = Callable[[Message], Awaitable[ReplyBody]]
_DEFAULT_TIMEOUT = 30.0
UNSET: Any = object()
# Records logged in full per interval (then counted), for late replies and server errors.
_LOG_BURST = 5
_LOG_INTERVAL = 60.0


def _check_timeout(timeout: float | None, field: str = "timeout") -> None:
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        raise ConfigurationError(
            f"{field}: must be a number of seconds > 0 or None, got {timeout!r}"
        )


class AsyncRpcClient:
    """Calls over direct reply-to. Get one with ``await connection.rpc_client()``.

    One channel carries the requests and receives the replies; any number of calls may
    wait at once (each has its own ``correlation_id``). Usable as ``async with``.

    Args:
        connection: an open :class:`AsyncConnection`.
        exchange: where requests go by default ("" is the default exchange: the routing
            key names the server's queue).
        timeout: the default deadline of a call in seconds (``None``: wait for ever).
    """

    def __init__(
        self,
        connection: AsyncConnection,
        *,
        exchange: str = "",
        timeout: float | None = _DEFAULT_TIMEOUT,
    ) -> None:
        _check_timeout(timeout)
        if not isinstance(exchange, str):
            raise ConfigurationError(f"exchange: must be a str, got {type(exchange).__name__}")
        self._conn = connection
        self.exchange = exchange
        self.timeout = timeout
        self._channel: AsyncChannel | None = None
        self._opening: asyncio.Lock | None = None
        # correlation_id -> (future of the reply, routing key of the request)
        self._pending: dict[str, tuple[asyncio.Future[Message], str]] = {}
        self._closed = False
        self._watching = False
        self._late = RateLimitedLog(
            logger,
            "RPC client",
            "late replies",
            burst=_LOG_BURST,
            interval=_LOG_INTERVAL,
            note="dropped without a record each",
        )

    def __repr__(self) -> str:
        return f"<AsyncRpcClient pending={len(self._pending)}{' closed' if self._closed else ''}>"

    async def __aenter__(self) -> AsyncRpcClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def pending(self) -> int:
        """Calls waiting for their reply."""
        return len(self._pending)

    @property
    def late_replies(self) -> int:
        """Replies that matched no waiting call (their call had timed out or was
        interrupted): dropped, counted here, and logged rate-limited."""
        return self._late.total

    async def start(self, timeout: float | None = None) -> None:
        """Open the client's channel and subscribe to direct reply-to (idempotent).

        Args:
            timeout: seconds for opening the channel and for subscribing (``None``: no
                limit).

        Raises:
            InvalidStateError: the client is closed.
        """
        if self._closed:
            raise InvalidStateError("this RPC client is closed")
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._channel is not None and not self._channel.is_closed:
                return
            if not self._watching:
                self._conn.on_state_change(self._on_state)
                self._watching = True
            channel = await self._conn.channel(timeout=timeout)
            channel.add_return_callback(self._on_return)
            try:
                subscription = Subscription(
                    REPLY_TO,
                    self._on_reply,
                    no_ack=True,  # direct reply-to requires it
                    on_close=self._on_channel_closed,
                )
                await channel.start_consumer(subscription, timeout=timeout)
            except BaseException:
                if not channel.is_closed:
                    await channel.close()
                raise
            self._channel = channel

    async def call(
        self,
        routing_key: str,
        body: ReplyBody = b"",
        *,
        exchange: str | None = None,
        timeout: float | None = UNSET,
        headers: dict[str, Any] | None = None,
        content_type: str | None = None,
        properties: BasicProperties | None = None,
    ) -> Message:
        """Send a request and wait for its reply.

        Args:
            routing_key: where the request goes (the server's queue, with the default
                exchange).
            body: the request body (``str`` is sent as UTF-8).
            exchange: overrides the client's exchange for this call.
            timeout: seconds to wait for the reply (default: the client's ``timeout``);
                the request expires with it (per-message TTL, see the module docstring).
            headers: set on the request.
            content_type: set on the request.
            properties: more request properties; ``reply_to`` and ``correlation_id`` are
                the client's; an ``expiration`` longer than what is left of ``timeout``
                is shortened to it.

        Returns:
            The reply message (``body``, ``properties``...). It needs no ack (direct
            reply-to delivers without acks); ``ack()`` on it raises
            ``InvalidStateError``.

        Raises:
            RpcTimeout: no reply within ``timeout``.
            RpcUnroutable: the broker could not route the request.
            RpcInterrupted: the connection or the channel was lost meanwhile.
            RpcRemoteError: the server's handler raised.
            ConfigurationError: an argument is invalid; nothing was sent.
            InvalidStateError: the client is closed.
        """
        if not isinstance(routing_key, str):
            raise ConfigurationError(
                f"routing_key: must be a str, got {type(routing_key).__name__}"
            )
        deadline = self.timeout if timeout is UNSET else timeout
        _check_timeout(deadline)
        if self._closed:
            raise InvalidStateError("this RPC client is closed")
        if self._channel is None or self._channel.is_closed:
            await self.start(deadline)
        channel = self._channel
        assert channel is not None
        correlation_id = uuid.uuid4().hex
        request = _request_properties(properties, headers, content_type, correlation_id)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Message] = loop.create_future()
        self._pending[correlation_id] = (future, routing_key)
        target = self.exchange if exchange is None else exchange
        try:
            async with asyncio.timeout(deadline) as scope:
                when = scope.when()
                if when is not None:
                    request = _expiring(request, when - loop.time())
                await channel.basic_publish(
                    target, routing_key, body, properties=request, mandatory=True
                )
                reply = await future
        except TimeoutError:
            if scope.expired():
                raise RpcTimeout(routing_key, deadline) from None
            raise
        finally:
            self._pending.pop(correlation_id, None)
        error = (reply.properties.headers or {}).get(ERROR_HEADER)
        if error is not None:
            raise RpcRemoteError(routing_key, str(error), reply)
        return reply

    async def close(self) -> None:
        """Fail the waiting calls (``RpcInterrupted``) and close the channel. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._fail_all(InvalidStateError("the RPC client was closed"))
        self._late.close()
        if self._watching:  # a closed client no longer listens to its connection
            remove_callback(self._conn, self._on_state)
            self._watching = False
        channel, self._channel = self._channel, None
        if channel is not None and channel.is_open:
            try:
                await channel.close()
            except AMQPError as exc:
                logger.debug("closing the RPC client's channel failed: %r", exc)

    # ------------------------------------------------------------------ loop callbacks

    def _on_reply(self, message: Message) -> None:
        # Direct reply-to delivers without acks: settling a reply would be a channel
        # error (unknown delivery tag) that ends every call waiting on this channel.
        message.settled = True
        correlation_id = message.properties.correlation_id or ""
        entry = self._pending.pop(correlation_id, None)
        if entry is None or entry[0].done():
            self._late.log(
                "dropped",
                "RPC reply with correlation_id %r matches no waiting call (it timed out, "
                "was interrupted, or is not ours): dropped (%d late replies so far; "
                "client.late_replies counts them)",
                correlation_id,
                self._late.total + 1,
            )
            return
        entry[0].set_result(message)

    def _on_return(self, message: Message) -> None:
        correlation_id = message.properties.correlation_id or ""
        entry = self._pending.pop(correlation_id, None)
        if entry is not None and not entry[0].done():
            entry[0].set_exception(RpcUnroutable(entry[1], message.reply_text))

    def _on_state(self, state: State, cause: AMQPError | None) -> None:
        if state in (State.RECOVERING, State.CLOSED) and self._pending:
            self._fail_all(cause or InvalidStateError(f"the connection is {state.value}"))

    def _on_channel_closed(self, exc: AMQPError) -> None:
        self._fail_all(exc)
        self._channel = None  # the next call opens another

    def _fail_all(self, reason: BaseException) -> None:
        pending, self._pending = self._pending, {}
        for future, routing_key in pending.values():
            if not future.done():
                future.set_exception(RpcInterrupted(routing_key, reason))


def _request_properties(
    properties: BasicProperties | None,
    headers: dict[str, Any] | None,
    content_type: str | None,
    correlation_id: str,
) -> BasicProperties:
    if properties is not None and not isinstance(properties, BasicProperties):
        raise ConfigurationError(
            f"properties: must be a rabbitry.Properties, got {type(properties).__name__}"
        )
    fields = (
        {name: getattr(properties, name) for name in BasicProperties.FIELDS} if properties else {}
    )
    if headers is not None:
        fields["headers"] = headers
    if content_type is not None:
        fields["content_type"] = content_type
    fields["reply_to"] = REPLY_TO
    fields["correlation_id"] = correlation_id
    return BasicProperties(**fields)


def _expiring(request: BasicProperties, remaining: float) -> BasicProperties:
    """``request`` with the TTL of a call that has ``remaining`` seconds left: the
    time left in milliseconds, rounded up, unless a shorter ``expiration`` is set."""
    ttl = max(1, math.ceil(remaining * 1000))
    own = request.expiration
    if own is not None and (not own.isdigit() or int(own) <= ttl):
        return request  # shorter (or invalid: the encoder names the field)
    fields = {name: getattr(request, name) for name in BasicProperties.FIELDS}
    fields["expiration"] = str(ttl)
    return BasicProperties(**fields)


# --------------------------------------------------------------------------- server


def server_log(queue: str, loop: asyncio.AbstractEventLoop | None = None) -> RateLimitedLog:
    """The rate-limited ERROR log of an RPC server on ``queue`` (for the two servers)."""
    return RateLimitedLog(
        logger,
        f"RPC server on {queue!r}",
        "failed requests",
        burst=_LOG_BURST,
        interval=_LOG_INTERVAL,
        loop=loop,
    )


def check_request(message: Message, errors: RateLimitedLog) -> None:
    """Refuse a request that cannot be answered (see the module's rule)."""
    props = message.properties
    if not props.reply_to or not props.correlation_id:
        missing = "reply_to" if not props.reply_to else "correlation_id"
        errors.log(
            "rejected as unanswerable",
            "%s: request without %s cannot be answered: rejected without requeue "
            "(dead-lettered if the queue has a dead-letter exchange)",
            errors.subject,
            missing,
        )
        raise Reject(f"request without {missing}")


def reply_for(
    message: Message, outcome: ReplyBody | BaseException, errors: RateLimitedLog
) -> tuple[ReplyBody, BasicProperties]:
    """The reply to publish for ``message``: the handler's result, or its error."""
    correlation_id = message.properties.correlation_id
    if isinstance(outcome, BaseException):
        errors.log(
            "answered with the handler's error",
            "%s: the handler failed for request %r; answered with the error",
            errors.subject,
            correlation_id,
            exc_info=outcome,
        )
        text = "".join(traceback.format_exception_only(type(outcome), outcome)).strip()
        return b"", BasicProperties(correlation_id=correlation_id, headers={ERROR_HEADER: text})
    if not isinstance(outcome, bytes | bytearray | memoryview | str):
        error = TypeError(
            f"the RPC handler must return bytes or str (the reply body), got "
            f"{type(outcome).__name__}"
        )
        return reply_for(message, error, errors)
    return outcome, BasicProperties(correlation_id=correlation_id)


def reply_lost(message: Message, exc: AMQPError, errors: RateLimitedLog) -> None:
    """The reply could not be sent: the request counts as handled (it is acked, not run
    again); its caller gets ``RpcTimeout`` or ``RpcInterrupted``."""
    errors.log(
        "handled, reply lost",
        "%s: the reply to request %r could not be sent (%r); the caller will time out",
        errors.subject,
        message.properties.correlation_id,
        exc,
    )


class AsyncRpcServer:
    """Answers requests from ``queue`` with ``handler``. Get one with
    ``connection.rpc_server(queue, handler)``; start it with ``await server.start()`` or
    ``async with``. See the module docstring for the rule on failures.

    Built on :class:`rabbitry.AsyncConsumer` (manual acks, resubscribe, recovery): the
    queue must exist (declare it first). Replies leave on a channel of their own.

    Args:
        connection: an open :class:`AsyncConnection`.
        queue: the queue requests arrive on.
        handler: ``async def handler(request: Message) -> bytes | str``.
        prefetch: requests delivered ahead of the handler.
        concurrency: requests handled at once.
    """

    def __init__(
        self,
        connection: AsyncConnection,
        queue: str,
        handler: RpcHandler,
        *,
        prefetch: int = 10,
        concurrency: int = 1,
    ) -> None:
        from .consumer import is_async_callable

        if not is_async_callable(handler):
            raise ConfigurationError(
                f"handler: must be a coroutine function (async def handler(request)), got "
                f"{handler!r}; the thread-safe Connection.rpc_server takes plain functions"
            )
        self._conn = connection
        self.queue = queue
        self._handler = handler
        self._reply_channel: AsyncChannel | None = None
        self._errors = server_log(queue)
        self.consumer: AsyncConsumer = AsyncConsumer(
            connection, queue, self._serve, prefetch=prefetch, concurrency=concurrency
        )

    def __repr__(self) -> str:
        return f"<AsyncRpcServer queue={self.queue!r}>"

    async def __aenter__(self) -> AsyncRpcServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start(self, timeout: float | None = None) -> None:
        """Open the reply channel and start consuming requests.

        Args:
            timeout: seconds for each broker request it makes (``None``: no limit).
        """
        self._reply_channel = await self._conn.channel(timeout=timeout)
        await self.consumer.start(timeout)

    async def stop(self, timeout: float | None = None) -> None:
        """Stop consuming (running handlers finish and reply) and close the reply channel.

        Args:
            timeout: seconds to wait for running handlers; past it they are cancelled.
        """
        try:
            await self.consumer.stop(timeout=timeout)
        finally:
            self._errors.close()
        channel, self._reply_channel = self._reply_channel, None
        if channel is not None and channel.is_open:
            await channel.close()

    async def wait(self, timeout: float | None = None) -> AMQPError | None:
        """Wait until the server has ended for good (see :meth:`AsyncConsumer.wait`).

        Args:
            timeout: seconds to wait (``None``: no limit).

        Returns:
            ``None`` after :meth:`stop`, else why it ended.
        """
        return await self.consumer.wait(timeout)

    async def _serve(self, message: Message) -> None:
        check_request(message, self._errors)
        outcome: ReplyBody | BaseException
        try:
            outcome = await self._handler(message)
        except Exception as exc:
            outcome = exc
        body, properties = reply_for(message, outcome, self._errors)
        assert message.properties.reply_to is not None
        try:
            channel = self._reply_channel
            if channel is None or channel.is_closed:
                channel = self._reply_channel = await self._conn.channel()
            await channel.basic_publish(
                "", message.properties.reply_to, body, properties=properties
            )
        except AMQPError as exc:
            reply_lost(message, exc, self._errors)

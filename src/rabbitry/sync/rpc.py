"""RpcClient and RpcServer: the thread-safe twins of :mod:`rabbitry.rpc`.

The client runs the async client on the connection's IO thread: any thread may call
``call()`` and block for its reply. The server runs a plain ``handler(request)`` on a
pool of ``concurrency`` threads (a :class:`rabbitry.Consumer`) and publishes each reply
from that thread. The rules (errors, timeouts, what the server does with a failing
handler) are those of :mod:`rabbitry.rpc`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..exceptions import AMQPError, ConfigurationError
from ..rpc import (
    UNSET,
    AsyncRpcClient,
    ReplyBody,
    check_request,
    reply_for,
    reply_lost,
    server_log,
)
from ._connection import engine_of, portal_of
from .channel import caller_timeout
from .consumer import Consumer

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..protocol.message import Message
    from ..protocol.spec import BasicProperties
    from ._connection import Connection
    from .channel import Channel

__all__ = ["RpcClient", "RpcServer"]


class RpcClient:
    """Calls over direct reply-to from any thread. Get one with
    ``connection.rpc_client()``; usable as ``with``. See
    :class:`rabbitry.rpc.AsyncRpcClient` for the arguments and the errors."""

    def __init__(
        self, connection: Connection, *, exchange: str = "", timeout: float | None = 30.0
    ) -> None:
        self._portal = portal_of(connection)
        self._async = AsyncRpcClient(engine_of(connection), exchange=exchange, timeout=timeout)

    def __repr__(self) -> str:
        return repr(self._async).replace("AsyncRpcClient", "RpcClient", 1)

    def __enter__(self) -> RpcClient:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def pending(self) -> int:
        """Calls waiting for their reply."""
        return self._async.pending

    @property
    def late_replies(self) -> int:
        """Replies that matched no waiting call: dropped, counted, logged rate-limited."""
        return self._async.late_replies

    @property
    def exchange(self) -> str:
        """Where requests go by default."""
        return self._async.exchange

    @property
    def timeout(self) -> float | None:
        """The default deadline of a call in seconds."""
        return self._async.timeout

    def start(self, timeout: float | None = None) -> None:
        """Open the client's channel and subscribe to direct reply-to (idempotent).

        Args:
            timeout: seconds for opening the channel and for subscribing (``None``: no
                limit).
        """
        self._portal.call(self._async.start, timeout, wait=caller_timeout(timeout))

    def call(
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
        """Send a request and block for its reply; see :meth:`AsyncRpcClient.call`.

        Args:
            routing_key: where the request goes (the server's queue, with the default
                exchange).
            body: the request body (``str`` is sent as UTF-8).
            exchange: overrides the client's exchange for this call.
            timeout: seconds to wait for the reply (default: the client's ``timeout``).
            headers: set on the request.
            content_type: set on the request.
            properties: more request properties; ``reply_to`` and ``correlation_id`` are
                the client's.

        Returns:
            The reply message; it needs no ack.

        Raises:
            RpcTimeout: no reply within ``timeout``.
            RpcUnroutable: the broker could not route the request.
            RpcInterrupted: the connection or the channel was lost meanwhile.
            RpcRemoteError: the server's handler raised.
            ConfigurationError: an argument is invalid; nothing was sent.
            InvalidStateError: the client is closed.
        """
        deadline = self._async.timeout if timeout is UNSET else timeout
        return self._portal.call(
            self._async.call,
            routing_key,
            body,
            exchange=exchange,
            timeout=deadline,
            headers=headers,
            content_type=content_type,
            properties=properties,
            wait=caller_timeout(deadline),
        )

    def close(self) -> None:
        """Fail the waiting calls and close the channel. Idempotent."""
        self._portal.call(self._async.close, wait=10.0)


class RpcServer:
    """Answers requests from ``queue`` with a plain ``handler(request) -> bytes | str``
    run on pool threads. Get one with ``connection.rpc_server(queue, handler)``; start
    it with ``start()`` or ``with``. See :class:`rabbitry.rpc.AsyncRpcServer`."""

    def __init__(
        self,
        connection: Connection,
        queue: str,
        handler: Callable[[Message], ReplyBody],
        *,
        prefetch: int = 10,
        concurrency: int = 1,
    ) -> None:
        if not callable(handler):
            raise ConfigurationError(
                f"handler: must be callable (a function taking the request), got "
                f"{type(handler).__name__}"
            )
        self._conn = connection
        self.queue = queue
        self._handler = handler
        self._reply_channel: Channel | None = None
        self._errors = server_log(queue, portal_of(connection).loop)
        self.consumer: Consumer = Consumer(
            connection, queue, self._serve, prefetch=prefetch, concurrency=concurrency
        )

    def __repr__(self) -> str:
        return f"<RpcServer queue={self.queue!r}>"

    def __enter__(self) -> RpcServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout: float | None = None) -> None:
        """Open the reply channel and start consuming requests.

        Args:
            timeout: seconds for each broker request it makes (``None``: no limit).
        """
        self._reply_channel = self._conn.channel(timeout=timeout)
        self.consumer.start(timeout)

    def stop(self, timeout: float | None = None) -> None:
        """Stop consuming (running handlers finish and reply) and close the reply channel.

        Args:
            timeout: seconds to wait for running handlers.
        """
        try:
            self.consumer.stop(timeout=timeout)
        finally:
            self._errors.close()
        channel, self._reply_channel = self._reply_channel, None
        if channel is not None and channel.is_open:
            channel.close()

    def wait(self, timeout: float | None = None) -> AMQPError | None:
        """Block until the server has ended for good (see :meth:`Consumer.wait`).

        Args:
            timeout: seconds to wait (``None``: no limit).

        Returns:
            ``None`` after :meth:`stop`, else why it ended.
        """
        return self.consumer.wait(timeout)

    def _serve(self, message: Message) -> None:
        # A pool thread: the handler may block; the reply leaves from here.
        check_request(message, self._errors)
        outcome: ReplyBody | BaseException
        try:
            outcome = self._handler(message)
        except Exception as exc:
            outcome = exc
        body, properties = reply_for(message, outcome, self._errors)
        assert message.properties.reply_to is not None
        try:
            channel = self._reply_channel
            if channel is None or channel.is_closed:
                channel = self._reply_channel = self._conn.channel()
            channel.basic_publish("", message.properties.reply_to, body, properties=properties)
        except AMQPError as exc:
            reply_lost(message, exc, self._errors)

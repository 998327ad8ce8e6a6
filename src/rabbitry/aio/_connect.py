"""AsyncConnection's connection attempts: one address, then the list of them.

:class:`Connector` opens the socket of an attempt (TCP, TLS) for the connection's
:class:`~rabbitry.aio._socket.SocketIO` and waits for the AMQP handshake over it, giving
each failure its own type (see also :mod:`rabbitry.aio._connect_errors`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..exceptions import (
    AMQPError,
    AuthenticationError,
    ConnectError,
    CredentialsError,
    NotAnAMQPServer,
    Timeout,
    TLSError,
    VirtualHostAccessRefused,
    VirtualHostNotFound,
)
from ..protocol.connection import ConnectionProtocol
from ._connect_errors import refine, wait_opened
from ._socket import Transport

if TYPE_CHECKING:
    from ..config import ConnectionParameters
    from ._connection_state import ConnectionLifecycle
    from ._socket import SocketIO

__all__ = ["Connector", "CredentialsProvider"]

logger = logging.getLogger("rabbitry.connection")

#: Returns ``(username, password)``; called before every connect and reconnect attempt.
CredentialsProvider = Callable[[], "tuple[str, str] | Awaitable[tuple[str, str]]"]


class Connector:
    """Connects a connection to one of its addresses: credentials, socket, TLS and the
    AMQP handshake, each failure given its own type.

    Args:
        candidates: the configured addresses, in order.
        credentials_provider: called before each attempt, if given.
        max_message_size: the connection's option (``None``: follow the broker).
        io: the connection's socket side, which each attempt's socket feeds.
        lifecycle: the connection's lifecycle (the futures of each attempt).
    """

    def __init__(
        self,
        candidates: list[ConnectionParameters],
        credentials_provider: CredentialsProvider | None,
        max_message_size: int | None,
        io: SocketIO,
        lifecycle: ConnectionLifecycle,
    ) -> None:
        self.candidates = candidates
        self._credentials_provider = credentials_provider
        self._max_message_size = max_message_size
        self._io = io
        self._lifecycle = lifecycle

    async def connect_any(self, timeout: float | None) -> ConnectionParameters:
        """Connect to the first address that accepts us, in order.

        Args:
            timeout: overall deadline in seconds.

        Returns:
            The address connected to.

        Raises:
            AuthenticationError: the broker refused the credentials (not retried).
            VirtualHostNotFound / VirtualHostAccessRefused: not retried.
            ConnectError: no address accepted the connection; ``errors`` lists why.
            TLSError / CredentialsError / NotAnAMQPServer: every address failed that
                same way.
            Timeout: no address accepted the connection within ``timeout``.
        """
        reset = self._lifecycle.reset_attempt
        errors: list[tuple[str, BaseException]] = []
        try:
            async with asyncio.timeout(timeout):
                for params in self.candidates:
                    try:
                        await self.connect(params)
                        return params
                    except (AuthenticationError, VirtualHostNotFound, VirtualHostAccessRefused):
                        reset()
                        raise
                    except (AMQPError, OSError, TimeoutError) as exc:
                        errors.append((params.address, exc))
                        logger.debug("connect to %s failed: %r", params.address, exc)
                        reset()
        except TimeoutError:
            reset()
            raise Timeout(f"could not connect within {timeout} s") from None
        summary = "; ".join(f"{address}: {exc!r}" for address, exc in errors)
        failure = ConnectError(f"could not connect to any broker ({summary})", errors)
        for kind in (TLSError, CredentialsError, NotAnAMQPServer):
            same = [exc for _, exc in errors if isinstance(exc, kind)]
            if errors and len(same) == len(errors):
                # Every address failed the same local way (TLS configuration, or the
                # credentials provider): shown as such, its __cause__ explaining it.
                raise same[-1]
        raise failure from (errors[-1][1] if errors else None)

    async def _provided_credentials(self) -> tuple[str, str]:
        provider = self._credentials_provider
        assert provider is not None
        try:
            result = provider()
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # the provider is user code: any failure is reported
            raise CredentialsError(f"credentials_provider raised {type(exc).__name__}") from exc
        if (
            not isinstance(result, tuple)
            or len(result) != 2
            or not all(isinstance(part, str) for part in result)
        ):
            raise CredentialsError(
                "credentials_provider: must return a (username, password) tuple of two "
                f"strings, got {type(result).__name__}"
            )
        return result

    async def connect(self, params: ConnectionParameters) -> None:
        """Connect to ``params`` and wait for connection.open-ok.

        Args:
            params: the address.

        Raises:
            AMQPError: the attempt failed (typed: ``TLSError``, ``ConnectError``,
                ``Timeout``, ``VirtualHostNotFound``...); the caller forgets it.
        """
        loop = asyncio.get_running_loop()
        io = self._io
        io.tls_error = None
        username, password = params.username, params.password
        if self._credentials_provider is not None:
            username, password = await self._provided_credentials()
        proto = io.proto = ConnectionProtocol(
            username=username,
            password=password,
            virtual_host=params.virtual_host,
            heartbeat=params.heartbeat,
            channel_max=params.channel_max,
            frame_max=params.frame_max,
            auth_mechanism=params.auth_mechanism,
            connection_name=params.connection_name,
            locale=params.locale,
            client_properties=params.client_properties,
            max_message_size=self._max_message_size,
        )
        opened = self._lifecycle.begin_attempt(loop)
        context: ssl.SSLContext | None = None
        if params.use_tls:
            context = params.ssl_context or ssl.create_default_context()
        try:
            async with asyncio.timeout(params.connection_timeout):
                await loop.create_connection(
                    lambda: Transport(io, proto),
                    params.host,
                    params.port,
                    ssl=context,
                    server_hostname=params.server_hostname if context else None,
                )
                await wait_opened(opened, lambda: bool(proto.greeting), params)
        except TimeoutError:
            raise Timeout(
                f"{params.address}: no open connection within {params.connection_timeout} s"
            ) from None
        except AMQPError as exc:
            refined = refine(exc, params)
            if refined is not exc:
                raise refined from exc
            alert = io.tls_error
            if alert is not None and not isinstance(exc, AuthenticationError):
                # TLS 1.3: the broker checks our certificate after our side of the
                # handshake finished, so its refusal arrives as an alert on the first read.
                reason = alert.reason or str(alert)
                raise TLSError(
                    f"{params.address}: the broker ended the TLS session during the AMQP "
                    f"handshake: {reason} (is a valid client certificate configured?)"
                ) from alert
            raise  # already ours (AuthenticationError is also an OSError: keep it as it is)
        except (ssl.SSLError, ssl.CertificateError) as exc:  # before OSError: its subclass
            reason = getattr(exc, "verify_message", None) or exc.reason or str(exc)
            host = params.server_hostname
            raise TLSError(
                f"{params.address}: TLS handshake with {host!r} failed: {reason}"
            ) from exc
        except OSError as exc:
            raise ConnectError(f"{params.address}: {exc}") from exc

"""Connection attempts that fail for a reason worth its own type.

* :func:`refine`: the broker closed the connection at connection.open because the
  virtual host does not exist (530 "vhost ... not found") or the user may not use it
  (530 "access to vhost ... refused", 403): :class:`VirtualHostNotFound` /
  :class:`VirtualHostAccessRefused` instead of a bare reply code; a
  :class:`NotAnAMQPServer` from the sans-IO greeting check gets the address.
* :func:`wait_opened`: the address accepted TCP but stays silent after our protocol
  header (an HTTP server waits for a request line: the management port 15672 closes
  after 5 s). After :data:`PROBE_AFTER` seconds of silence a second connection sends an
  HTTP ``HEAD`` request; an HTTP answer ends the attempt with :class:`NotAnAMQPServer`
  at once. A slow AMQP broker answers that probe with its protocol header, and the
  attempt goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from ..exceptions import (
    AMQPError,
    ConnectionClosedByBroker,
    NotAnAMQPServer,
    VirtualHostAccessRefused,
    VirtualHostNotFound,
)
from ..protocol.greeting import describe_answer

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..config import ConnectionParameters

__all__ = ["PROBE_AFTER", "refine", "wait_opened"]

#: Seconds of silence after the protocol header before the HTTP probe.
PROBE_AFTER = 1.0
_PROBE_TIMEOUT = 2.0
_PORT_HINT = (
    "; the URL probably names the management HTTP port: AMQP listens on 5672 "
    "(5671 with TLS) by default"
)


def refine(exc: AMQPError, params: ConnectionParameters) -> AMQPError:
    """The typed error for a failed connection attempt (``exc`` itself when none fits)."""
    address, vhost = params.address, params.virtual_host
    if isinstance(exc, NotAnAMQPServer) and not str(exc).startswith(address):
        return NotAnAMQPServer(f"{address}: {exc}{_hint(params)}", exc.received)
    if not isinstance(exc, ConnectionClosedByBroker) or "vhost" not in exc.reply_text:
        return exc
    text = exc.reply_text
    if exc.reply_code == 530 and "not found" in text:
        return VirtualHostNotFound(
            f"{address}: the broker has no virtual host {vhost!r} ({exc.reply_code} {text})",
            [(address, exc)],
        )
    if exc.reply_code in (530, 403) and "refused" in text:
        return VirtualHostAccessRefused(
            f"{address}: user {params.username!r} may not use virtual host {vhost!r} "
            f"({exc.reply_code} {text})",
            [(address, exc)],
        )
    return exc


def _hint(params: ConnectionParameters) -> str:
    return _PORT_HINT if params.port in (15672, 15671, 80, 443, 8080) else ""


async def wait_opened(
    opened: asyncio.Future[None], greeted: Callable[[], bool], params: ConnectionParameters
) -> None:
    """Wait for the handshake; probe a silent peer with HTTP (see the module docstring)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(opened), PROBE_AFTER)
        return
    if greeted() or params.use_tls:
        await opened
        return
    probe = asyncio.ensure_future(_http_answer(params.host, params.port))
    try:
        waiters: set[asyncio.Future[Any]] = {opened, probe}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if not opened.done():
            answer = await probe
            if answer.startswith(b"HTTP/"):
                raise NotAnAMQPServer(
                    f"{params.address}: it sends nothing after the AMQP protocol header, "
                    f"and {describe_answer(answer)}{_hint(params)}",
                    answer,
                )
        await opened
    finally:
        probe.cancel()


async def _http_answer(host: str, port: int) -> bytes:
    """The first bytes the address answers to an HTTP request (b"" if none)."""
    try:
        async with asyncio.timeout(_PROBE_TIMEOUT):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(b"HEAD / HTTP/1.0\r\nUser-Agent: rabbitry\r\n\r\n")
                await writer.drain()
                return await reader.read(64)
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return b""

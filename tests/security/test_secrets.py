"""Passwords never appear in repr, str, logs, exceptions or CLI output.

Every test uses a password made for it (``pw-<random hex>``) and greps everything a user
could see for it: ``repr``/``str`` of the objects, every log record of every logger at
DEBUG (message and formatted traceback), the exception's ``str``/``repr`` and its whole
formatted chain (``__cause__``, ``ConnectError.errors``), and the CLI's stdout/stderr
with ``--debug``. Failures covered: refused port, TLS failure, a protocol violation by
the peer, bad configuration, a wrong password (throw-away node), and a secret rotated
with ``connection.update-secret`` without reconnecting.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import subprocess
import sys
import traceback
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest
from tests.support.evil_broker import EvilBroker, Scenario, frame

import rabbitry
from rabbitry.config import parse_url
from rabbitry.exceptions import (
    AuthenticationError,
    ConfigurationError,
    ConnectError,
    RemoteProtocolError,
)
from rabbitry.protocol import spec
from rabbitry.protocol.connection import ConnectionProtocol

if TYPE_CHECKING:
    from tests.security.conftest import TLSNode

WAIT = 10.0


def _secret() -> str:
    return f"pw-{secrets.token_hex(8)}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: connecting to it is refused


def _exception_texts(exc: BaseException) -> list[str]:
    texts = [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    for _, inner in getattr(exc, "errors", []):
        texts += [str(inner), repr(inner), "".join(traceback.format_exception(inner))]
    return texts


def _log_texts(caplog: pytest.LogCaptureFixture) -> list[str]:
    handler = logging.Formatter()
    return [handler.format(record) for record in caplog.records]


def _assert_hidden(secret: str, texts: list[str]) -> None:
    encoded = quote(secret, safe="")
    for text in texts:
        assert secret not in text and encoded not in text, text


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


# --------------------------------------------------------------------------- objects


def test_reprs_hide_the_password() -> None:
    secret = _secret()
    url = f"amqp://app:{secret}@127.0.0.1:1/vh?heartbeat=5"
    params = parse_url(url)
    conn = rabbitry.AsyncConnection(url)
    sync_conn = rabbitry.Connection(url)
    proto = ConnectionProtocol(username="app", password=secret)
    texts = [
        repr(params),
        str(params),
        params.display_url(),
        repr(conn),
        str(conn),
        repr(sync_conn),
        repr(proto),
    ]
    _assert_hidden(secret, texts)
    assert "***" in params.display_url()


def test_configuration_errors_hide_the_password() -> None:
    secret = _secret()
    for url in (
        f"amqp://app:{secret}@127.0.0.1:99999/",
        f"amqp://app:{secret}@127.0.0.1/?hearbeat=1",
        f"amqp://app:{secret}@127.0.0.1/a/b",
        f"amqp://app:{secret}@127.0.0.1/?cacertfile=/x",
        f"amqps://app:{secret}@127.0.0.1/?cacertfile=/nonexistent",
        f"amqp://app:{secret}%zz@127.0.0.1/",
    ):
        with pytest.raises(ConfigurationError) as info:
            parse_url(url)
        _assert_hidden(secret, _exception_texts(info.value))


def test_method_reprs_hide_secrets() -> None:
    secret = _secret()
    start_ok = spec.ConnectionStartOk(
        client_properties={}, mechanism="PLAIN", response=f"\0u\0{secret}".encode(), locale="en_US"
    )
    update = spec.ConnectionUpdateSecret(new_secret=secret.encode(), reason="rotation")
    _assert_hidden(secret, [repr(start_ok), repr(update)])


# --------------------------------------------------------------------------- failures


async def test_refused_port(debug_logs: pytest.LogCaptureFixture) -> None:
    secret = _secret()
    conn = rabbitry.AsyncConnection(f"amqp://app:{secret}@127.0.0.1:{_free_port()}/")
    with pytest.raises(ConnectError) as info:
        await conn.connect(timeout=WAIT)
    _assert_hidden(secret, _exception_texts(info.value) + _log_texts(debug_logs) + [repr(conn)])


def test_refused_port_sync(debug_logs: pytest.LogCaptureFixture) -> None:
    secret = _secret()
    conn = rabbitry.Connection(f"amqp://app:{secret}@127.0.0.1:{_free_port()}/")
    with pytest.raises(ConnectError) as info:
        conn.connect(timeout=WAIT)
    conn.close()
    _assert_hidden(secret, _exception_texts(info.value) + _log_texts(debug_logs) + [repr(conn)])


async def test_tls_failure(debug_logs: pytest.LogCaptureFixture) -> None:
    """amqps to a plain-TCP peer: the handshake fails; nothing shows the password."""
    secret = _secret()
    with EvilBroker(Scenario("plain-peer", wait_for_go=False)) as evil:
        conn = rabbitry.AsyncConnection(f"amqps://app:{secret}@127.0.0.1:{evil.port}/")
        with pytest.raises(ConnectError) as info:
            await conn.connect(timeout=WAIT)
    _assert_hidden(secret, _exception_texts(info.value) + _log_texts(debug_logs))


async def test_protocol_violation(debug_logs: pytest.LogCaptureFixture) -> None:
    secret = _secret()
    with EvilBroker(Scenario("bad-frame-end", frame(1, 1, b"\0\x3c\0\x50", end=0))) as evil:
        conn = rabbitry.AsyncConnection(
            f"amqp://app:{secret}@127.0.0.1:{evil.port}/", recovery=None
        )
        await conn.connect(timeout=WAIT)
        await conn.channel(timeout=WAIT)
        evil.go()
        exc = await conn.wait_closed(WAIT)
        await conn.close(timeout=WAIT)
        # The broker did get the password (in start-ok): the grep would find a leak.
        (start_ok,) = evil.methods(spec.ConnectionStartOk)
        assert secret.encode() in start_ok.response
    assert isinstance(exc, RemoteProtocolError)
    _assert_hidden(secret, _exception_texts(exc) + _log_texts(debug_logs) + [repr(conn)])


def test_cli_output_hides_the_password() -> None:
    secret = _secret()
    url = f"amqp://app:{secret}@127.0.0.1:{_free_port()}/"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rabbitry",
            "--debug",
            "--url",
            url,
            "--timeout",
            "5",
            "publish",
            "--routing-key",
            "q",
            "hello",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 3, result  # connection error
    assert "***" in result.stderr
    _assert_hidden(secret, [result.stdout, result.stderr])


# --------------------------------------------------------------------------- real broker


@pytest.mark.faults
async def test_wrong_password(tls_node: TLSNode, debug_logs: pytest.LogCaptureFixture) -> None:
    secret = _secret()
    conn = rabbitry.AsyncConnection(f"amqp://guest:{secret}@127.0.0.1:{tls_node.port}/")
    with pytest.raises(AuthenticationError) as info:
        await conn.connect(timeout=WAIT)
    _assert_hidden(secret, _exception_texts(info.value) + _log_texts(debug_logs) + [repr(conn)])


@pytest.mark.faults
async def test_update_secret_rotates_without_reconnecting(
    tls_node: TLSNode, debug_logs: pytest.LogCaptureFixture
) -> None:
    """connection.update-secret: the broker re-checks the new secret on the same socket."""
    user, old, new = f"rotator-{secrets.token_hex(4)}", _secret(), _secret()
    await asyncio.to_thread(tls_node.ctl, "add_user", user, old)
    await asyncio.to_thread(tls_node.ctl, "set_permissions", "-p", "/", user, ".*", ".*", ".*")
    conn = rabbitry.AsyncConnection(f"amqp://{user}:{old}@127.0.0.1:{tls_node.port}/")
    await conn.connect(timeout=WAIT)
    try:
        channel = await conn.channel(timeout=WAIT)
        transport = conn._transport
        await asyncio.to_thread(tls_node.ctl, "change_password", user, new)
        await conn.update_secret(new, "rotation", timeout=WAIT)
        assert conn._transport is transport  # same socket: no reconnect
        await channel.queue_declare("", exclusive=True, timeout=WAIT)
        assert conn.is_open
    finally:
        await conn.close(timeout=WAIT)
    texts = [*_log_texts(debug_logs), repr(conn)]
    _assert_hidden(old, texts)
    _assert_hidden(new, texts)

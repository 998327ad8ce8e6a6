"""amqps against a throw-away node with a TLS listener and test certificates.

The certificates are made here with ``trustme`` (a CA, a server certificate for
``localhost`` and ``127.0.0.1``, a client certificate whose CN is a broker user, and an
unrelated CA). One node of this module's own listens for TLS on a port of its block with
``verify_peer`` and ``fail_if_no_peer_cert = true`` (mutual TLS) and offers EXTERNAL
(``rabbitmq_auth_mechanism_ssl``, user name from the certificate's CN).

Proven here: verification and host-name checking are on by default; a good certificate
connects; a wrong host name, an untrusted CA or a missing client certificate fail with
:class:`rabbitry.TLSError` (inside ``ConnectError.errors``, its ``__cause__``) naming the
address and the reason; the URI options (cacertfile, certfile, keyfile, verify,
server_name_indication) do what RabbitMQ's URI spec says; EXTERNAL logs in as the CN.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest
from tests.security.conftest import CLIENT_CN

import rabbitry
from rabbitry.exceptions import TLSError

if TYPE_CHECKING:
    from tests.security.conftest import Certs, TLSNode

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

WAIT = 10.0


def _url(node: TLSNode, certs: Certs, host: str = "127.0.0.1", **query: str) -> str:
    params = {
        "cacertfile": str(certs.ca_file),
        "certfile": str(certs.client_cert),
        "keyfile": str(certs.client_key),
        **query,
    }
    text = "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items() if v)
    return f"amqps://guest:guest@{host}:{node.tls_port}/?{text}"


def _tls_cause(info: pytest.ExceptionInfo[TLSError]) -> TLSError:
    # Every address failed at TLS, so connect() raises the TLSError itself (not a
    # ConnectError around it); its cause is the ssl error that explains it.
    error = info.value
    assert isinstance(error, TLSError), repr(error)
    assert isinstance(error.__cause__, ssl.SSLError)
    return error


async def _roundtrip(conn: rabbitry.AsyncConnection) -> None:
    channel = await conn.channel(timeout=WAIT)
    ok = await channel.queue_declare("", exclusive=True, timeout=WAIT)
    assert ok.queue.startswith("amq.gen-")


async def test_good_certificate_connects(tls_node: TLSNode, certs: Certs) -> None:
    conn = rabbitry.AsyncConnection(_url(tls_node, certs))
    await conn.connect(timeout=WAIT)
    try:
        assert conn.params.use_tls and conn.params.server_hostname == "127.0.0.1"
        ssl_object = conn._transport.get_extra_info("ssl_object") if conn._transport else None
        assert ssl_object is not None and ssl_object.version() in ("TLSv1.2", "TLSv1.3")
        await _roundtrip(conn)
    finally:
        await conn.close(timeout=WAIT)


async def test_localhost_name_connects(tls_node: TLSNode, certs: Certs) -> None:
    conn = rabbitry.AsyncConnection(_url(tls_node, certs, host="localhost"))
    await conn.connect(timeout=WAIT)
    await conn.close(timeout=WAIT)


async def test_wrong_hostname_fails_with_tls_error(tls_node: TLSNode, certs: Certs) -> None:
    url = _url(tls_node, certs, server_name_indication="wrong.example.com")
    conn = rabbitry.AsyncConnection(url)
    with pytest.raises(TLSError) as info:
        await conn.connect(timeout=WAIT)
    cause = _tls_cause(info)
    assert "wrong.example.com" in str(cause)
    assert f"127.0.0.1:{tls_node.tls_port}" in str(cause)
    assert "mismatch" in str(cause).lower() or "not valid" in str(cause).lower()
    assert not conn.is_open


async def test_untrusted_ca_fails_with_tls_error(tls_node: TLSNode, certs: Certs) -> None:
    conn = rabbitry.AsyncConnection(_url(tls_node, certs, cacertfile=str(certs.other_ca_file)))
    with pytest.raises(TLSError) as info:
        await conn.connect(timeout=WAIT)
    cause = _tls_cause(info)
    assert "certificate" in str(cause).lower()
    assert "guest:guest" not in str(info.value) and "guest:guest" not in repr(info.value)


async def test_verification_is_on_by_default(tls_node: TLSNode) -> None:
    """A bare amqps:// URL verifies against the system CAs, which do not know our CA."""
    conn = rabbitry.AsyncConnection(f"amqps://guest:guest@127.0.0.1:{tls_node.tls_port}/")
    with pytest.raises(TLSError) as info:
        await conn.connect(timeout=WAIT)
    _tls_cause(info)


async def test_verify_none_skips_verification(tls_node: TLSNode, certs: Certs) -> None:
    """verify=verify_none (URI spec) accepts the untrusted chain and the wrong name."""
    url = _url(
        tls_node,
        certs,
        cacertfile="",
        verify="verify_none",
        server_name_indication="wrong.example.com",
    )
    conn = rabbitry.AsyncConnection(url)
    await conn.connect(timeout=WAIT)
    try:
        await _roundtrip(conn)
    finally:
        await conn.close(timeout=WAIT)


async def test_missing_client_certificate_is_refused(tls_node: TLSNode, certs: Certs) -> None:
    """fail_if_no_peer_cert: without certfile/keyfile the broker ends the handshake.

    TLS 1.3 completes the client's side of the handshake before the server checks our
    (absent) certificate, so the alert arrives on the first read after it; it must still
    surface as a TLSError that says what is wrong, not as a lost connection.
    """
    url = _url(tls_node, certs, certfile="", keyfile="")
    conn = rabbitry.AsyncConnection(url, recovery=None)
    with pytest.raises(TLSError, match="client certificate") as info:
        await conn.connect(timeout=WAIT)
    assert isinstance(info.value.__cause__, ssl.SSLError)
    assert not conn.is_open


async def test_ssl_context_keyword(tls_node: TLSNode, certs: Certs) -> None:
    context = ssl.create_default_context(cafile=str(certs.ca_file))
    context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    conn = rabbitry.AsyncConnection(
        f"amqp://guest:guest@127.0.0.1:{tls_node.tls_port}/", ssl_context=context
    )
    await conn.connect(timeout=WAIT)
    try:
        await _roundtrip(conn)
    finally:
        await conn.close(timeout=WAIT)


async def test_external_mechanism_logs_in_as_certificate_cn(
    tls_node: TLSNode, certs: Certs
) -> None:
    """Mutual TLS + EXTERNAL: no password is sent; the broker's user is the cert's CN."""
    url = _url(tls_node, certs, auth_mechanism="external").replace("guest:guest@", "")
    conn = rabbitry.AsyncConnection(url, connection_name="tls-external")
    await conn.connect(timeout=WAIT)
    try:
        await _roundtrip(conn)
        rows = await asyncio.to_thread(tls_node.list_connections)
        users = {row["user"] for row in rows if row["connection_name"] == "tls-external"}
        assert users == {CLIENT_CN}
    finally:
        await conn.close(timeout=WAIT)


def test_sync_connection_tls(tls_node: TLSNode, certs: Certs) -> None:
    with rabbitry.Connection(_url(tls_node, certs)) as conn:
        channel = conn.channel(timeout=WAIT)
        assert channel.queue_declare("", exclusive=True, timeout=WAIT).queue
    bad = rabbitry.Connection(_url(tls_node, certs, cacertfile=str(certs.other_ca_file)))
    with pytest.raises(TLSError) as info:
        bad.connect(timeout=WAIT)
    _tls_cause(info)
    bad.close()

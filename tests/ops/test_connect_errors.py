"""Typed connection errors against real servers.

An unknown virtual host and a virtual host the user may not use (a vhost made on the
throw-away management node, where guest has no permissions) raise
``VirtualHostNotFound`` / ``VirtualHostAccessRefused``, still caught as ``ConnectError``.
An AMQP URL that names the management HTTP port raises ``NotAnAMQPServer`` (the
listener stays silent after the AMQP header, then closes after its own 5 s request
timeout; an HTTP probe tells what it is before that), and so does a server whose first
bytes are not a connection.start frame.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx
import pytest

import rabbitry
from rabbitry import (
    AsyncConnection,
    ConnectError,
    NotAnAMQPServer,
    VirtualHostAccessRefused,
    VirtualHostNotFound,
)
from rabbitry.config import default_url, parse_urls

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.support.node import BrokerNode

    from rabbitry.management import ManagementClient


def _shared_url(vhost: str) -> str:
    params = parse_urls(default_url())[0]
    return f"amqp://guest:guest@{params.host}:{params.port}/{vhost}"


async def test_an_unknown_vhost_raises_virtual_host_not_found() -> None:
    conn = AsyncConnection(_shared_url("rabbitry-no-such-vhost"), connection_timeout=10)
    with pytest.raises(VirtualHostNotFound, match=r"rabbitry-no-such-vhost.*530") as caught:
        await conn.connect()
    assert isinstance(caught.value, ConnectError)  # what older code catches
    assert "not found" in str(caught.value)


def test_the_sync_api_raises_virtual_host_not_found_too() -> None:
    with pytest.raises(VirtualHostNotFound):
        rabbitry.Connection(_shared_url("rabbitry-no-such-vhost"), connection_timeout=10).connect()


@pytest.fixture
def forbidden_vhost(api: ManagementClient, mgmt_url: str, uid: str) -> Iterator[str]:
    """A vhost guest has no permissions on (the API gives its creator some: removed)."""
    name = f"{uid}-forbidden"
    api.create_vhost(name)
    try:
        response = httpx.delete(
            f"{mgmt_url}/api/permissions/{quote(name, safe='')}/guest",
            auth=("guest", "guest"),
            timeout=30,
        )
        assert response.status_code in (204, 404), response.text
        yield name
    finally:
        api.delete_vhost(name)


async def test_a_vhost_without_permissions_raises_virtual_host_access_refused(
    mgmt_node: BrokerNode, forbidden_vhost: str
) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{mgmt_node.port}/{forbidden_vhost}"
    with pytest.raises(VirtualHostAccessRefused, match="refused") as caught:
        await AsyncConnection(url, connection_timeout=10).connect()
    assert isinstance(caught.value, ConnectError)
    assert forbidden_vhost in str(caught.value)


async def test_the_management_port_raises_not_an_amqp_server_before_its_timeout(
    mgmt_node: BrokerNode,
) -> None:
    port = mgmt_node.plugin_port("rabbitmq_management")
    conn = AsyncConnection(f"amqp://guest:guest@127.0.0.1:{port}/", connection_timeout=30)
    with pytest.raises(NotAnAMQPServer, match="HTTP") as caught:
        await conn.connect()
    # The listener never answers the AMQP header: it closes silently after its request
    # timeout, which would read as ConnectionLost. An HTTP answer in the error can only
    # come from the probe made while the listener was still silent.
    assert isinstance(caught.value, ConnectError)
    assert caught.value.received.startswith(b"HTTP/")


async def test_a_server_answering_with_other_bytes_raises_not_an_amqp_server_at_once() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readexactly(8)  # our protocol header
            writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            await reader.read()  # keep the socket open: only the bytes can tell
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        conn = AsyncConnection(f"amqp://guest:guest@127.0.0.1:{port}/", connection_timeout=30)
        with pytest.raises(NotAnAMQPServer, match=r"HTTP \('HTTP/1.1 400 Bad Request'\)"):
            await asyncio.wait_for(conn.connect(), 10)
    finally:
        server.close()
        await server.wait_closed()

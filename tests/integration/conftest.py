"""Fixtures for the integration tests: they talk to a real RabbitMQ broker.

The broker is the one at ``RABBITMQ_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``).
If it does not answer, every test here *fails* with a message saying so: a CI run
without a broker must never look green because the integration tests were skipped.

Every test in this directory gets the ``integration`` marker, so ``-m "not integration"``
deselects them when no broker is available on purpose.
"""

from __future__ import annotations

import re
import socket
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import rabbitry
from rabbitry.config import default_url, parse_urls

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

_HERE = Path(__file__).resolve().parent
_PROBE_TIMEOUT = 5.0
_MAX_TEST_PART = 120  # keeps names well below the 255-byte shortstr limit


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


def _probe(url: str) -> str | None:
    """Return why the broker at ``url`` does not speak AMQP, or None if it does.

    Deliberately independent of rabbitry's engine: a bug there must show up as failing
    tests, not as "no broker". Opens TCP, sends the protocol header and expects the
    first bytes of a connection.start method frame on channel 0.
    """
    params = parse_urls(url)[0]
    try:
        with socket.create_connection((params.host, params.port), _PROBE_TIMEOUT) as sock:
            sock.settimeout(_PROBE_TIMEOUT)
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            head = b""
            while len(head) < 11:
                chunk = sock.recv(11 - len(head))
                if not chunk:
                    break
                head += chunk
    except OSError as exc:
        return f"{params.address}: {exc!r}"
    # frame type 1, channel 0, size (4 bytes), class 10 method 10 = connection.start
    if (
        len(head) < 11
        or head[0] != 1
        or head[1:3] != b"\x00\x00"
        or head[7:11] != bytes([0, 10, 0, 10])
    ):
        return f"{params.address}: answered {head!r}, not an AMQP 0-9-1 connection.start"
    return None


@pytest.fixture(scope="session")
def url() -> str:
    """The broker URL the integration tests use (``RABBITMQ_URL`` or the default)."""
    return default_url()


@pytest.fixture(scope="session", autouse=True)
def _broker_available(url: str) -> None:
    problem = _probe(url)
    if problem is not None:
        display = parse_urls(url)[0].display_url()
        pytest.fail(
            f"No RabbitMQ broker answers at RABBITMQ_URL={display} ({problem}). The "
            "integration tests need one: start it (`make broker`) or point RABBITMQ_URL at "
            "one; deselect them explicitly with -m 'not integration'.",
            pytrace=False,
        )


@pytest.fixture
async def conn(url: str) -> AsyncIterator[rabbitry.AsyncConnection]:
    """An open connection, closed after the test.

    The handshake deadline is generous: on a loaded 2-core machine (two test workers
    beside a broker) a broker can take more than a few seconds to answer; a fixture
    that gives up early fails a test for a reason the test is not about.
    """
    connection = rabbitry.AsyncConnection(url, connection_timeout=30)
    await connection.connect()
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
async def channel(conn: rabbitry.AsyncConnection) -> rabbitry.AsyncChannel:
    """An open channel on :func:`conn` (closed with it)."""
    return await conn.channel()


class Names:
    """Unique entity names for one test; what it hands out is deleted afterwards.

    ``names.queue()`` and ``names.exchange()`` return
    ``rabbitry-test-<test name>-<8 hex digits>[-<suffix>]``; ``track_queue`` and
    ``track_exchange`` register names made elsewhere (e.g. by the broker) for cleanup.
    """

    def __init__(self, test_name: str) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", test_name)[:_MAX_TEST_PART]
        self.prefix = f"rabbitry-test-{safe}"
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def _new(self, suffix: str) -> str:
        name = f"{self.prefix}-{uuid.uuid4().hex[:8]}"
        return f"{name}-{suffix}" if suffix else name

    def queue(self, suffix: str = "q") -> str:
        return self.track_queue(self._new(suffix))

    def exchange(self, suffix: str = "x") -> str:
        return self.track_exchange(self._new(suffix))

    def track_queue(self, name: str) -> str:
        self.queues.append(name)
        return name

    def track_exchange(self, name: str) -> str:
        self.exchanges.append(name)
        return name

    async def cleanup(self, url: str) -> None:
        if not self.queues and not self.exchanges:
            return
        async with rabbitry.AsyncConnection(url, connection_timeout=30) as connection:
            ch = await connection.channel()
            for kind, entities in (("queue", self.queues), ("exchange", self.exchanges)):
                for name in entities:
                    try:
                        if kind == "queue":
                            await ch.queue_delete(name, timeout=5)
                        else:
                            await ch.exchange_delete(name, timeout=5)
                    except (rabbitry.NotFound, rabbitry.ResourceLocked):
                        # Already gone, or exclusive to a connection still open (this
                        # fixture may be torn down before ``conn``): the broker deletes
                        # those with their connection.
                        ch = await connection.channel()


@pytest.fixture
async def names(request: pytest.FixtureRequest, url: str) -> AsyncIterator[Names]:
    """A :class:`Names` factory; its queues and exchanges are deleted after the test."""
    factory = Names(request.node.name)
    yield factory
    await factory.cleanup(url)

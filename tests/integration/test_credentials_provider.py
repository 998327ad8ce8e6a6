"""``credentials_provider``: a callable asked for (username, password) on each connect.

The URL deliberately carries wrong credentials, so a connection only opens if what the
provider returned was used. Rotation across a reconnect is in
``tests/faults/test_recovery.py`` (it needs a node whose users the test may change).
"""

from __future__ import annotations

import pytest

import rabbitry
from rabbitry import AsyncConnection, Connection
from rabbitry.config import parse_urls


def _wrong_url(url: str) -> str:
    params = parse_urls(url)[0]
    return f"amqp://nobody:wrong@{params.host}:{params.port}/"


async def test_async_provider_supplies_credentials(url: str) -> None:
    calls = 0

    def provider() -> tuple[str, str]:
        nonlocal calls
        calls += 1
        return ("guest", "guest")

    conn = AsyncConnection(_wrong_url(url), credentials_provider=provider, recovery=None)
    await conn.connect()
    try:
        channel = await conn.channel()
        await channel.queue_declare("", exclusive=True)
    finally:
        await conn.close()
    assert calls == 1


async def test_coroutine_provider_is_awaited(url: str) -> None:
    async def provider() -> tuple[str, str]:
        return ("guest", "guest")

    async with AsyncConnection(_wrong_url(url), credentials_provider=provider) as conn:
        assert conn.is_open


def test_sync_provider_runs_off_the_io_thread(url: str) -> None:
    import threading

    seen: list[str] = []

    def provider() -> tuple[str, str]:
        seen.append(threading.current_thread().name)
        return ("guest", "guest")

    with Connection(_wrong_url(url), credentials_provider=provider) as conn:
        channel = conn.channel()
        channel.queue_declare("", exclusive=True)
    assert len(seen) == 1
    assert seen[0] != threading.main_thread().name


async def test_provider_failure_is_a_credentials_error(url: str) -> None:
    def provider() -> tuple[str, str]:
        raise LookupError("token service down")

    conn = AsyncConnection(_wrong_url(url), credentials_provider=provider, recovery=None)
    with pytest.raises(rabbitry.CredentialsError, match="LookupError") as info:
        await conn.connect()
    assert isinstance(info.value.__cause__, LookupError)


@pytest.mark.parametrize("bad", [None, ("guest",), ("guest", b"guest"), "guest:guest"])
def test_provider_result_must_be_two_strings(url: str, bad: object) -> None:
    def provider() -> object:
        return bad

    conn = Connection(_wrong_url(url), credentials_provider=provider, recovery=None)  # type: ignore[arg-type]
    with pytest.raises(rabbitry.CredentialsError, match=r"credentials_provider: must return"):
        conn.connect()


def test_provider_must_be_callable(url: str) -> None:
    with pytest.raises(
        rabbitry.ConfigurationError, match="credentials_provider: must be a callable"
    ):
        AsyncConnection(url, credentials_provider=("guest", "guest"))  # type: ignore[arg-type]
    with pytest.raises(
        rabbitry.ConfigurationError, match="credentials_provider: must be a callable"
    ):
        Connection(url, credentials_provider=("guest", "guest"))  # type: ignore[arg-type]


async def test_provided_password_never_in_repr_or_errors(url: str) -> None:
    secret = "s3cret-from-provider-9f2"

    def provider() -> tuple[str, str]:
        return ("guest", secret)

    conn = AsyncConnection(_wrong_url(url), credentials_provider=provider, recovery=None)
    with pytest.raises(rabbitry.AMQPConnectionError) as info:
        await conn.connect()
    assert secret not in repr(conn)
    assert secret not in str(info.value) and secret not in repr(info.value)

"""A connection inherited through ``os.fork()`` refuses to work in the child, at once.

The child's socket and IO thread (or event loop) are the parent's: using them would
interleave frames with the parent's or hang on a thread that does not exist. Every call
in the child raises :class:`InvalidStateError` naming the fork, ``close()`` does nothing
there, and the parent's connection is unaffected.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import pytest
from fake_broker import FakeBroker

import rabbitry
from rabbitry.exceptions import InvalidStateError

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterator

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    # Python 3.12 warns about fork() in a process with threads: that is the point here.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@pytest.fixture
def broker() -> Iterator[FakeBroker]:
    with FakeBroker(auto_ack=True) as fake:
        yield fake


def _names_the_fork(exc: BaseException) -> bool:
    return isinstance(exc, InvalidStateError) and (
        "fork()" in str(exc) or "fork()" in str(exc.__cause__)
    )


def run_now(coroutine: Coroutine[Any, Any, object]) -> None:
    """Run a coroutine that must finish (or fail) before its first await.

    The child has no usable event loop: the inherited one is the parent's.
    """
    try:
        coroutine.send(None)
    except StopIteration:
        return
    coroutine.close()
    raise AssertionError("the coroutine waited: it would have used the parent's loop")


def in_child(attempts: list[Callable[[], object]], finish: Callable[[], object]) -> str:
    """Fork; in the child run each attempt and report how it failed; return the report."""
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            report = []
            for attempt in attempts:
                try:
                    attempt()
                    report.append("no error")
                except BaseException as exc:
                    report.append("fork" if _names_the_fork(exc) else repr(exc))
            finish()
            os.write(write_end, "|".join(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 4096):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return b"".join(chunks).decode()


def test_a_sync_connection_used_in_a_forked_child_raises_naming_the_fork(
    broker: FakeBroker,
) -> None:
    conn = rabbitry.Connection(broker.url, recovery=None)
    conn.connect()
    try:
        channel = conn.channel()
        publisher = conn.publisher()
        report = in_child(
            [
                lambda: channel.queue_declare("q"),
                lambda: publisher.publish(b"x", routing_key="q"),
                lambda: channel.basic_publish("", "q", b"x"),
                conn.channel,
            ],
            finish=conn.close,  # a no-op in the child
        )
        assert report == "fork|fork|fork|fork"
        # The parent's connection is untouched by what the child did.
        assert channel.queue_declare("q").queue == "q"
        assert publisher.publish(b"y", routing_key="q").result(30) is None
    finally:
        conn.close()


async def test_an_async_connection_used_in_a_forked_child_raises_naming_the_fork(
    broker: FakeBroker,
) -> None:
    conn = rabbitry.AsyncConnection(broker.url, recovery=None)
    await conn.connect()
    try:
        channel = await conn.channel()

        report = in_child(
            [
                lambda: run_now(channel.queue_declare("q")),
                lambda: channel.basic_ack(1),
                lambda: run_now(conn.channel()),
            ],
            finish=lambda: run_now(conn.close()),  # a no-op in the child
        )
        assert report == "fork|fork|fork"
        assert (await channel.queue_declare("q")).queue == "q"
    finally:
        await conn.close()

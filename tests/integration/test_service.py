"""Services that run until a signal: ``rabbitry.run`` and ``consumer.wait()``.

The signal tests start a real service in a subprocess, wait until it says it consumes,
send it SIGTERM or SIGINT and read what it printed on the way out: the main function
unwound, the consumer ended, every connection closed, exit status 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from typing import TYPE_CHECKING, Any

import pytest
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import (
    AsyncConnection,
    Connection,
    ConsumerCancelled,
    InvalidStateError,
    RecoveryPolicy,
    State,
    Timeout,
)
from rabbitry.config import parse_urls

if TYPE_CHECKING:
    from pathlib import Path

    from tests.integration.conftest import Names

DEADLINE = 60.0  # generous: the machine is shared

ASYNC_SERVICE = """
import asyncio, sys
import rabbitry

URL, QUEUE = sys.argv[1], sys.argv[2]
left_open = []

async def handle(message):
    pass

async def main():
    spare = rabbitry.AsyncConnection(URL)      # never closed by main: run() closes it
    await spare.connect()
    left_open.append(spare)
    async with rabbitry.AsyncConnection(URL) as conn:
        left_open.append(conn)
        channel = await conn.channel()
        await channel.queue_declare(QUEUE, auto_delete=True)
        async with conn.consumer(QUEUE, handle) as consumer:
            try:
                print("READY", flush=True)
                await consumer.wait()
            finally:
                print("UNWOUND", flush=True)
    return "main returned"

result = rabbitry.run(main)
print("RESULT", result, flush=True)
print("CLOSED", *(c.is_closed for c in left_open), flush=True)
"""

SYNC_SERVICE = """
import sys
import rabbitry

URL, QUEUE = sys.argv[1], sys.argv[2]
left_open = []

def main():
    spare = rabbitry.Connection(URL)           # never closed by main: run() closes it
    spare.connect()
    left_open.append(spare)
    with rabbitry.Connection(URL) as conn:
        left_open.append(conn)
        conn.channel().queue_declare(QUEUE, auto_delete=True)
        with conn.consumer(QUEUE, lambda message: None) as consumer:
            try:
                print("READY", flush=True)
                consumer.wait()
            finally:
                print("UNWOUND", flush=True)
    return "main returned"

result = rabbitry.run(main)
print("RESULT", result, flush=True)
print("CLOSED", *(c.is_closed for c in left_open), flush=True)
"""


def _service(tmp_path: Path, source: str, url: str, queue: str) -> subprocess.Popen[str]:
    script = tmp_path / "service.py"
    script.write_text(textwrap.dedent(source), encoding="utf-8")
    return subprocess.Popen(
        [sys.executable, str(script), url, queue],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    ready = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        line = process.stdout.readline()
        lines.append(line)
        if line.strip() == "READY":
            ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if not ready.wait(DEADLINE):
        process.kill()
        _, err = process.communicate()
        pytest.fail(f"the service never said READY: {lines!r}\n{err}")


@pytest.mark.parametrize("source", [ASYNC_SERVICE, SYNC_SERVICE], ids=["async", "sync"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_service_cleanly_and_closes_every_connection(
    tmp_path: Path, url: str, names: Names, source: str, signum: signal.Signals
) -> None:
    process = _service(tmp_path, source, url, names.queue())
    try:
        _wait_ready(process)
        os.kill(process.pid, signum)
        out, err = process.communicate(timeout=DEADLINE)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, f"exit {process.returncode}\n{out}\n{err}"
    lines = out.splitlines()
    assert lines == ["UNWOUND", "RESULT None", "CLOSED True True"], err


#: A sync service whose signal is raised from inside the portal, while the main thread
#: hands ``consumer.wait()`` to the IO thread: at line LINE of function FUNC of
#: ``rabbitry.sync._portal.Portal``, the first time it runs.
INJECTED_SERVICE = """
import signal, sys
import rabbitry
from rabbitry.sync._portal import Portal

URL, QUEUE, FUNC, LINE = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
code = getattr(Portal, FUNC).__code__
armed = []

def local(frame, event, arg):
    if armed and event == "line" and frame.f_lineno == LINE:
        armed.clear()
        signal.raise_signal(signal.SIGINT)  # handled at the next instruction
    return local

def tracer(frame, event, arg):
    return local if frame.f_code is code else None

def main():
    with rabbitry.Connection(URL) as conn:
        conn.channel().queue_declare(QUEUE, auto_delete=True)
        with conn.consumer(QUEUE, lambda message: None) as consumer:
            try:
                armed.append(True)
                sys.settrace(tracer)
                consumer.wait(timeout=20)  # returns only if LINE never ran
                print("NOT INTERRUPTED", flush=True)
            finally:
                sys.settrace(None)
    return "main returned"

print("RESULT", rabbitry.run(main), flush=True)
"""


def _portal_lines_of_a_call(url: str) -> dict[str, list[int]]:
    """The lines of ``Portal.submit`` and ``Portal._call`` that a blocking call runs."""
    from rabbitry.sync._portal import Portal

    codes = {Portal.submit.__code__: "submit", Portal._call.__code__: "_call"}
    ran: dict[str, set[int]] = {name: set() for name in codes.values()}

    def tracer(frame: Any, event: str, arg: object) -> Any:
        name = codes.get(frame.f_code)
        if name is None:
            return None

        def local(frame: Any, event: str, arg: object) -> Any:
            if event == "line":
                ran[name].add(frame.f_lineno)
            return local

        return local

    with Connection(url) as conn:
        channel = conn.channel()
        sys.settrace(tracer)
        try:
            channel.queue_declare("", exclusive=True)
        finally:
            sys.settrace(None)
    return {name: sorted(lines) for name, lines in ran.items()}


def test_a_signal_at_any_point_of_a_blocking_call_stops_the_service(
    tmp_path: Path, url: str, names: Names
) -> None:
    """The signal handler raises ServiceStopped wherever the main thread is, also inside
    the portal's own bookkeeping: the service must stop cleanly from every such point,
    never hang with an operation queued that the IO thread is not told about."""
    script = tmp_path / "service.py"
    script.write_text(textwrap.dedent(INJECTED_SERVICE), encoding="utf-8")
    points = [(f, line) for f, lines in _portal_lines_of_a_call(url).items() for line in lines]
    assert len(points) > 10, points
    failures = []
    for func, line in points:
        try:
            done = subprocess.run(
                [sys.executable, str(script), url, names.queue(), func, str(line)],
                capture_output=True,
                text=True,
                timeout=DEADLINE,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            failures.append(f"{func}:{line} hung: {exc.stdout!r}")
            continue
        if done.returncode != 0 or done.stdout.splitlines()[-1:] != ["RESULT None"]:
            failures.append(f"{func}:{line} exit {done.returncode}: {done.stdout!r} {done.stderr}")
    assert not failures, failures


def test_without_a_signal_run_returns_what_main_returned(url: str) -> None:
    async def main() -> str:
        async with AsyncConnection(url) as conn:
            return f"{conn.is_open}"

    assert rabbitry.run(main) == "True"
    assert rabbitry.run(lambda: "plain") == "plain"


def test_run_closes_connections_main_left_open(url: str) -> None:
    opened: list[AsyncConnection] = []

    async def main() -> None:
        conn = AsyncConnection(url)
        await conn.connect()
        opened.append(conn)

    rabbitry.run(main)
    assert opened[0].is_closed


def test_run_reraises_what_main_raised() -> None:
    async def main() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        rabbitry.run(main)


async def test_run_refuses_a_running_event_loop() -> None:
    async def main() -> None:
        return None

    with pytest.raises(InvalidStateError, match="running event loop"):
        rabbitry.run(main)


def test_run_refuses_other_threads() -> None:
    errors: list[BaseException] = []

    def call() -> None:
        try:
            rabbitry.run(lambda: None)
        except InvalidStateError as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(DEADLINE)
    assert errors and "main thread" in str(errors[0])


# ---------------------------------------------------------------------- consumer.wait


async def _noop(message: rabbitry.Message) -> None:
    return None


async def test_wait_returns_none_once_the_consumer_is_stopped(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)
    consumer = conn.consumer(queue, _noop)
    await consumer.start()
    waiter = asyncio.ensure_future(consumer.wait())
    with pytest.raises(Timeout):
        await consumer.wait(timeout=0.2)
    assert not waiter.done()
    await consumer.stop()
    assert await asyncio.wait_for(waiter, DEADLINE) is None


async def test_wait_returns_the_cancel_when_the_broker_cancels_without_resubscribe(
    conn: AsyncConnection, names: Names
) -> None:
    queue = names.queue()
    channel = await conn.channel()
    await channel.queue_declare(queue)
    consumer = conn.consumer(queue, _noop, resubscribe=False)
    await consumer.start()
    await channel.queue_delete(queue)
    reason = await consumer.wait(timeout=DEADLINE)
    assert isinstance(reason, ConsumerCancelled)
    await consumer.stop()


async def test_wait_returns_the_connection_close_reason(url: str, names: Names) -> None:
    conn = AsyncConnection(url)
    await conn.connect()
    queue = names.queue()
    await (await conn.channel()).queue_declare(queue)
    consumer = conn.consumer(queue, _noop)
    await consumer.start()
    waiter = asyncio.ensure_future(consumer.wait())
    await conn.close()
    reason = await asyncio.wait_for(waiter, DEADLINE)
    assert isinstance(reason, rabbitry.ConnectionClosedByClient)


async def test_wait_before_start_is_refused(conn: AsyncConnection, names: Names) -> None:
    consumer = conn.consumer(names.queue(), _noop)
    with pytest.raises(InvalidStateError, match="never started"):
        await consumer.wait()


def test_sync_wait_returns_when_another_thread_stops_the_consumer(url: str, names: Names) -> None:
    queue = names.queue()
    with Connection(url) as conn:
        conn.channel().queue_declare(queue)
        consumer = conn.consumer(queue, lambda message: None)
        consumer.start()
        with pytest.raises(Timeout):
            consumer.wait(timeout=0.2)
        stopper = threading.Timer(0.5, consumer.stop)
        stopper.start()
        assert consumer.wait(timeout=DEADLINE) is None
        stopper.join()


def test_sync_wait_returns_the_cancel_when_the_broker_cancels_without_resubscribe(
    url: str, names: Names
) -> None:
    queue = names.queue()
    with Connection(url) as conn:
        channel = conn.channel()
        channel.queue_declare(queue)
        consumer = conn.consumer(queue, lambda message: None, resubscribe=False)
        consumer.start()
        channel.queue_delete(queue)
        assert isinstance(consumer.wait(timeout=DEADLINE), ConsumerCancelled)
        consumer.stop()


def test_run_takes_a_coroutine_object_too(url: str) -> None:
    async def main() -> int:
        async with AsyncConnection(url):
            return 7

    assert rabbitry.run(main()) == 7


def test_run_refuses_bad_options_before_running_anything() -> None:
    async def main() -> None:
        raise AssertionError("must not run")

    with pytest.raises(rabbitry.ConfigurationError, match="close_timeout"):
        rabbitry.run(main(), close_timeout=0)  # the coroutine is closed, not left unawaited
    with pytest.raises(rabbitry.ConfigurationError, match="signals: 12345"):
        rabbitry.run(main, signals=[12345])
    with pytest.raises(rabbitry.ConfigurationError, match="main"):
        rabbitry.run(42)  # type: ignore[call-overload]


async def test_wait_and_wait_closed_outlast_a_recovery(url: str, names: Names) -> None:

    params = parse_urls(url)[0]
    queue = names.queue()
    with TcpProxy(params.host, params.port) as proxy:
        conn = AsyncConnection(proxy.url(), recovery=RecoveryPolicy(initial_delay=0.1))
        await conn.connect()
        try:
            await (await conn.channel()).queue_declare(queue)
            consumer = conn.consumer(queue, _noop)
            await consumer.start()
            states: list[State] = []
            conn.on_state_change(lambda state, cause: states.append(state))
            waiters = [
                asyncio.ensure_future(consumer.wait()),
                asyncio.ensure_future(conn.wait_closed()),
            ]
            proxy.reset()
            for _ in range(int(DEADLINE / 0.01)):
                if states[-1:] == [State.OPEN]:
                    break
                await asyncio.sleep(0.01)
            assert states == [State.RECOVERING, State.OPEN]
            assert not any(w.done() for w in waiters)  # a recovery is not an end
        finally:
            await conn.close()
        consumer_reason, conn_reason = await asyncio.wait_for(asyncio.gather(*waiters), DEADLINE)
    assert isinstance(consumer_reason, rabbitry.ConnectionClosedByClient)
    assert isinstance(conn_reason, rabbitry.ConnectionClosedByClient)

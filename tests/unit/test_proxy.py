"""Tests for the fault-injection proxy in tests/support, against a local echo server."""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING

import pytest
from tests.support.proxy import Direction, TcpProxy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# Every blocking socket call in these tests gives up after this long, so a proxy bug
# shows up as a failed assertion rather than a hung test run.
IO_TIMEOUT = 2.0
# How long to listen for data that should *not* arrive.
QUIET = 0.3

pytestmark = pytest.mark.timeout(20)


class EchoServer:
    """A threaded TCP echo server that also records what it receives.

    Each accepted connection gets a thread that echoes everything back. ``push()``
    sends unsolicited data to every connected client, so tests can tell the two
    directions apart.
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self.received = bytearray()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closing = threading.Event()
        self._acceptor = threading.Thread(target=self._accept, name="echo-accept", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(0.05)
            thread = threading.Thread(target=self._echo, args=(conn,), name="echo", daemon=True)
            with self._lock:
                self._conns.append(conn)
                self._threads.append(thread)
            thread.start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            while not self._closing.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not data:
                    break
                with self._lock:
                    self.received += data
                try:
                    conn.sendall(data)
                except OSError:
                    break
            with self._lock:
                self._conns.remove(conn)

    def push(self, data: bytes) -> None:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            conn.sendall(data)

    def connection_count(self) -> int:
        with self._lock:
            return len(self._conns)

    def close(self) -> None:
        self._closing.set()
        self._acceptor.join(IO_TIMEOUT)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(IO_TIMEOUT)
        self._listener.close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", echo.port) as p:
        yield p


def connect(proxy: TcpProxy) -> socket.socket:
    sock = socket.create_connection((proxy.host, proxy.port), timeout=IO_TIMEOUT)
    sock.settimeout(IO_TIMEOUT)
    return sock


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise EOFError(f"EOF after {len(buf)} of {size} bytes")
        buf += chunk
    return bytes(buf)


def recv_until_closed(sock: socket.socket) -> tuple[bytes, str]:
    """Read until the peer goes away; return the data and how it ended."""
    buf = bytearray()
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(buf), "reset"
        if not chunk:
            return bytes(buf), "eof"
        buf += chunk


def connect_and_drain(proxy: TcpProxy) -> str:
    """Connect, expect no data, and report how the proxy got rid of the connection."""
    try:
        sock = connect(proxy)
    except ConnectionResetError:
        # The proxy can accept and reset before connect() has even returned.
        return "reset"
    with sock:
        data, how = recv_until_closed(sock)
    assert data == b""
    return how


def assert_silent(sock: socket.socket) -> None:
    """Assert nothing arrives on ``sock`` for a while (the connection stays open)."""
    sock.settimeout(QUIET)
    try:
        with pytest.raises(TimeoutError):
            sock.recv(65536)
    finally:
        sock.settimeout(IO_TIMEOUT)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + IO_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_forwards_both_directions_and_counts(proxy: TcpProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"hello")
        assert recv_exactly(sock, 5) == b"hello"
        assert proxy.bytes_upstream == 5
        assert proxy.bytes_downstream == 5
        assert proxy.connections == 1
        assert proxy.active_connections == 1
    wait_for(lambda: proxy.active_connections == 0, "the closed connection to be dropped")


def test_url_points_at_proxy(proxy: TcpProxy) -> None:
    assert proxy.url() == f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2f"
    assert (
        proxy.url("us er", "p@ss", "vh", heartbeat=2)
        == f"amqp://us%20er:p%40ss@127.0.0.1:{proxy.port}/vh?heartbeat=2"
    )


def test_blackhole_then_resume(proxy: TcpProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"one")
        assert recv_exactly(sock, 3) == b"one"

        proxy.blackhole()
        sock.sendall(b"lost")
        assert_silent(sock)
        assert bytes(echo.received) == b"one"
        assert proxy.active_connections == 1

        proxy.resume()
        sock.sendall(b"two")
        # What was sent during the black-hole is gone, not delayed.
        assert recv_exactly(sock, 3) == b"two"
        assert bytes(echo.received) == b"onetwo"


def test_blackhole_holds_back_eof(proxy: TcpProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"x")
        assert recv_exactly(sock, 1) == b"x"
        proxy.blackhole()
        sock.shutdown(socket.SHUT_WR)
        time.sleep(QUIET)
        assert echo.connection_count() == 1
        proxy.resume()
        wait_for(lambda: echo.connection_count() == 0, "the EOF to reach the server")
        assert recv_until_closed(sock) == (b"", "eof")


def test_drop_upstream_only(proxy: TcpProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        wait_for(lambda: echo.connection_count() == 1, "the proxy to connect upstream")
        proxy.drop("upstream")
        sock.sendall(b"ignored")
        assert_silent(sock)
        assert bytes(echo.received) == b""

        echo.push(b"news")
        assert recv_exactly(sock, 4) == b"news"

        proxy.drop("upstream", enabled=False)
        sock.sendall(b"ok")
        assert recv_exactly(sock, 2) == b"ok"


def test_drop_downstream_only(proxy: TcpProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        wait_for(lambda: echo.connection_count() == 1, "the proxy to connect upstream")
        proxy.drop("downstream")
        sock.sendall(b"seen")
        wait_for(lambda: bytes(echo.received) == b"seen", "the server to get the data")
        echo.push(b"unseen")
        assert_silent(sock)
        assert proxy.bytes_downstream == 0

        proxy.resume()
        sock.sendall(b"back")
        assert recv_exactly(sock, 4) == b"back"


def test_hold_downstream_keeps_data_until_release(proxy: TcpProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        wait_for(lambda: echo.connection_count() == 1, "the proxy to connect upstream")
        proxy.hold("downstream")
        sock.sendall(b"up")
        wait_for(lambda: bytes(echo.received) == b"up", "the server to get the data")
        echo.push(b"held-")
        echo.push(b"in-order")
        assert_silent(sock)
        assert proxy.bytes_downstream == 0

        proxy.release("downstream")
        assert recv_exactly(sock, 15) == b"upheld-in-order"  # the echo first


def test_heal_releases_a_hold(proxy: TcpProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        wait_for(lambda: echo.connection_count() == 1, "the proxy to connect upstream")
        proxy.hold("downstream")
        echo.push(b"later")
        assert_silent(sock)
        proxy.heal()
        assert recv_exactly(sock, 5) == b"later"


def test_drop_rejects_unknown_direction(proxy: TcpProxy) -> None:
    with pytest.raises(ValueError, match="direction"):
        proxy.drop("sideways")  # type: ignore[arg-type]


def test_reset_aborts_connections(proxy: TcpProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"hi")
        assert recv_exactly(sock, 2) == b"hi"
        assert proxy.reset() == 1
        data, how = recv_until_closed(sock)
        assert data == b""
        assert how in ("reset", "eof")
    wait_for(lambda: proxy.active_connections == 0, "the link to be torn down")
    wait_for(lambda: echo.connection_count() == 0, "the server side to be reset too")

    # The proxy itself keeps working for new connections.
    with connect(proxy) as sock:
        sock.sendall(b"again")
        assert recv_exactly(sock, 5) == b"again"


def test_refuse_new_connections(proxy: TcpProxy) -> None:
    proxy.refuse(True)
    assert connect_and_drain(proxy) in ("reset", "eof")
    assert proxy.connections == 1
    assert proxy.active_connections == 0

    proxy.refuse(False)
    with connect(proxy) as sock:
        sock.sendall(b"in")
        assert recv_exactly(sock, 2) == b"in"
    assert proxy.connections == 2


def test_refuse_leaves_existing_connections_alone(proxy: TcpProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"a")
        assert recv_exactly(sock, 1) == b"a"
        proxy.refuse(True)
        sock.sendall(b"b")
        assert recv_exactly(sock, 1) == b"b"


def test_latency_delays_each_direction(proxy: TcpProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"warm")
        assert recv_exactly(sock, 4) == b"warm"

        proxy.latency(0.25)
        started = time.monotonic()
        sock.sendall(b"slow")
        sock.sendall(b"er")
        assert recv_exactly(sock, 6) == b"slower"
        # Only a lower bound: the round trip crosses the proxy twice. No upper bound,
        # since a loaded CI machine can always be slower.
        assert time.monotonic() - started >= 0.45

        proxy.latency(0)
        sock.sendall(b"fast")
        assert recv_exactly(sock, 4) == b"fast"


def test_bandwidth_throttles(proxy: TcpProxy) -> None:
    payload = bytes(range(256)) * 2
    with connect(proxy) as sock:
        proxy.bandwidth(1000)
        started = time.monotonic()
        sock.sendall(payload)
        assert recv_exactly(sock, len(payload)) == payload
        # 512 bytes at 1000 B/s takes about half a second per direction; the two
        # directions overlap, so only claim a bit less than one of them.
        assert time.monotonic() - started >= 0.4

        proxy.bandwidth(None)
        sock.sendall(payload)
        assert recv_exactly(sock, len(payload)) == payload


def test_cut_after_downstream_mid_stream(proxy: TcpProxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(b"12")
        assert recv_exactly(sock, 2) == b"12"

        proxy.cut_after(3)
        sock.sendall(b"abcdef")
        data, how = recv_until_closed(sock)
        assert data == b"abc"
        assert how in ("reset", "eof")
    assert proxy.bytes_downstream == 5
    wait_for(lambda: proxy.active_connections == 0, "the cut link to be torn down")

    # The cut fires once; later connections are unaffected.
    with connect(proxy) as sock:
        sock.sendall(b"abcdef")
        assert recv_exactly(sock, 6) == b"abcdef"


def test_cut_after_upstream(proxy: TcpProxy, echo: EchoServer) -> None:
    with connect(proxy) as sock:
        proxy.cut_after(2, direction="upstream")
        sock.sendall(b"xyz")
        data, how = recv_until_closed(sock)
        assert how in ("reset", "eof")
        assert data in (b"", b"x", b"xy")
    wait_for(lambda: echo.connection_count() == 0, "the server side to be reset")
    assert bytes(echo.received) in (b"", b"x", b"xy")
    assert proxy.bytes_upstream == 2


def test_tap_sees_forwarded_chunks(proxy: TcpProxy) -> None:
    seen: dict[Direction, bytearray] = {"upstream": bytearray(), "downstream": bytearray()}
    threads: set[str] = set()

    def record(direction: Direction, data: bytes) -> None:
        seen[direction] += data
        threads.add(threading.current_thread().name)

    proxy.tap(record)
    with connect(proxy) as sock:
        sock.sendall(b"tapped")
        assert recv_exactly(sock, 6) == b"tapped"
        assert bytes(seen["upstream"]) == b"tapped"
        assert bytes(seen["downstream"]) == b"tapped"
        assert threads == {f"TcpProxy-{proxy.port}"}

        proxy.tap(None)
        sock.sendall(b"quiet")
        assert recv_exactly(sock, 5) == b"quiet"
        assert bytes(seen["upstream"]) == b"tapped"


def test_tap_can_drive_faults_and_errors_are_kept(proxy: TcpProxy) -> None:
    # Calling control methods from the proxy thread must not deadlock.
    def blackhole_on_marker(direction: Direction, data: bytes) -> None:
        if direction == "upstream" and b"!" in data:
            proxy.blackhole()
        if b"boom" in data:
            raise RuntimeError("tap failure")

    proxy.tap(blackhole_on_marker)
    with connect(proxy) as sock:
        sock.sendall(b"boom")
        assert recv_exactly(sock, 4) == b"boom"
        sock.sendall(b"!")
        assert_silent(sock)
    assert [str(e) for e in proxy.tap_errors] == ["tap failure", "tap failure"]


def test_unreachable_target_resets_client() -> None:
    probe = socket.create_server(("127.0.0.1", 0))
    dead_port = probe.getsockname()[1]
    probe.close()
    with TcpProxy("127.0.0.1", dead_port) as proxy:
        assert connect_and_drain(proxy) in ("reset", "eof")


def test_heal_clears_faults(proxy: TcpProxy) -> None:
    proxy.blackhole()
    proxy.drop("downstream")
    proxy.latency(5)
    proxy.bandwidth(1)
    proxy.cut_after(0)
    proxy.refuse(True)
    proxy.heal()
    with connect(proxy) as sock:
        sock.sendall(b"healthy")
        assert recv_exactly(sock, 7) == b"healthy"


def test_stop_and_restart_on_same_port(echo: EchoServer) -> None:
    proxy = TcpProxy("127.0.0.1", echo.port).start()
    try:
        port = proxy.port
        with connect(proxy) as sock:
            sock.sendall(b"1")
            assert recv_exactly(sock, 1) == b"1"
            proxy.stop()
            assert recv_until_closed(sock)[0] == b""
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT).close()

        proxy.start()
        assert proxy.port == port
        with connect(proxy) as sock:
            sock.sendall(b"2")
            assert recv_exactly(sock, 1) == b"2"
    finally:
        proxy.stop()
    proxy.stop()  # idempotent


def test_stop_leaves_no_threads(echo: EchoServer) -> None:
    # Compare thread objects, not counts, so threads that other tests left behind and
    # that happen to finish meanwhile cannot confuse the check.
    before = set(threading.enumerate())
    # A host name target goes through the loop's resolver thread pool, which stop()
    # has to shut down as well.
    proxy = TcpProxy("localhost", echo.port)
    with proxy:
        socks = [connect(proxy) for _ in range(3)]
        for sock in socks:
            sock.sendall(b"ping")
            assert recv_exactly(sock, 4) == b"ping"
        assert set(threading.enumerate()) - before
    assert not [t for t in threading.enumerate() if t.name.startswith("TcpProxy")]
    for sock in socks:
        assert recv_until_closed(sock)[0] == b""
        sock.close()
    # The echo server's per-connection threads end once the proxy has hung up on them.
    wait_for(lambda: not set(threading.enumerate()) - before, "new threads to wind down")


def test_start_twice_is_an_error(proxy: TcpProxy) -> None:
    with pytest.raises(RuntimeError, match="already running"):
        proxy.start()


def test_port_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not been started"):
        _ = TcpProxy("127.0.0.1", 1).port

"""The cluster tier's workload and checker, in the ``rabbitmq/jepsen`` ``total-queue`` style.

Every message body is a unique integer id. A publish ends *confirmed* (broker ack),
*nacked* (sent again with backoff by the publisher's ``nack_retry``; counted), or
*unknown* (no outcome by the end). Consumers record every id they see. The checker then
reports:

* lost = confirmed - delivered (must be 0);
* unexpected = delivered - attempted (must be 0);
* duplicates = sum(count - 1) over delivered ids (allowed, counted);
* recovered = unknown but delivered.

:class:`Stalls` records when confirms arrive, so a test can ask how long confirms
stopped around a fault.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rabbitry import AsyncConnection
from rabbitry.recovery import NackRetry, RecoveryPolicy, State
from rabbitry.topology import Queue, Topology

if TYPE_CHECKING:
    from pathlib import Path

    from rabbitry.message import Message
    from rabbitry.publisher import AsyncPublisher

#: Reconnect fast: a cluster client has other nodes to go to.
FAST_RECOVERY = RecoveryPolicy(initial_delay=0.05, max_delay=1.0, jitter=0.2)
#: The publisher re-sends what a leaderless quorum queue nacks, with this backoff
#: (50 ms doubling to 0.5 s; attempts enough for an election of more than 10 s).
NACK_RETRY = NackRetry(max_attempts=40, initial_delay=0.05, max_delay=0.5, jitter=0.2)


async def connect(urls: list[str], name: str) -> AsyncConnection:
    conn = AsyncConnection(
        urls,
        recovery=FAST_RECOVERY,
        heartbeat=5,
        connection_timeout=3,
        connection_name=name,
    )
    await conn.connect()
    return conn


async def declare_quorum(conn: AsyncConnection, name: str, **options: Any) -> Queue:
    """Declare a quorum queue through the topology model (so recovery re-declares it)."""
    queue = Queue(name, queue_type="quorum", **options)
    await Topology(queues=[queue]).aapply(conn)
    return queue


@dataclass
class Checker:
    attempted: set[int] = field(default_factory=set)
    confirmed: set[int] = field(default_factory=set)
    delivered: Counter[int] = field(default_factory=Counter)
    nacks: int = 0
    redelivered: int = 0

    def lost(self) -> set[int]:
        return self.confirmed - set(self.delivered)

    def unexpected(self) -> set[int]:
        return set(self.delivered) - self.attempted

    def duplicates(self) -> int:
        return sum(n - 1 for n in self.delivered.values())

    def unknown(self) -> set[int]:
        return self.attempted - self.confirmed

    def recovered(self) -> int:
        return len(self.unknown() & set(self.delivered))

    def record(self, message: Message) -> None:
        self.delivered[int(message.body)] += 1
        if message.redelivered:
            self.redelivered += 1

    def summary(self) -> dict[str, int]:
        return {
            "attempted": len(self.attempted),
            "confirmed": len(self.confirmed),
            "delivered": len(self.delivered),
            "lost": len(self.lost()),
            "unexpected": len(self.unexpected()),
            "duplicates": self.duplicates(),
            "recovered": self.recovered(),
            "unknown": len(self.unknown()),
            "nacks": self.nacks,
            "redelivered": self.redelivered,
        }


class Stalls:
    """How long confirms stopped coming while messages were outstanding.

    A *gap* is the wait for a confirm, counted from the previous confirm or from the
    moment the publisher had something outstanding again, whichever is later; idle time
    (nothing unconfirmed) is never a stall.
    """

    #: A fault's stall is the longest gap ending within this many seconds after it.
    WINDOW = 10.0

    def __init__(self) -> None:
        self.gaps: list[tuple[float, float]] = []  # (confirm time, gap)
        self.faults: list[tuple[str, float]] = []
        self._last = time.monotonic()
        self._busy_since = self._last

    def busy(self) -> None:
        """The publisher went from nothing outstanding to something outstanding."""
        self._busy_since = time.monotonic()

    def confirmed(self) -> None:
        now = time.monotonic()
        self.gaps.append((now, now - max(self._last, self._busy_since)))
        self._last = now

    def fault(self, what: str) -> None:
        self.faults.append((what, time.monotonic()))

    def max_gap(self, start: float, end: float) -> float:
        return max((gap for t, gap in self.gaps if start < t <= end), default=0.0)

    def per_fault(self) -> list[tuple[str, float]]:
        """Each fault with its stall: the longest gap ending in the WINDOW after it."""
        return [(what, round(self.max_gap(at, at + self.WINDOW), 3)) for what, at in self.faults]

    def overall(self) -> float:
        return max((gap for _, gap in self.gaps), default=0.0)


class Trace:
    """A time-stamped log of a soak's operations, to explain a failed check: who
    published each id and when its outcome came, every dequeue's outcome with its node
    and channel, what each drain found. One dict per event; an id, if any, under "id"."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self.events: list[dict[str, Any]] = []

    def add(self, kind: str, **fields: Any) -> None:
        self.events.append({"t": round(time.monotonic() - self._t0, 3), "kind": kind, **fields})

    def about(self, n: int) -> list[dict[str, Any]]:
        """The events of id ``n``."""
        return [e for e in self.events if e.get("id") == n]

    def dump(self, path: Path) -> None:
        """Write the log as JSON lines."""
        path.write_text("".join(json.dumps(e, default=repr) + "\n" for e in self.events))


class Publishing:
    """Publishes ids on ``publisher`` (made with ``nack_retry=NACK_RETRY``, so nacks
    are re-sent by the publisher itself) and records each outcome (also in ``trace``,
    if given, as coming from ``client``)."""

    def __init__(
        self,
        publisher: AsyncPublisher,
        queue: str,
        checker: Checker,
        stalls: Stalls,
        trace: Trace | None = None,
        client: int | None = None,
    ) -> None:
        self.trace = trace
        self.client = client
        self.publisher = publisher
        self.queue = queue
        self.checker = checker
        self.stalls = stalls
        self.pending: set[asyncio.Future[None]] = set()
        #: Publishes that failed for good (a Nacked after every retry, a timeout...).
        self.errors: list[BaseException] = []

    async def publish(self, n: int) -> None:
        self.checker.attempted.add(n)
        if self.trace is not None:
            self.trace.add("publish", id=n, client=self.client)
        future = await self.publisher.send(str(n).encode(), routing_key=self.queue, persistent=True)
        if not self.pending:
            self.stalls.busy()
        self.pending.add(future)
        future.add_done_callback(lambda f: self._settled(f, n))

    def _settled(self, future: asyncio.Future[None], n: int) -> None:
        self.pending.discard(future)
        if future.cancelled():
            return
        exc = future.exception()
        if self.trace is not None:
            outcome = "confirmed" if exc is None else repr(exc)
            self.trace.add("outcome", id=n, client=self.client, outcome=outcome)
        if exc is None:
            self.checker.confirmed.add(n)
            self.stalls.confirmed()
        else:
            self.errors.append(exc)

    async def settle(self, timeout: float) -> None:
        """Wait until nothing is pending (or ``timeout``); then count the nack re-sends."""
        deadline = time.monotonic() + timeout
        while self.pending and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.checker.nacks += self.publisher.nack_resends


async def publish_paced(publishing: Publishing, ids: range, rate: float | None = None) -> None:
    """Publish ``ids`` in order, at most ``rate`` per second (as fast as allowed if None)."""
    start = time.monotonic()
    for i, n in enumerate(ids):
        if rate is not None and (ahead := start + i / rate - time.monotonic()) > 0:
            await asyncio.sleep(ahead)
        await publishing.publish(n)


async def consume_into(
    conn: AsyncConnection, queue: str, checker: Checker, prefetch: int = 200
) -> Any:
    """A started manual-ack consumer recording every id into ``checker``."""

    async def handler(message: Message) -> None:
        checker.record(message)

    consumer = conn.consumer(queue, handler, prefetch=prefetch, concurrency=1)
    await consumer.start()
    return consumer


async def wait_delivered(checker: Checker, timeout: float) -> None:
    """Wait until every confirmed id was delivered (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while checker.lost() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


def track_states(conn: AsyncConnection) -> list[State]:
    states: list[State] = []
    conn.on_state_change(lambda state, _exc: states.append(state))
    return states

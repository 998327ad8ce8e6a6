"""Model-based fault test: random sequences of the public API, interleaved with faults.

A hypothesis ``RuleBasedStateMachine`` drives the synchronous API (channel declares,
binds, ``basic_consume``, ``consume()`` iterators (one of them acking every Nth
message or record with ``multiple=True``), ``Topology.apply``, publishers with and
without confirms, a batching publisher's envelopes, ``conn.consumer(...)`` in both ack
modes, acks, nacks, cancels)
over a connection that goes through the fault proxy to a throw-away node, and injects
faults between the steps: TCP resets, forced closes, blackholes shorter than the
heartbeat, publishes cut by a reset, and (in the restart variant) node restarts.

A model of what was declared, bound, consumed and published runs beside it. It checks

* after every step: the connection is not CLOSED, recovery reported nothing it could
  not restore, and the broker cancelled none of our consumers;
* after every fault: every queue and exchange of the model exists (a missing one is a
  failure, and says whether recovery reported it), every live consumer receives a
  message published after recovery, and every binding routes a message to its queue;
* at the end: every confirmed message that the broker owed us (below) was delivered
  at least once (lost = 0), nothing arrived that was never published (unexpected = 0),
  and the example left no thread or TCP socket behind.

A confirmed message is *owed* when it was routed to at least one queue that keeps
messages across a connection loss: a named queue that is neither exclusive nor
auto-delete, was not deleted by the test, had no auto-ack consumer at any time after
the publish (at-most-once: an auto-ack delivery lost on the wire is gone), and, if the node
restarted after the publish, is durable (messages are persistent). Messages in
exclusive, auto-delete or auto-acked queues may be lost by a fault and are not counted.

The seed comes from ``RABBITRY_MODEL_SEED`` (random when unset) and is printed, and
named in the failure message, so a failing run can be replayed. ``make soak`` sets
``RABBITRY_MODEL_SOAK_MINUTES`` and runs the machine, seed after seed, that long.

The proxy's ``blackhole()`` discards bytes (a real network delays them, TCP resends), so
a blackhole in the middle of a delivery corrupts the stream rather than delaying it; the
machine blackholes a connection only once no message is waiting for a live consumer.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, Phase, assume, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from tests.faults.helpers import FAST
from tests.support.checker import Checker
from tests.support.leaks import leaked, snapshot
from tests.support.proxy import TcpProxy

import rabbitry
from rabbitry import AMQPError, Binding, Message, Queue, State, Topology
from rabbitry.batching import decode_records, is_envelope
from rabbitry.protocol import spec

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.support.node import BrokerNode

pytestmark = pytest.mark.xdist_group("model")

SEED_ENV = "RABBITRY_MODEL_SEED"
SOAK_ENV = "RABBITRY_MODEL_SOAK_MINUTES"
EXAMPLES_ENV = "RABBITRY_MODEL_EXAMPLES"  # examples per round of the main test
SHRINK_ENV = "RABBITRY_MODEL_SHRINK"  # "0": report a failure as found, without shrinking
#: A generous deadline for anything that must eventually happen; it only fails a hang.
WAIT = 20.0
HEARTBEAT = 5
KEYS = ("a", "b")


def _eventually(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# ---------------------------------------------------------------------- the model


@dataclass(eq=False)
class ModelExchange:
    name: str
    type: str

    def __repr__(self) -> str:
        return f"<{self.type} exchange {self.name}>"


@dataclass(eq=False)
class ModelQueue:
    key: str
    name: str  # the broker's current name: a server-named queue is renamed by recovery
    kind: str  # "named", "server_named_exclusive" or "auto_delete"
    durable: bool
    deleted: bool = False
    # Auto-ack consumers on it now, and the last message (index into the sends) that one
    # could have taken: those are at-most-once.
    auto_ack_live: int = 0
    auto_acked_up_to: int = -1
    had_consumer: bool = False

    @property
    def keeps_messages(self) -> bool:
        """Survives a connection loss with its messages (not exclusive, not auto-delete)."""
        return self.kind == "named"

    def __repr__(self) -> str:
        return f"<{self.kind} queue {self.key}>"


@dataclass(eq=False)
class ModelBinding:
    queue: ModelQueue
    exchange: ModelExchange
    key: str

    def routes(self, exchange: str, key: str) -> bool:
        if self.exchange.name != exchange:
            return False
        return self.exchange.type == "fanout" or self.key == key

    def __repr__(self) -> str:
        return f"<binding {self.exchange.name} -[{self.key}]-> {self.queue.key}>"


@dataclass(eq=False)
class ModelConsumer:
    key: str
    queue: ModelQueue
    kind: str  # "callback_ack", "callback_nack_then_ack", "callback_auto_ack",
    # "consumer_manual" or "consumer_auto"
    tag: str = ""
    consumer: Any = None  # a rabbitry.sync.Consumer for the consumer_* kinds
    got: list[str] = field(default_factory=list)  # accepted (acked, or auto-acked)
    arrived: list[str] = field(default_factory=list)  # every delivery, nacked ones too

    def __repr__(self) -> str:
        return f"<{self.kind} consumer {self.key} of {self.queue.key}>"


@dataclass
class Sent:
    index: int  # the order of publishes
    routes: tuple[ModelQueue, ...]
    restarts: int  # node restarts before the publish


@dataclass
class Totals:
    """Figures over every example of one test (printed at the end; in the soak docs)."""

    examples: int = 0
    steps: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    recoveries: int = 0
    attempted: int = 0
    confirmed: int = 0
    owed: int = 0
    delivered: int = 0
    lost: int = 0
    unexpected: int = 0
    duplicates: int = 0
    failed: int = 0
    unconfirmed: int = 0

    def line(self) -> str:
        faults = ", ".join(f"{k}={v}" for k, v in sorted(self.faults.items())) or "none"
        return (
            f"examples={self.examples} steps={self.steps} faults[{faults}] "
            f"recoveries={self.recoveries} messages attempted={self.attempted} "
            f"confirmed={self.confirmed} owed={self.owed} delivered={self.delivered} "
            f"failed={self.failed} unconfirmed={self.unconfirmed} lost={self.lost} "
            f"unexpected={self.unexpected} duplicates={self.duplicates}"
        )


@dataclass
class World:
    """What outlives one example: the node and the proxy."""

    node: BrokerNode
    proxy: TcpProxy
    restarts: bool
    run: str
    totals: Totals = field(default_factory=Totals)
    examples: int = 0


class FaultModel(RuleBasedStateMachine):
    """One example: one connection through the proxy, a model of it, and the checks."""

    world: World  # set on a subclass per test

    exchanges = Bundle("exchanges")
    queues = Bundle("queues")
    bindings = Bundle("bindings")
    consumers = Bundle("consumers")

    def __init__(self) -> None:
        super().__init__()
        world = self.world
        world.examples += 1
        self.prefix = f"rabbitry-model-{world.run}-{world.examples}"
        self.before = snapshot()
        self.lock = threading.Lock()
        self.checker = Checker()
        self.sent: dict[str, Sent] = {}
        self.seen_in: dict[str, set[str]] = {}
        self.model_exchanges: list[ModelExchange] = []
        self.model_queues: list[ModelQueue] = []
        self.model_bindings: list[ModelBinding] = []
        self.live: list[ModelConsumer] = []
        self.counter = 0
        self.unconfirmed = 0  # fire-and-forget publishes: no outcome to check
        self.restarts = 0
        self.steps = 0
        self.faults: Counter[str] = Counter()
        self.opens = 0
        self.last_state: State | None = None
        self.renames: list[tuple[str, str]] = []
        self.recovery_errors: list[tuple[str, str, AMQPError]] = []
        self.broker_cancels: list[str] = []
        self.admin_channel: rabbitry.Channel | None = None

        name = f"{self.prefix}-conn"
        conn = rabbitry.Connection(
            world.proxy.url(), connection_name=name, heartbeat=HEARTBEAT, recovery=FAST
        )
        conn.on_state_change(self._on_state)
        conn.on_queue_renamed(self._on_renamed)
        conn.on_recovery_error(
            lambda kind, what, exc: self.recovery_errors.append((kind, what, exc))
        )
        conn.connect(timeout=WAIT)
        self.last_state = State.OPEN
        self.conn = conn
        self.ch = conn.channel()  # declares, binds, basic_get
        self.consumer_ch = conn.channel()  # basic_consume callbacks
        self.iterator_ch = conn.channel()  # consume() iterators
        self.confirm_ch = conn.channel()  # raw publishes with confirm_select
        self.confirm_ch.confirm_select()
        self.plain_ch = conn.channel()  # raw publishes without confirms
        self.publisher = conn.publisher(republish_unconfirmed=True, timeout=WAIT)
        # Straight to the node, never through the proxy: probes, checks, the final drain.
        self.admin = rabbitry.Connection(
            world.node.url, connection_name=f"{self.prefix}-admin", recovery=FAST
        )
        self.admin.connect(timeout=WAIT)
        self.probe_publisher = self.admin.publisher(timeout=WAIT)

    # ------------------------------------------------------------------ callbacks

    def _on_state(self, state: State, cause: BaseException | None) -> None:
        with self.lock:
            self.last_state = state
            if state is State.OPEN:
                self.opens += 1

    def _on_renamed(self, old: str, new: str) -> None:
        with self.lock:
            self.renames.append((old, new))
            for queue in self.model_queues:
                if queue.name == old:
                    queue.name = new

    def _delivered(self, message: Message, queue: ModelQueue, who: ModelConsumer | None) -> None:
        for mid in _mids(message):
            with self.lock:
                self.checker.deliver(mid, message.redelivered)
                self.seen_in.setdefault(queue.key, set()).add(mid)
                if who is not None:
                    who.got.append(mid)
                    if who.consumer is not None:  # the raw callbacks note arrivals themselves
                        who.arrived.append(mid)

    # ------------------------------------------------------------------ helpers

    def _name(self, what: str) -> str:
        self.counter += 1
        return f"{self.prefix}-{what}{self.counter}"

    def _routes(self, exchange: str, key: str) -> tuple[ModelQueue, ...]:
        if exchange == "":
            return tuple(q for q in self.model_queues if not q.deleted and q.name == key)
        found: list[ModelQueue] = []
        for binding in self.model_bindings:
            if binding.routes(exchange, key) and binding.queue not in found:
                found.append(binding.queue)
        return tuple(found)

    def _new_message(self, exchange: str, key: str) -> str:
        mid = f"{self.prefix}-m{len(self.sent)}"
        self.sent[mid] = Sent(len(self.sent), self._routes(exchange, key), self.restarts)
        self.checker.attempt(mid)
        return mid

    def _settle(self, mid: str, future: Any) -> None:
        try:
            future.result(WAIT)
        except (AMQPError, TimeoutError) as exc:
            self.checker.fail(mid, exc)
        else:
            self.checker.confirm(mid)

    def _publish_confirmed(self, via: str, exchange: str, key: str, count: int) -> None:
        pending = []
        for _ in range(count):
            mid = self._new_message(exchange, key)
            if via == "publisher":
                future = self.publisher.publish(
                    mid.encode(), exchange=exchange, routing_key=key, persistent=True
                )
            else:
                properties = spec.BasicProperties(delivery_mode=2, message_id=mid)
                future = self.confirm_ch.basic_publish(
                    exchange, key, mid.encode(), properties=properties
                )
            pending.append((mid, future))
        for mid, future in pending:
            self._settle(mid, future)

    def _probe(self, exchange: str, key: str) -> str:
        """A confirmed message through the direct admin connection (no proxy, no faults)."""
        mid = self._new_message(exchange, key)
        self._settle(
            mid,
            self.probe_publisher.publish(
                mid.encode(), exchange=exchange, routing_key=key, persistent=True
            ),
        )
        return mid

    def _consumers_of(self, queue: ModelQueue) -> list[ModelConsumer]:
        return [c for c in self.live if c.queue is queue]

    def _after_cancel(self, queue: ModelQueue) -> None:
        # The broker deletes an auto-delete queue when its last consumer goes away.
        if queue.kind == "auto_delete" and queue.had_consumer and not self._consumers_of(queue):
            self._forget_queue(queue)

    def _forget_queue(self, queue: ModelQueue) -> None:
        queue.deleted = True
        self.model_bindings = [b for b in self.model_bindings if b.queue is not queue]

    def _settled(self) -> None:
        """Wait until the connection is OPEN and its callbacks (renames) have run."""
        self.conn.wait_recovered(WAIT)
        assert _eventually(lambda: self.last_state is State.OPEN), (
            f"the state callbacks never reported OPEN again (last {self.last_state})"
        )

    def _wait_for_recovery(self, opens_before: int) -> None:
        assert _eventually(lambda: self.opens > opens_before), (
            f"no recovery after the fault: state {self.conn.state}, last seen {self.last_state}"
        )
        self._settled()

    def _admin(self) -> rabbitry.Channel:
        if self.admin_channel is None or not self.admin_channel.is_open:
            self.admin.wait_recovered(WAIT)
            self.admin_channel = self.admin.channel()
        return self.admin_channel

    def _exists(self, declare: Callable[[rabbitry.Channel], object]) -> bool:
        try:
            declare(self._admin())
        except rabbitry.NotFound:
            return False
        except rabbitry.ResourceLocked:
            return True  # an exclusive queue of the connection under test: it exists
        return True

    def _reported(self, name: str) -> bool:
        return any(name in what for _, what, _ in self.recovery_errors)

    # ------------------------------------------------------------------ post-fault checks

    def _check_entities_exist(self, after: str) -> None:
        missing = []
        for exchange in self.model_exchanges:
            if not self._exists(lambda ch, x=exchange: ch.exchange_declare(x.name, passive=True)):
                missing.append(repr(exchange))
        for queue in self.model_queues:
            if queue.deleted:
                continue
            if not self._exists(lambda ch, q=queue: ch.queue_declare(q.name, passive=True)):
                reported = "reported" if self._reported(queue.name) else "NOT reported"
                missing.append(f"{queue!r} ({queue.name}, {reported})")
        assert not missing, f"missing after {after} and state {self.conn.state}: {missing}"

    def _probe_until(self, exchange: str, key: str, arrived: Callable[[set[str]], bool]) -> bool:
        """Publish a probe now and then until ``arrived(probes)`` holds, or give up."""
        probes: set[str] = set()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            probes.add(self._probe(exchange, key))
            if _eventually(lambda: arrived(probes), timeout=1.0):
                return True
        return arrived(probes)

    def _fetch_until(self, queue: ModelQueue, probes: set[str]) -> bool:
        """basic_get from a queue without consumers until one of ``probes`` comes out."""
        while True:
            message = self.ch.basic_get(queue.name, timeout=WAIT)
            if message is None:
                return False
            self._delivered(message, queue, None)
            message.ack()
            if message.body.decode() in probes:
                return True

    def _check_flows(self, after: str) -> None:
        """Every live consumer gets a new message, and every binding routes."""
        for consumer in list(self.live):
            start = len(consumer.arrived)

            def got_one(probes: set[str], c: ModelConsumer = consumer, n: int = start) -> bool:
                with self.lock:
                    return any(mid in probes for mid in c.arrived[n:])

            assert self._probe_until("", consumer.queue.name, got_one), (
                f"{consumer!r} received nothing published after {after} "
                f"(queue {consumer.queue.name}, tag {consumer.tag})"
            )
        for binding in list(self.model_bindings):
            queue = binding.queue
            if self._consumers_of(queue):

                def seen(probes: set[str], q: ModelQueue = queue) -> bool:
                    with self.lock:
                        return bool(probes & self.seen_in.get(q.key, set()))

                routed = self._probe_until(binding.exchange.name, binding.key, seen)
            else:
                routed = self._fetch_until(queue, {self._probe(binding.exchange.name, binding.key)})
            assert routed, f"{binding!r} does not route after {after} (queue {queue.name})"

    def _after_fault(self, fault: str) -> None:
        self.faults[fault] += 1
        self._check_entities_exist(fault)
        self._check_flows(fault)

    # ------------------------------------------------------------------ topology rules

    @rule(target=exchanges, type=st.sampled_from(["direct", "fanout"]))
    def declare_exchange(self, type: str) -> ModelExchange:
        exchange = ModelExchange(self._name("x"), type)
        self.ch.exchange_declare(exchange.name, type, durable=self.world.restarts)
        self.model_exchanges.append(exchange)
        return exchange

    @rule(
        target=queues,
        kind=st.sampled_from(["named", "server_named_exclusive", "named", "auto_delete"]),
        durable=st.booleans(),
    )
    def declare_queue(self, kind: str, durable: bool) -> ModelQueue:
        key = self._name("q")
        if kind == "server_named_exclusive":
            name = self.ch.queue_declare("", exclusive=True).queue
            queue = ModelQueue(key, name, kind, durable=False)
        else:
            auto_delete = kind == "auto_delete"
            durable = durable and not auto_delete
            self.ch.queue_declare(key, durable=durable, auto_delete=auto_delete)
            queue = ModelQueue(key, key, kind, durable)
        self.model_queues.append(queue)
        return queue

    @rule(target=queues, exchange=exchanges, key=st.sampled_from(KEYS))
    def apply_topology(self, exchange: ModelExchange, key: str) -> ModelQueue:
        """``Topology.apply``: a durable queue and its binding to an existing exchange."""
        name = self._name("q")
        Topology(queues=[Queue(name)], bindings=[Binding(exchange.name, name, key)]).apply(
            self.conn, timeout=WAIT
        )
        queue = ModelQueue(name, name, "named", durable=True)
        self.model_queues.append(queue)
        self.model_bindings.append(ModelBinding(queue, exchange, key))
        return queue

    @rule(target=bindings, queue=queues, exchange=exchanges, key=st.sampled_from(KEYS))
    def bind(self, queue: ModelQueue, exchange: ModelExchange, key: str) -> ModelBinding:
        assume(not queue.deleted)
        self.ch.queue_bind(queue.name, exchange.name, key)
        binding = ModelBinding(queue, exchange, key)
        if not any(
            b.queue is queue and b.exchange is exchange and b.key == key
            for b in self.model_bindings
        ):
            self.model_bindings.append(binding)
        return binding

    @rule(binding=consumes(bindings))
    def unbind(self, binding: ModelBinding) -> None:
        assume(not binding.queue.deleted)
        self.ch.queue_unbind(binding.queue.name, binding.exchange.name, binding.key)
        self.model_bindings = [
            b
            for b in self.model_bindings
            if not (
                b.queue is binding.queue and b.exchange is binding.exchange and b.key == binding.key
            )
        ]

    @rule(queue=consumes(queues))
    def delete_queue(self, queue: ModelQueue) -> None:
        assume(not queue.deleted and not self._consumers_of(queue))
        self.ch.queue_delete(queue.name)
        self._forget_queue(queue)

    # ------------------------------------------------------------------ consumer rules

    @rule(
        target=consumers,
        queue=queues,
        settle=st.sampled_from(["ack", "nack_then_ack", "auto_ack"]),
    )
    def basic_consume(self, queue: ModelQueue, settle: str) -> ModelConsumer:
        assume(not queue.deleted)
        consumer = ModelConsumer(self._name("c"), queue, f"callback_{settle}")

        def on_message(message: Message) -> None:
            with self.lock:
                consumer.arrived.extend(_mids(message))
            if settle == "nack_then_ack" and not message.redelivered:
                with contextlib.suppress(AMQPError, rabbitry.InvalidStateError):
                    message.nack(requeue=True)  # comes back redelivered, then acked
                return
            self._delivered(message, queue, consumer)
            if settle != "auto_ack":
                with contextlib.suppress(AMQPError, rabbitry.InvalidStateError):
                    message.ack()

        consumer.tag = self.consumer_ch.basic_consume(
            queue.name,
            on_message,
            no_ack=settle == "auto_ack",
            on_cancel=self.broker_cancels.append,
        )
        self._started(consumer)
        return consumer

    @rule(target=consumers, queue=queues, ack=st.sampled_from(["manual", "auto"]))
    def start_consumer(self, queue: ModelQueue, ack: str) -> ModelConsumer:
        """``conn.consumer(...)``: a handler on a pool thread, acked by the library."""
        assume(not queue.deleted)
        model = ModelConsumer(self._name("c"), queue, f"consumer_{ack}")

        def handle(message: Message) -> None:
            self._delivered(message, queue, model)

        model.consumer = self.conn.consumer(
            queue.name,
            handle,
            ack="manual" if ack == "manual" else "auto",
            prefetch=20,
            on_cancel=self.broker_cancels.append,
        )
        model.consumer.start(timeout=WAIT)
        model.tag = model.consumer.consumer_tag or ""
        self._started(model)
        return model

    def _started(self, consumer: ModelConsumer) -> None:
        consumer.queue.had_consumer = True
        if consumer.kind in ("callback_auto_ack", "consumer_auto"):
            consumer.queue.auto_ack_live += 1
        self.live.append(consumer)

    @rule(consumer=consumes(consumers))
    def cancel(self, consumer: ModelConsumer) -> None:
        if consumer.consumer is not None:
            consumer.consumer.stop(timeout=WAIT)
        else:
            self.consumer_ch.basic_cancel(consumer.tag)
        self.live.remove(consumer)
        if consumer.kind in ("callback_auto_ack", "consumer_auto"):
            consumer.queue.auto_ack_live -= 1
            consumer.queue.auto_acked_up_to = len(self.sent) - 1
        self._after_cancel(consumer.queue)

    @rule(queue=queues, take=st.integers(min_value=0, max_value=3))
    def iterate(self, queue: ModelQueue, take: int) -> None:
        """A ``consume()`` iterator: ends after ``take`` messages, on a nack, or on timeout."""
        assume(not queue.deleted)
        queue.had_consumer = True
        taken = 0
        for message in self.iterator_ch.consume(queue.name, prefetch=5, timeout=0.3):
            if taken == take:
                message.nack(requeue=True)  # abandoned early: handed back
                break
            self._delivered(message, queue, None)
            message.ack()
            taken += 1
        self._after_cancel(queue)

    @rule(queue=queues, every=st.integers(min_value=2, max_value=4))
    def iterate_acking_every_nth(self, queue: ModelQueue, every: int) -> None:
        """A ``consume()`` iterator that acks every Nth message or batch record with
        ``multiple=True`` (the usual loop), then the last one it took the same way."""
        assume(not queue.deleted)
        queue.had_consumer = True
        last: Message | None = None
        handed = 0
        for message in self.iterator_ch.consume(queue.name, prefetch=5, timeout=0.3):
            self._delivered(message, queue, None)
            handed += 1
            last = message
            if handed % every == 0:
                message.ack(multiple=True)
                last = None
        if last is not None:
            with contextlib.suppress(AMQPError, rabbitry.InvalidStateError):
                last.ack(multiple=True)
        self._after_cancel(queue)

    @rule(queue=queues, fault=st.sampled_from(["reset", "forced_close"]))
    def abandon_iterator_in_outage(self, queue: ModelQueue, fault: str) -> None:
        """A ``consume()`` iterator dropped while the connection is down.

        Recovery must not subscribe it again: afterwards the queue has exactly the
        model's live consumers (a resurrected one would hold messages nobody reads).
        """
        # Alone on a named queue, so the probe below reaches this iterator.
        assume(not queue.deleted and queue.kind == "named" and not self._consumers_of(queue))
        queue.had_consumer = True
        opens = self.opens
        iterator = self.iterator_ch.consume(queue.name, prefetch=5, timeout=WAIT)
        # A generator subscribes on its first step: a probe gives it one message.
        self._probe("", queue.name)
        message = next(iterator)
        self._delivered(message, queue, None)
        message.ack()
        self._break(fault)
        iterator.close()  # abandoned while the connection is down or recovering
        self._wait_for_recovery(opens)
        live = len(self._consumers_of(queue))
        assert _eventually(
            lambda: self._admin().queue_declare(queue.name, passive=True).consumer_count == live
        ), (
            f"{queue!r}: {self._admin().queue_declare(queue.name, passive=True).consumer_count}"
            f" consumer(s) after recovery, the model has {live}"
        )
        self._after_fault(f"abandon_iterator_{fault}")

    @rule(queue=queues)
    def close_from_another_thread(self, queue: ModelQueue) -> None:
        """A second connection is closed while a thread publishes through it.

        Closing settles everything: the publishing thread ends (no call hangs) and every
        future it got is settled, confirmed or failed with the reason.
        """
        assume(not queue.deleted)
        side = rabbitry.Connection(
            self.world.proxy.url(), connection_name=f"{self.prefix}-side", recovery=FAST
        )
        side.connect(timeout=WAIT)
        publisher = side.publisher(timeout=WAIT)
        futures: list[tuple[str, Any]] = []
        started = threading.Event()
        errors: list[BaseException] = []

        def produce() -> None:
            try:
                for _ in range(5000):  # bounded; close() comes long before
                    mid = self._new_message("", queue.name)
                    future = publisher.publish(
                        mid.encode(), routing_key=queue.name, persistent=True
                    )
                    futures.append((mid, future))
                    started.set()
            except AMQPError as exc:  # the publisher is closed: the end of the loop
                errors.append(exc)
                started.set()

        thread = threading.Thread(target=produce, name=f"{self.prefix}-producer")
        thread.start()
        assert started.wait(WAIT)
        side.close(timeout=5)
        thread.join(WAIT)
        assert not thread.is_alive(), "a publish() still blocks after close() returned"
        assert errors, "publish() kept succeeding on a closed connection"
        for mid, future in futures:
            assert future.done(), f"{mid}: future still pending after close()"
            self._settle(mid, future)
        # The attempt that raised in the loop never got a future: it was refused.
        self.checker.fail(f"{self.prefix}-m{len(self.sent) - 1}", errors[0])
        self._after_fault("close_from_another_thread")

    # At most once per example: hypothesis favours rules without arguments, and each
    # of these costs several CLI calls.
    @precondition(lambda self: not self.faults["vhost_deleted"])
    @rule()
    def vhost_deleted_under_a_second_connection(self) -> None:
        """A connection whose virtual host is deleted gives up at once, with the cause.

        It must not stay RECOVERING, retrying something no retry can heal; the model's
        own connection, on another virtual host, is not touched.
        """
        node = self.world.node
        vhost = self._name("vhost")
        node.ctl("add_vhost", vhost)
        node.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        side = rabbitry.Connection(
            self.world.proxy.url(vhost=vhost),
            connection_name=f"{self.prefix}-vhost",
            recovery=FAST,
        )
        side.connect(timeout=WAIT)
        try:
            side.channel().queue_declare(self._name("vq"))
            node.ctl("delete_vhost", vhost)
            assert _eventually(lambda: side.state is State.CLOSED), (
                f"still {side.state} after its virtual host was deleted"
            )
            assert isinstance(side.close_exc, AMQPError), side.close_exc
        finally:
            side.close(timeout=5)
        self._after_fault("vhost_deleted")

    @precondition(lambda self: not self.faults["resource_alarm"])
    @rule(queue=queues, count=st.integers(min_value=1, max_value=10))
    def publish_through_a_resource_alarm(self, queue: ModelQueue, count: int) -> None:
        """Confirmed publishes while a memory alarm blocks the node's publishers.

        The connection is blocked, not broken: no recovery, and once the alarm clears
        every publish is confirmed and owed like any other.
        """
        assume(not queue.deleted)
        node = self.world.node
        opens = self.opens
        pending = [self._new_message("", queue.name) for _ in range(count)]
        futures: list[Any] = []

        def produce() -> None:
            # After the first publish the broker blocks the connection: the rest wait
            # in publish() (the publisher's own deadline is WAIT) until it clears.
            for mid in pending:
                futures.append(
                    self.publisher.publish(mid.encode(), routing_key=queue.name, persistent=True)
                )

        node.set_alarm("memory")
        thread = threading.Thread(target=produce, name=f"{self.prefix}-blocked")
        try:
            thread.start()
            assert _eventually(lambda: self.conn.is_blocked), "connection.blocked never came"
        finally:
            node.clear_alarm("memory")
        thread.join(WAIT)
        assert not thread.is_alive(), "publish() still waits after the alarm cleared"
        for mid, future in zip(pending, futures, strict=True):
            self._settle(mid, future)
        assert self.opens == opens, "a resource alarm made the connection reconnect"
        self._after_fault("resource_alarm")

    # ------------------------------------------------------------------ publish rules

    @rule(
        exchange=exchanges,
        key=st.sampled_from(KEYS),
        count=st.integers(min_value=1, max_value=20),
        via=st.sampled_from(["publisher", "raw_channel"]),
    )
    def publish_to_exchange(self, exchange: ModelExchange, key: str, count: int, via: str) -> None:
        self._publish_confirmed(via, exchange.name, key, count)

    @rule(
        queue=queues,
        count=st.integers(min_value=1, max_value=20),
        via=st.sampled_from(["publisher", "raw_channel"]),
    )
    def publish_to_queue(self, queue: ModelQueue, count: int, via: str) -> None:
        assume(not queue.deleted)
        self._publish_confirmed(via, "", queue.name, count)

    @rule(
        queue=queues,
        count=st.integers(min_value=1, max_value=12),
        size=st.integers(min_value=2, max_value=5),
    )
    def publish_batched(self, queue: ModelQueue, count: int, size: int) -> None:
        """Records in envelopes of ``size`` through a ``BatchingPublisher`` over the
        publisher; each record owed like a message once its envelope is confirmed."""
        assume(not queue.deleted)
        batching = rabbitry.BatchingPublisher(
            self.publisher, batch_records=size, linger=30, persistent=True
        )
        pending = []
        for _ in range(count):
            mid = self._new_message("", queue.name)
            pending.append((mid, batching.publish(mid.encode(), routing_key=queue.name)))
        batching.flush()
        for mid, future in pending:
            self._settle(mid, future)
        batching.close()

    @rule(queue=queues, count=st.integers(min_value=1, max_value=5))
    def publish_without_confirms(self, queue: ModelQueue, count: int) -> None:
        """Fire-and-forget on a raw channel: attempted, never owed."""
        assume(not queue.deleted)
        for _ in range(count):
            mid = self._new_message("", queue.name)
            self.plain_ch.basic_publish("", queue.name, mid.encode())
            self.unconfirmed += 1

    # ------------------------------------------------------------------ fault rules

    # Weighted by repetition: a forced close costs a CLI call (0.5-2 s on a loaded box),
    # a reset or a blackhole almost nothing. Shrinking goes towards the first, a reset.
    @rule(fault=st.sampled_from(["reset", "blackhole", "reset", "forced_close"]))
    def inject(self, fault: str) -> None:
        """A fault between two steps; then everything must be back and flowing."""
        if fault == "blackhole":
            self._short_blackhole()
        else:
            opens = self.opens
            self._break(fault)
            self._wait_for_recovery(opens)
        self._after_fault(fault)

    def _break(self, fault: str) -> None:
        if fault == "reset":
            assert self.world.proxy.reset() >= 1
        else:
            name = self.conn.params.connection_name or ""
            closed = self.world.node.close_connection_by_name(name, "model-based test")
            assert closed == 1, closed

    def _short_blackhole(self) -> None:
        """Shorter than the heartbeat: the connection must ride it out."""
        for queue in {c.queue for c in self.live}:
            if queue.kind == "server_named_exclusive":
                continue  # not visible to the admin connection; probes catch a stall
            assert _eventually(
                lambda q=queue: self._admin().queue_declare(q.name, passive=True).message_count == 0
            ), f"{queue!r} keeps ready messages although it has live consumers"
        self.world.proxy.blackhole()
        time.sleep(HEARTBEAT / 5)
        self.world.proxy.resume()
        self._settled()

    @rule(queue=queues, fault=st.sampled_from(["reset", "reset", "forced_close"]))
    def publish_through_fault(self, queue: ModelQueue, fault: str) -> None:
        """Forty confirmed publishes, the connection broken after the twentieth."""
        assume(not queue.deleted)
        opens = self.opens
        pending = []
        for i in range(40):
            if i == 20:
                self._break(fault)
            mid = self._new_message("", queue.name)
            future = self.publisher.publish(mid.encode(), routing_key=queue.name, persistent=True)
            pending.append((mid, future))
        for mid, future in pending:
            self._settle(mid, future)
        self._wait_for_recovery(opens)
        self._after_fault(f"publish_through_{fault}")

    @precondition(lambda self: self.world.restarts and self.restarts == 0)
    @rule()
    def restart_node(self) -> None:
        """A graceful node restart (at most one per example: it takes 5-10 s)."""
        opens = self.opens
        self.world.node.restart()
        self.restarts += 1
        self._wait_for_recovery(opens)
        self.admin.wait_recovered(WAIT)
        self._after_fault("node_restart")

    # ------------------------------------------------------------------ invariants

    @invariant()
    def nothing_lost_silently(self) -> None:
        self.steps += 1
        assert self.conn.state is not State.CLOSED, f"connection closed: {self.conn.close_exc!r}"
        assert not self.recovery_errors, f"recovery could not restore: {self.recovery_errors}"
        assert not self.broker_cancels, f"the broker cancelled consumers: {self.broker_cancels}"

    # ------------------------------------------------------------------ the end

    def teardown(self) -> None:
        world = self.world
        failure: BaseException | None = None
        try:
            world.proxy.heal()
            if self.conn.state is not State.CLOSED:
                self._settled()
                self._after_fault("end")
                self.faults["end"] -= 1
        except BaseException as exc:  # the end checks failed: still clean up, then raise
            failure = exc
        try:
            self._close_and_account()
        finally:
            self._delete_everything()
        if failure is not None:
            raise failure
        self._final_checks()
        problem = leaked(self.before)
        assert problem is None, f"the example leaked: {problem}"

    def _close_and_account(self) -> None:
        for consumer in self.live:
            if consumer.consumer is not None:
                with contextlib.suppress(AMQPError, rabbitry.InvalidStateError):
                    consumer.consumer.stop(timeout=WAIT)
        with contextlib.suppress(AMQPError, rabbitry.InvalidStateError):
            self.publisher.close(timeout=WAIT)
        self.probe_publisher.close(timeout=WAIT)
        self.conn.close(timeout=5)  # unacked deliveries go back to their queues
        for queue in self.model_queues:
            if queue.deleted or queue.kind == "server_named_exclusive":
                continue
            while True:
                try:
                    message = self._admin().basic_get(queue.name, timeout=WAIT)
                except rabbitry.NotFound:
                    break  # an auto-delete queue that lost its last consumer
                if message is None:
                    break
                self._delivered(message, queue, None)
                message.ack()

    def _delete_everything(self) -> None:
        for queue in self.model_queues:
            if queue.kind != "server_named_exclusive":
                with contextlib.suppress(AMQPError):
                    self._admin().queue_delete(queue.name, timeout=WAIT)
        for exchange in self.model_exchanges:
            with contextlib.suppress(AMQPError):
                self._admin().exchange_delete(exchange.name, timeout=WAIT)
        self.admin.close(timeout=5)

    def _owed(self, mid: str) -> bool:
        sent = self.sent[mid]
        restarted = self.restarts > sent.restarts

        def keeps(q: ModelQueue) -> bool:
            auto_acked = q.auto_ack_live > 0 or q.auto_acked_up_to >= sent.index
            return q.keeps_messages and not q.deleted and not auto_acked

        return any(keeps(q) and (q.durable or not restarted) for q in sent.routes)

    def _final_checks(self) -> None:
        checker = self.checker
        owed = {mid for mid in checker.confirmed if self._owed(mid)}
        lost = owed - checker.delivered.keys()
        totals = self.world.totals
        totals.examples += 1
        totals.steps += self.steps
        totals.faults.update(+self.faults)
        totals.recoveries += self.opens
        totals.attempted += len(checker.attempted)
        totals.confirmed += len(checker.confirmed)
        totals.owed += len(owed)
        totals.delivered += len(checker.delivered)
        totals.failed += len(checker.failed)
        totals.unconfirmed += self.unconfirmed
        totals.lost += len(lost)
        totals.unexpected += len(checker.unexpected)
        totals.duplicates += checker.duplicates
        where = {mid: [q.key for q in self.sent[mid].routes] for mid in sorted(lost)[:5]}
        assert not lost, f"lost {len(lost)} confirmed messages: {where} ({checker.summary()})"
        assert not checker.unexpected, f"unexpected: {sorted(checker.unexpected)[:5]}"


# ---------------------------------------------------------------------- the tests


def _mids(message: Message) -> list[str]:
    """The message ids a delivery carries: its body, or each record of a batch envelope."""
    if is_envelope(message):
        return [record.decode() for record in decode_records(message.body)]
    return [message.body.decode()]


def _seed() -> int:
    raw = os.environ.get(SEED_ENV)
    return int(raw) if raw else secrets.randbits(32)


def _soak_seconds() -> float | None:
    raw = os.environ.get(SOAK_ENV)
    return float(raw) * 60 if raw else None


#: pytest-timeout's limit: the soak time plus room for a failure's shrinking (hypothesis
#: stops shrinking after five minutes).
TIMEOUT = int((_soak_seconds() or 0) + 900)


def _phases() -> tuple[Phase, ...]:
    if os.environ.get(SHRINK_ENV) == "0":
        return (Phase.explicit, Phase.reuse, Phase.generate)
    return tuple(Phase)


def _run(world: World, *, examples: int, steps: int, share: float) -> None:
    """Run the machine: one round in ``make test``; in a soak, rounds until time is up."""
    base = _seed()
    soak = _soak_seconds()
    deadline = None if soak is None else time.monotonic() + soak * share
    print(f"\nmodel: seed {base} (replay with {SEED_ENV}={base})")
    round_ = 0
    while True:
        seed = base + round_
        # A subclass per round: hypothesis reads the seed from the machine's class.
        machine = hypothesis_seed(seed)(type("FaultModelRun", (FaultModel,), {"world": world}))
        try:
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=examples,
                    stateful_step_count=steps,
                    deadline=None,
                    database=None,
                    print_blob=True,
                    suppress_health_check=list(HealthCheck),
                    phases=_phases(),
                ),
            )
        except BaseException as exc:
            exc.add_note(f"model: replay with {SEED_ENV}={seed}; so far {world.totals.line()}")
            raise
        round_ += 1
        print(f"model: round {round_} (seed {seed}): {world.totals.line()}")
        if deadline is None or time.monotonic() >= deadline:
            break
    print(f"model: total {world.totals.line()}")
    assert world.totals.lost == 0 and world.totals.unexpected == 0, world.totals.line()


@pytest.mark.timeout(TIMEOUT)
def test_random_api_sequences_under_faults_lose_nothing(
    broker_node: BrokerNode,
) -> None:
    with TcpProxy("127.0.0.1", broker_node.port) as proxy:
        world = World(broker_node, proxy, False, uuid.uuid4().hex[:6])
        _run(
            world,
            examples=int(os.environ.get(EXAMPLES_ENV, "12")),
            steps=25,
            share=0.8,
        )


@pytest.mark.timeout(TIMEOUT)
def test_random_api_sequences_with_node_restarts_lose_nothing(
    fresh_node: BrokerNode,
) -> None:
    """Durable entities and persistent messages across graceful node restarts too."""
    with TcpProxy("127.0.0.1", fresh_node.port) as proxy:
        world = World(fresh_node, proxy, True, uuid.uuid4().hex[:6])
        _run(world, examples=3, steps=12, share=0.2)

"""Applying, verifying and deleting a topology on a connection (the async engine side).

Each operation runs on a channel of its own that it opens and closes, so a broker
error (which closes the channel it happened on) never touches the application's
channels, and the connection stays usable. After an error the next step gets a fresh
channel.

What is declared is added to ``connection.topology_record`` as soon as the broker
confirms it, and what is deleted is removed from it, so automatic recovery replays the
application's current wishes.

A 406 on a declaration becomes a :class:`~rabbitry.TopologyConflict` in :mod:`._conflicts`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Literal

from ..aio._declare import bind_described, declare_described_exchange, declare_described_queue
from ..exceptions import (
    ChannelClosedByBroker,
    ConfigurationError,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
    TopologyError,
    TopologyMissingExchange,
)
from ..record import RecordedBinding, RecordedExchange, RecordedQueue, TopologyRecord
from ._base import T, TopologyData
from ._conflicts import conflict_error, parse_inequivalent, value_from_reply
from ._model import Binding, Exchange, Queue, is_reserved
from ._policy import Policy
from ._session import Session, missing_entities

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..aio.connection import AsyncConnection

__all__ = [
    "ApplyResult",
    "VerifyReport",
    "apply_topology",
    "check_policies",
    "check_references",
    "delete_topology",
    "missing_entities",
    "parse_inequivalent",
    "value_from_reply",
    "verify_topology",
]


logger = logging.getLogger("rabbitry.topology")

#: What ``missing_exchanges=`` accepts.
MissingExchanges = Literal["error", "warn"]

# --------------------------------------------------------------------------- results


@dataclass(frozen=True, eq=False)
class ApplyResult(Generic[T]):
    """What ``Topology.apply`` declared.

    Attributes:
        topology: the topology as declared: server-named queues carry the names the
            broker assigned, and bindings to them use those names.
        queue_names: the declared queue names, in the order of ``topology.queues``.
        message_counts: ready messages per queue name, from queue.declare-ok.
    """

    topology: T
    queue_names: tuple[str, ...]
    message_counts: Mapping[str, int]
    _original: tuple[Queue, ...] = field(repr=False, default=())

    def name_of(self, queue: Queue | str) -> str:
        """The declared name of ``queue``.

        Args:
            queue: the ``Queue`` object given to the topology, or its name.

        Returns:
            The name it was declared with (the broker's, for a server-named queue).

        Raises:
            KeyError: the queue was not part of the applied topology.
        """
        for index, original in enumerate(self._original):
            if original is queue or (isinstance(queue, str) and queue and original.name == queue):
                return self.queue_names[index]
        if isinstance(queue, Queue) and queue.name:
            return self.name_of(queue.name)
        raise KeyError(f"{queue!r} was not part of the applied topology")


@dataclass(frozen=True)
class VerifyReport:
    """What ``Topology.verify`` found with passive declares.

    Attributes:
        missing: exchanges, queues and (checked through the management API) policies
            that do not exist.
        present: exchanges, queues and policies that exist (arguments are not compared:
            a passive declare does not return them; use ``diff`` against a definitions
            export).
        unchecked: what cannot be checked over AMQP: bindings (there is no passive bind),
            server-named queues (their name is not known before they are declared) and
            policies when no management client was given.
        message_counts: ready messages per present queue.
        policy_differences: policies that exist with another pattern, apply-to, priority
            or definition (one line per difference).
        dangling: alternate and dead-letter exchanges the topology names that exist
            neither in it nor on the broker, as ``(entity, field, exchange)``.
    """

    missing: tuple[Exchange | Queue | Policy, ...]
    present: tuple[Exchange | Queue | Policy, ...]
    unchecked: tuple[Binding | Queue | Policy, ...]
    message_counts: Mapping[str, int]
    policy_differences: tuple[str, ...] = ()
    dangling: tuple[tuple[str, str, str], ...] = ()

    @property
    def ok(self) -> bool:
        """Nothing is missing or different."""
        return not self.missing and not self.policy_differences and not self.dangling

    def __bool__(self) -> bool:
        return self.ok

    def lines(self) -> list[str]:
        """One readable line per missing entity or policy difference."""
        return (
            [f"{item.label}: missing" for item in self.missing]
            + [
                f"{entity}: {what} {exchange!r} does not exist"
                for entity, what, exchange in self.dangling
            ]
            + list(self.policy_differences)
        )

    def __str__(self) -> str:
        if self.ok:
            if any(isinstance(item, Policy) for item in self.present):
                return f"all {len(self.present)} exchanges, queues and policies exist"
            return f"all {len(self.present)} exchanges and queues exist"
        return "\n".join(self.lines())


# --------------------------------------------------------------------------- channel


def _record_of(connection: AsyncConnection) -> TopologyRecord:
    record: TopologyRecord = connection.topology_record
    return record


def recorded_exchange(x: Exchange) -> RecordedExchange:
    """The record entry for a declared exchange."""
    return RecordedExchange(
        x.name, x.type, x.durable, x.auto_delete, x.internal, x.declare_arguments()
    )


def recorded_queue(q: Queue, name: str) -> RecordedQueue:
    """The record entry for a declared queue (``name``: the name it got)."""
    return RecordedQueue(
        name, q.durable, q.exclusive, q.auto_delete, q.declare_arguments(), q.server_named
    )


def recorded_binding(b: Binding, destination: str) -> RecordedBinding:
    """The record entry for a binding (``destination``: the resolved name)."""
    return RecordedBinding(
        b.source, destination, b.routing_key, dict(b.arguments or {}), b.destination_type
    )


# --------------------------------------------------------------------------- apply

_PASSIVE = " (an amq.* name: checked with a passive declare, not declared)"


async def apply_topology(
    topology: T,
    connection: AsyncConnection,
    *,
    timeout: float | None = None,
    missing_exchanges: MissingExchanges = "error",
) -> ApplyResult[T]:
    """Declare exchanges, then queues, then bindings; record each. See ``Topology.aapply``."""
    await check_references(topology, connection, missing_exchanges, timeout)
    record = _record_of(connection)
    session = Session(connection, timeout)
    assigned: list[str] = []
    counts: dict[str, int] = {}
    try:
        for x in topology.exchanges:
            arguments = x.declare_arguments()
            channel = await session.channel()
            reserved = is_reserved(x.name)
            described = recorded_exchange(x)
            try:
                await declare_described_exchange(
                    channel, described, passive=reserved, timeout=timeout
                )
            except PreconditionFailed as exc:
                raise await conflict_error(session, x, arguments, exc) from exc
            except ChannelClosedByBroker as exc:
                exc.add_note(f"while declaring {x.label}{_PASSIVE if reserved else ''}")
                raise
            if not reserved:  # the broker's own: it exists, nothing to replay
                record.add_exchange(described)
        for q in topology.queues:
            arguments = q.declare_arguments()
            channel = await session.channel()
            reserved = is_reserved(q.name)
            try:
                reply = await declare_described_queue(
                    channel, recorded_queue(q, q.name), passive=reserved, timeout=timeout
                )
            except PreconditionFailed as exc:
                raise await conflict_error(session, q, arguments, exc) from exc
            except ChannelClosedByBroker as exc:
                exc.add_note(f"while declaring {q.label}{_PASSIVE if reserved else ''}")
                raise
            assigned.append(reply.queue)
            counts[reply.queue] = reply.message_count
            if not reserved:  # amq.gen-*: recorded when it was declared as server-named
                record.add_queue(recorded_queue(q, reply.queue))
        resolved_bindings = []
        for b in topology.bindings:
            destination = _resolve(b, topology.queues, assigned)
            channel = await session.channel()
            described_binding = recorded_binding(b, destination)
            try:
                await bind_described(channel, described_binding, timeout=timeout)
            except ChannelClosedByBroker as exc:
                exc.add_note(f"while declaring {_label(b, destination)}")
                raise
            record.add_binding(described_binding)
            resolved_bindings.append(
                Binding(
                    b.source,
                    destination,
                    b.routing_key,
                    arguments=b.arguments,
                    destination_type=b.destination_type,
                )
            )
    finally:
        await session.close()
    resolved_queues = [
        q if q.name else _renamed(q, assigned[i]) for i, q in enumerate(topology.queues)
    ]
    return ApplyResult(
        type(topology)(topology.exchanges, resolved_queues, resolved_bindings, topology.policies),
        tuple(assigned),
        counts,
        topology.queues,
    )


def _renamed(queue: Queue, name: str) -> Queue:
    from dataclasses import replace

    return replace(queue, name=name)


def _resolve(binding: Binding, queues: tuple[Queue, ...], assigned: list[str]) -> str:
    target = binding.destination
    if isinstance(target, Queue):
        for index, queue in enumerate(queues):
            if queue is target:
                return assigned[index]
        raise TopologyError(f"{binding.label}: its server-named queue was not declared")
    return target


def _label(binding: Binding, destination: str) -> str:
    target = f"{binding.destination_type} {destination!r}"
    return f"binding {binding.source!r} -> {target} (routing key {binding.routing_key!r})"


# --------------------------------------------------------------------------- existence


def _references(topology: TopologyData) -> list[tuple[str, str, str]]:
    """``(entity, field, exchange)`` for every alternate / dead-letter exchange named
    by ``topology`` and not declared by it (the default exchange ``""`` excluded)."""
    declared = {x.name for x in topology.exchanges}
    found: list[tuple[str, str, str]] = []

    def add(entity: str, what: str, value: object) -> None:
        if isinstance(value, str) and value and value not in declared:
            found.append((entity, what, value))

    for x in topology.exchanges:
        add(x.label, "alternate_exchange", x.declare_arguments().get("alternate-exchange"))
    for q in topology.queues:
        add(q.label, "dead_letter_exchange", q.declare_arguments().get("x-dead-letter-exchange"))
    for p in topology.policies:
        definition = p.definition or {}
        add(p.label, "alternate-exchange", definition.get("alternate-exchange"))
        add(p.label, "dead-letter-exchange", definition.get("dead-letter-exchange"))
    return found


async def check_references(
    topology: TopologyData,
    connection: AsyncConnection,
    missing_exchanges: MissingExchanges,
    timeout: float | None,
) -> tuple[tuple[str, str, str], ...]:
    """Check that every alternate / dead-letter exchange the topology names exists.

    Exchanges the topology declares itself count as existing; the others are checked
    with passive declares. With ``missing_exchanges="error"`` a dangling one raises
    :class:`TopologyMissingExchange`; with ``"warn"`` it is logged at ERROR and returned.
    """
    if missing_exchanges not in ("error", "warn"):
        raise ConfigurationError(
            f"missing_exchanges: must be 'error' or 'warn', got {missing_exchanges!r}"
        )
    references = _references(topology)
    if not references:
        return ()
    names = list(dict.fromkeys(exchange for _, _, exchange in references))
    absent = {
        name
        for _, name in await missing_entities(
            connection, [("exchange", name) for name in names], timeout
        )
    }
    dangling = tuple(ref for ref in references if ref[2] in absent)
    if dangling and missing_exchanges == "error":
        raise TopologyMissingExchange(dangling)
    for entity, what, exchange in dangling:
        logger.error(
            "%s: %s %r does not exist (not in the topology, not on the broker): messages "
            "sent there are dropped by the broker",
            entity,
            what,
            exchange,
        )
    return dangling


# --------------------------------------------------------------------------- verify


async def verify_topology(
    topology: TopologyData,
    connection: AsyncConnection,
    *,
    timeout: float | None = None,
    missing_exchanges: MissingExchanges = "error",
) -> VerifyReport:
    """Passive-declare every exchange and named queue. See ``Topology.averify``."""
    dangling = await check_references(topology, connection, missing_exchanges, timeout)
    session = Session(connection, timeout)
    missing: list[Exchange | Queue | Policy] = []
    present: list[Exchange | Queue | Policy] = []
    unchecked: list[Binding | Queue | Policy] = []
    counts: dict[str, int] = {}
    try:
        for x in topology.exchanges:
            channel = await session.channel()
            try:
                await channel.exchange_declare(x.name, passive=True, timeout=timeout)
            except NotFound:
                missing.append(x)
            else:
                present.append(x)
        for q in topology.queues:
            if q.server_named:
                unchecked.append(q)
                continue
            channel = await session.channel()
            try:
                reply = await channel.queue_declare(q.name, passive=True, timeout=timeout)
            except NotFound:
                missing.append(q)
            except ResourceLocked:
                present.append(q)  # exists, exclusive to another connection
            else:
                present.append(q)
                counts[q.name] = reply.message_count
    finally:
        await session.close()
    unchecked.extend(topology.bindings)
    unchecked.extend(topology.policies)
    return VerifyReport(tuple(missing), tuple(present), tuple(unchecked), counts, dangling=dangling)


def check_policies(
    topology: TopologyData, report: VerifyReport, found: list[Policy]
) -> VerifyReport:
    """``report`` with the topology's policies checked against ``found`` (the broker's)."""
    from ._diff import diff_topologies

    missing = list(report.missing)
    present = list(report.present)
    theirs = type(topology)(policies=found)
    for policy in topology.policies:
        if theirs.policy(policy.name) is None:
            missing.append(policy)
        else:
            present.append(policy)
    ours = type(topology)(policies=topology.policies)
    differences = [
        line
        for line in diff_topologies(ours, theirs, extra=False)
        if not line.endswith(": missing")
    ]
    unchecked = tuple(item for item in report.unchecked if not isinstance(item, Policy))
    return VerifyReport(
        tuple(missing),
        tuple(present),
        unchecked,
        report.message_counts,
        tuple(differences),
        report.dangling,
    )


# --------------------------------------------------------------------------- delete


async def delete_topology(
    topology: TopologyData, connection: AsyncConnection, *, timeout: float | None = None
) -> None:
    """Unbind, delete queues, delete exchanges; forget each. See ``Topology.adelete``."""
    record = _record_of(connection)
    session = Session(connection, timeout)
    try:
        for b in topology.bindings:
            if isinstance(b.destination, Queue):
                continue  # a server-named queue: pass ApplyResult.topology to delete it
            channel = await session.channel()
            try:
                if b.destination_type == "queue":
                    await channel.queue_unbind(
                        b.destination,
                        b.source,
                        b.routing_key,
                        arguments=b.arguments or None,
                        timeout=timeout,
                    )
                else:
                    await channel.exchange_unbind(
                        b.destination,
                        b.source,
                        b.routing_key,
                        arguments=b.arguments or None,
                        timeout=timeout,
                    )
            except NotFound:
                pass  # its source or destination is gone, and the binding with it
            record.forget_binding(recorded_binding(b, b.destination))
        for q in topology.queues:
            if q.server_named:
                continue
            channel = await session.channel()
            try:
                await channel.queue_delete(q.name, timeout=timeout)
            except NotFound:
                pass
            record.forget_queue(q.name)
        for x in topology.exchanges:
            if is_reserved(x.name):
                continue  # the broker's built-in exchanges cannot be deleted (403)
            channel = await session.channel()
            try:
                await channel.exchange_delete(x.name, timeout=timeout)
            except NotFound:
                pass
            record.forget_exchange(x.name)
    finally:
        await session.close()

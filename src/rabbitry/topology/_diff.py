"""diff: what differs between the topology we want and another one (or the broker's).

The comparison is by what RabbitMQ compares on re-declare: for exchanges the type, the
flags and the arguments; for queues the flags and the arguments; bindings by their full
identity. Integer arguments compare by value whatever their AMQP integer type, as the
broker does. One normalisation: a queue without ``x-queue-type`` and one with
``x-queue-type: classic`` are the same (RabbitMQ accepts either on re-declare).

Lines read ``<entity>: <what>``, e.g.::

    queue 'jobs': x-message-ttl: ours 1000, theirs 2000
    exchange 'events': missing
    binding 'events' -> queue 'jobs' (routing key 'job.*'): missing
    queue 'old': not in ours
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._model import Binding, Exchange, Queue

if TYPE_CHECKING:
    from ._topology import Topology

__all__ = ["diff_topologies"]

_ABSENT = object()


def _show(value: Any) -> str:
    return "(not set)" if value is _ABSENT else repr(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _queue_arguments(queue: Queue) -> dict[str, Any]:
    arguments = queue.declare_arguments()
    if arguments.get("x-queue-type") == "classic":
        del arguments["x-queue-type"]
    return arguments


def _compare(
    label: str,
    ours: dict[str, Any],
    theirs: dict[str, Any],
) -> list[str]:
    lines = []
    for key in list(ours) + [k for k in theirs if k not in ours]:
        a = ours.get(key, _ABSENT)
        b = theirs.get(key, _ABSENT)
        if a is _ABSENT or b is _ABSENT or not _same(a, b):
            lines.append(f"{label}: {key}: ours {_show(a)}, theirs {_show(b)}")
    return lines


def _exchange_view(x: Exchange) -> dict[str, Any]:
    view: dict[str, Any] = {
        "type": x.type,
        "durable": x.durable,
        "auto_delete": x.auto_delete,
        "internal": x.internal,
    }
    view.update(x.declare_arguments())
    return view


def _queue_view(q: Queue) -> dict[str, Any]:
    view: dict[str, Any] = {"durable": q.durable, "auto_delete": q.auto_delete}
    if q.exclusive:
        view["exclusive"] = True
    view.update(_queue_arguments(q))
    return view


def diff_topologies(ours: Topology, theirs: Topology, *, extra: bool = True) -> list[str]:
    """Readable differences; empty when ``theirs`` has everything ``ours`` declares.

    Args:
        ours: the wanted topology.
        theirs: what to compare with (another topology, or what the broker has).
        extra: also list entities that only ``theirs`` has ("not in ours").
    """
    lines: list[str] = []
    for x in ours.exchanges:
        other = theirs.exchange(x.name)
        if other is None:
            lines.append(f"{x.label}: missing")
        else:
            lines += _compare(x.label, _exchange_view(x), _exchange_view(other))
    for q in ours.queues:
        if q.server_named:
            continue  # its name is the broker's choice: nothing to compare it with
        other_q = theirs.queue(q.name)
        if other_q is None:
            lines.append(f"{q.label}: missing")
        else:
            lines += _compare(q.label, _queue_view(q), _queue_view(other_q))
    for b in ours.bindings:
        if isinstance(b.destination, Queue):
            continue
        if not any(b.same_as(o) for o in theirs.bindings):
            lines.append(f"{b.label}: missing")
    if extra:
        lines += _extra(ours, theirs)
    return lines


def _extra(ours: Topology, theirs: Topology) -> list[str]:
    lines = []
    for x in theirs.exchanges:
        if ours.exchange(x.name) is None:
            lines.append(f"{x.label}: not in ours")
    for q in theirs.queues:
        if q.name and ours.queue(q.name) is None:
            lines.append(f"{q.label}: not in ours")
    for b in theirs.bindings:
        if isinstance(b.destination, Queue):
            continue
        if not any(_binding_matches(b, o) for o in ours.bindings):
            lines.append(f"{b.label}: not in ours")
    return lines


def _binding_matches(b: Binding, o: Binding) -> bool:
    return not isinstance(o.destination, Queue) and b.same_as(o)

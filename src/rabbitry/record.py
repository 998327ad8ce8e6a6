"""TopologyRecord: what a connection declared, in order, for recovery to replay.

Every :class:`~rabbitry.AsyncConnection` owns one record (``connection.topology_record``).
``Topology.apply`` adds each exchange, queue and binding to it once the broker has
confirmed the declaration, and ``Topology.delete`` removes them, so that automatic
recovery re-declares exactly what the application still wants, in the order it was
first declared: exchanges, then queues, then bindings.

The record holds plain frozen dataclasses, not :mod:`rabbitry.topology` objects: it sits
below the topology layer and must not import it. Arguments are copied into plain dicts
at recording time.

Theory of operation
-------------------
* Exchanges and queues are keyed by name; recording a name again replaces the entry in
  place (its position in the replay order does not change).
* Bindings are keyed by their full identity (source, destination type, destination,
  routing key, arguments), so two bindings that differ only in arguments (headers
  exchanges) are both kept, and recording the same binding twice keeps one.
* Deleting an exchange or a queue on the broker also deletes its bindings, so forgetting
  one forgets every binding that has it as source or destination.
* A server-named queue gets a new name when it is declared again after a reconnect;
  :meth:`TopologyRecord.rename_queue` moves the entry and the bindings that point at it
  to the new name.

The record is touched only on the event loop (the IO thread for the sync API), so it
needs no lock.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["RecordedBinding", "RecordedExchange", "RecordedQueue", "TopologyRecord"]


@dataclass(frozen=True, slots=True, eq=True)
class RecordedExchange:
    """An exchange as it was declared (``arguments`` include ``alternate-exchange``)."""

    name: str
    type: str = "direct"
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)

    __hash__ = None  # type: ignore[assignment]  # arguments is a dict


@dataclass(frozen=True, slots=True, eq=True)
class RecordedQueue:
    """A queue as it was declared.

    ``name`` is the name in use; for a server-named queue (``server_named``) it is the
    name the broker assigned last, and the queue is re-declared with ``""``.
    """

    name: str
    durable: bool = True
    exclusive: bool = False
    auto_delete: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)
    server_named: bool = False

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True, eq=True)
class RecordedBinding:
    """A binding of ``destination`` (a queue or an exchange) to exchange ``source``."""

    source: str
    destination: str
    routing_key: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    destination_type: str = "queue"

    __hash__ = None  # type: ignore[assignment]

    @property
    def key(self) -> tuple[Any, ...]:
        """The binding's identity: equal keys mean the same binding on the broker."""
        return (
            self.source,
            self.destination_type,
            self.destination,
            self.routing_key,
            _freeze(self.arguments),
        )


def _freeze(value: Any) -> Any:
    """A hashable, order-insensitive stand-in for a field-table value."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return (type(value).__name__, value) if isinstance(value, bool) else value


class TopologyRecord:
    """The ordered record of the exchanges, queues and bindings a connection declared."""

    def __init__(self) -> None:
        self._exchanges: dict[str, RecordedExchange] = {}
        self._queues: dict[str, RecordedQueue] = {}
        self._bindings: dict[tuple[Any, ...], RecordedBinding] = {}

    def __repr__(self) -> str:
        return (
            f"<TopologyRecord exchanges={len(self._exchanges)} queues={len(self._queues)} "
            f"bindings={len(self._bindings)}>"
        )

    def __len__(self) -> int:
        return len(self._exchanges) + len(self._queues) + len(self._bindings)

    def __iter__(self) -> Iterator[RecordedExchange | RecordedQueue | RecordedBinding]:
        """Everything in replay order: exchanges, then queues, then bindings."""
        yield from self._exchanges.values()
        yield from self._queues.values()
        yield from self._bindings.values()

    # ------------------------------------------------------------------ reading

    @property
    def exchanges(self) -> tuple[RecordedExchange, ...]:
        """The recorded exchanges, in declaration order."""
        return tuple(self._exchanges.values())

    @property
    def queues(self) -> tuple[RecordedQueue, ...]:
        """The recorded queues, in declaration order."""
        return tuple(self._queues.values())

    @property
    def bindings(self) -> tuple[RecordedBinding, ...]:
        """The recorded bindings, in declaration order."""
        return tuple(self._bindings.values())

    def exchange(self, name: str) -> RecordedExchange | None:
        """The recorded exchange called ``name``, or ``None``."""
        return self._exchanges.get(name)

    def queue(self, name: str) -> RecordedQueue | None:
        """The recorded queue called ``name``, or ``None``."""
        return self._queues.get(name)

    def bindings_of(self, name: str) -> tuple[RecordedBinding, ...]:
        """The recorded bindings that have ``name`` as source or destination."""
        return tuple(b for b in self._bindings.values() if name in (b.source, b.destination))

    # ------------------------------------------------------------------ writing

    def add_exchange(self, exchange: RecordedExchange) -> None:
        """Record a declared exchange (replaces an entry with the same name in place)."""
        self._exchanges[exchange.name] = _own(exchange)

    def add_queue(self, queue: RecordedQueue) -> None:
        """Record a declared queue (replaces an entry with the same name in place)."""
        self._queues[queue.name] = _own(queue)

    def add_binding(self, binding: RecordedBinding) -> None:
        """Record a binding (a binding with the same identity is kept once)."""
        owned = _own(binding)
        self._bindings[owned.key] = owned

    def forget_exchange(self, name: str) -> None:
        """Forget an exchange and every binding that has it as source or destination."""
        self._exchanges.pop(name, None)
        self._drop_bindings(
            lambda b: (
                b.source == name or (b.destination_type == "exchange" and b.destination == name)
            )
        )

    def forget_queue(self, name: str) -> None:
        """Forget a queue and every binding to it."""
        self._queues.pop(name, None)
        self._drop_bindings(lambda b: b.destination_type == "queue" and b.destination == name)

    def forget_binding(self, binding: RecordedBinding) -> None:
        """Forget one binding (nothing happens if it was not recorded)."""
        self._bindings.pop(binding.key, None)

    def rename_queue(self, old: str, new: str) -> None:
        """A (server-named) queue was declared again and got ``new``: follow it.

        The queue keeps its place in the order; bindings to it point to ``new``.
        """
        if old == new or old not in self._queues:
            return
        self._queues.pop(new, None)  # recorded under its new name already: keep one
        self._queues = {
            (new if name == old else name): (replace(q, name=new) if name == old else q)
            for name, q in self._queues.items()
        }
        bindings: dict[tuple[Any, ...], RecordedBinding] = {}
        for binding in self._bindings.values():
            if binding.destination_type == "queue" and binding.destination == old:
                binding = replace(binding, destination=new)
            bindings[binding.key] = binding
        self._bindings = bindings

    def clear(self) -> None:
        """Forget everything."""
        self._exchanges.clear()
        self._queues.clear()
        self._bindings.clear()

    def _drop_bindings(self, doomed: Any) -> None:
        self._bindings = {k: b for k, b in self._bindings.items() if not doomed(b)}


def _own(entry: Any) -> Any:
    """A copy whose arguments are a plain dict nobody else holds."""
    return replace(entry, arguments=dict(entry.arguments))

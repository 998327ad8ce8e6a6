"""The data of a :class:`~rabbitry.topology.Topology`: its four tuples, their checks and
the lookups by name.

The operations on a topology (``_apply``, ``_definitions``, ``_diff``) take this class
and build new topologies with ``type(topology)``; :class:`Topology` derives from it and
adds the methods that call them, so that they need not import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Self, TypeVar

from ..exceptions import TopologyValidationError
from ._model import Binding, Exchange, Queue
from ._policy import Policy
from ._sharding import check_sharded_names, sharded_exchanges

__all__ = ["T", "TopologyData"]


@dataclass(frozen=True, eq=True, init=False)
class TopologyData:
    """Exchanges, queues, bindings and policies, checked (see :class:`Topology`)."""

    exchanges: tuple[Exchange, ...]
    queues: tuple[Queue, ...]
    bindings: tuple[Binding, ...]
    policies: tuple[Policy, ...]

    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        exchanges: Iterable[Exchange] = (),
        queues: Iterable[Queue] = (),
        bindings: Iterable[Binding] = (),
        policies: Iterable[Policy] = (),
    ) -> None:
        kept_policies = _unique(policies, Policy, "policies")
        kept_exchanges = _unique(exchanges, Exchange, "exchanges")
        kept_queues = _unique(queues, Queue, "queues")
        kept_bindings: list[Binding] = []
        for binding in _items(bindings, Binding, "bindings"):
            if not any(binding.same_as(seen) for seen in kept_bindings):
                kept_bindings.append(binding)
        for binding in kept_bindings:
            target = binding.destination
            if isinstance(target, Queue) and not any(target is q for q in kept_queues):
                raise TopologyValidationError(
                    binding.label,
                    "destination",
                    "refers to a server-named queue that is not in this topology's queues",
                )
        sharded = sharded_exchanges(tuple(kept_exchanges), tuple(kept_policies))
        check_sharded_names(sharded, tuple(kept_queues), tuple(kept_bindings))
        object.__setattr__(self, "exchanges", tuple(kept_exchanges))
        object.__setattr__(self, "queues", tuple(kept_queues))
        object.__setattr__(self, "bindings", tuple(kept_bindings))
        object.__setattr__(self, "policies", tuple(kept_policies))

    def __add__(self, other: object) -> Self:
        if not isinstance(other, TopologyData):
            return NotImplemented
        return type(self)(
            self.exchanges + other.exchanges,
            self.queues + other.queues,
            self.bindings + other.bindings,
            self.policies + other.policies,
        )

    def __len__(self) -> int:
        return len(self.exchanges) + len(self.queues) + len(self.bindings) + len(self.policies)

    def exchange(self, name: str) -> Exchange | None:
        """The exchange called ``name``.

        Args:
            name: the exchange name.

        Returns:
            The exchange, or ``None``.
        """
        return next((x for x in self.exchanges if x.name == name), None)

    def queue(self, name: str) -> Queue | None:
        """The queue called ``name``.

        Args:
            name: the queue name.

        Returns:
            The queue, or ``None`` (server-named queues have no name).
        """
        if not name:
            return None
        return next((q for q in self.queues if q.name == name), None)

    def policy(self, name: str) -> Policy | None:
        """The policy called ``name``.

        Args:
            name: the policy name.

        Returns:
            The policy, or ``None``.
        """
        return next((p for p in self.policies if p.name == name), None)


#: A topology class: the operations return the class they were given.
T = TypeVar("T", bound=TopologyData)


def _items(values: object, cls: type, name: str) -> list[Any]:
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise TopologyValidationError(
            "topology", name, f"must be a sequence of {cls.__name__}, got {type(values).__name__}"
        )
    items = list(values)
    for index, item in enumerate(items):
        if not isinstance(item, cls):
            raise TopologyValidationError(
                "topology",
                f"{name}[{index}]",
                f"must be a {cls.__name__}, got {type(item).__name__}",
            )
    return items


def _unique(values: object, cls: type, name: str) -> list[Any]:
    kept: list[Any] = []
    by_name: dict[str, Any] = {}
    for item in _items(values, cls, name):
        if not item.name:  # server-named: each object is its own queue
            if not any(item is other for other in kept):
                kept.append(item)
            continue
        seen = by_name.get(item.name)
        if seen is None:
            by_name[item.name] = item
            kept.append(item)
        elif seen != item:
            changed = [
                f"{f.name}: {getattr(seen, f.name)!r} vs {getattr(item, f.name)!r}"
                for f in fields(item)
                if getattr(seen, f.name) != getattr(item, f.name)
            ]
            raise TopologyValidationError(
                item.label, "name", f"defined twice with different settings ({'; '.join(changed)})"
            )
    return kept

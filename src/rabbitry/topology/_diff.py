"""diff: what differs between the topology we want and another one (or the broker's).

The comparison is by what RabbitMQ compares on re-declare: for exchanges the type, the
flags and the arguments; for queues the flags and the arguments; bindings by their full
identity. Integer arguments compare by value whatever their AMQP integer type, as the
broker does. One normalisation: a queue without ``x-queue-type`` has the vhost's default
queue type (RabbitMQ 3.11+: ``rabbitmqctl add_vhost --default-queue-type``; read from a
definitions export, else ``classic``) when it is durable, not exclusive and not
auto-delete, and ``classic`` otherwise, as the broker decides at declaration; so
``Queue("jobs")`` and a broker queue with ``x-queue-type: quorum`` in a vhost whose default
is quorum are the same (RabbitMQ 4.x lists every queue's type in its definitions).

Lines read ``<entity>: <what>``, e.g.::

    queue 'jobs': x-message-ttl: ours 1000, theirs 2000
    exchange 'events': missing
    binding 'events' -> queue 'jobs' (routing key 'job.*'): missing
    queue 'old': not in ours
    policy 'ttl': message-ttl: ours 60000, theirs 30000
    queue 'jobs': message-ttl: policy 'ttl' sets 60000, argument x-message-ttl 1000:
        1000 applies (the lower value wins)

Policy and queue argument for the same key (RabbitMQ's rule, for classic queues; see
the ``dlx``, ``maxlength`` and ``ttl`` guides): for ``message-ttl``, ``expires``,
``max-length``, ``max-length-bytes`` and ``delivery-limit`` the *lower* value applies;
for ``dead-letter-exchange``, ``dead-letter-routing-key``, ``dead-letter-strategy``,
``overflow``, ``queue-mode`` and ``queue-version`` the *queue argument* wins. One
exception: before RabbitMQ 3.13 a quorum queue took ``expires`` from the policy
(rabbitmq-server#10949). For ``delivery-limit``, RabbitMQ 4.0's "unlimited" (a negative
value, ``-1``) counts as higher than any limit: a finite limit from either side applies.
Only the highest-priority matching policy counts.
``diff`` reports an overlap whose values differ; :func:`policy_overlaps` lists all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._model import Binding, Exchange, Queue

if TYPE_CHECKING:
    from ._base import TopologyData
    from ._policy import Policy

__all__ = [
    "ARGUMENT_WINS",
    "LOWER_WINS",
    "PolicyOverlap",
    "default_queue_type",
    "diff_topologies",
    "effective_policy",
    "policy_overlaps",
]

#: Policy keys where, set by both, the lower of policy and queue argument applies.
LOWER_WINS = ("message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit")
#: Policy keys where, set by both, the queue argument wins over the policy.
ARGUMENT_WINS = (
    "dead-letter-exchange",
    "dead-letter-routing-key",
    "dead-letter-strategy",
    "overflow",
    "queue-mode",
    "queue-version",
)

_ABSENT = object()


def _show(value: Any) -> str:
    return "(not set)" if value is _ABSENT else repr(value)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def default_queue_type(definitions: Mapping[str, Any], vhost: str = "/") -> str:
    """The default queue type of ``vhost`` in a definitions export (``classic`` if unset).

    A one-vhost export has it at the top level; a whole-broker export in ``vhosts``
    (``default_queue_type``, or in the entry's ``metadata``).
    """
    value = definitions.get("default_queue_type") if "vhosts" not in definitions else None
    for entry in definitions.get("vhosts") or ():
        if isinstance(entry, Mapping) and entry.get("name") == vhost:
            metadata = entry.get("metadata")
            value = entry.get("default_queue_type") or (
                metadata.get("default_queue_type") if isinstance(metadata, Mapping) else None
            )
    return value if isinstance(value, str) and value and value != "undefined" else "classic"


def _queue_arguments(queue: Queue, default_type: str = "classic") -> dict[str, Any]:
    arguments = queue.declare_arguments()
    kind = arguments.get("x-queue-type")
    if kind is None:
        replicable = queue.durable and not queue.exclusive and not queue.auto_delete
        kind = default_type if replicable else "classic"
    if kind == "classic":
        arguments.pop("x-queue-type", None)
    else:
        arguments["x-queue-type"] = kind
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


def _queue_view(q: Queue, default_type: str) -> dict[str, Any]:
    view: dict[str, Any] = {"durable": q.durable, "auto_delete": q.auto_delete}
    if q.exclusive:
        view["exclusive"] = True
    view.update(_queue_arguments(q, default_type))
    return view


def diff_topologies(
    ours: TopologyData,
    theirs: TopologyData,
    *,
    extra: bool = True,
    default_queue_type: str = "classic",
) -> list[str]:
    """Readable differences; empty when ``theirs`` has everything ``ours`` declares.

    Args:
        ours: the wanted topology.
        theirs: what to compare with (another topology, or what the broker has).
        extra: also list entities that only ``theirs`` has ("not in ours").
        default_queue_type: the vhost's default queue type: what a queue without
            ``x-queue-type`` is.
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
            lines += _compare(
                q.label,
                _queue_view(q, default_queue_type),
                _queue_view(other_q, default_queue_type),
            )
    for b in ours.bindings:
        if isinstance(b.destination, Queue):
            continue
        if not any(b.same_as(o) for o in theirs.bindings):
            lines.append(f"{b.label}: missing")
    lines += _diff_policies(ours, theirs)
    effective = list(ours.policies) + [p for p in theirs.policies if ours.policy(p.name) is None]
    for q in ours.queues:
        if q.server_named:
            continue
        for overlap in policy_overlaps(q, effective):
            if not _same(overlap.policy_value, overlap.argument_value):
                lines.append(overlap.line())
    if extra:
        lines += _extra(ours, theirs)
    return lines


def _policy_view(p: Policy) -> dict[str, Any]:
    view: dict[str, Any] = {"pattern": p.pattern, "apply-to": p.apply_to, "priority": p.priority}
    view.update(p.definition or {})
    return view


def _diff_policies(ours: TopologyData, theirs: TopologyData) -> list[str]:
    lines = []
    for p in ours.policies:
        other = theirs.policy(p.name)
        if other is None:
            lines.append(f"{p.label}: missing")
        else:
            lines += _compare(p.label, _policy_view(p), _policy_view(other))
    return lines


@dataclass(frozen=True)
class PolicyOverlap:
    """A key that both a policy and a queue argument set, and which value applies.

    Attributes:
        queue: the queue name.
        key: the policy key (``message-ttl``); the argument is ``x-`` + key.
        policy: the name of the policy in force for the queue.
        policy_value: what the policy sets.
        argument_value: what the queue argument sets.
        winner: ``"policy"``, ``"argument"`` (or ``"lower"`` resolved to one of them),
            or ``"unknown"`` for a key without a documented rule.
        effective: the value that applies (``None`` when unknown).
        rule: the rule, in words.
    """

    queue: str
    key: str
    policy: str
    policy_value: Any
    argument_value: Any
    winner: str
    effective: Any
    rule: str

    def line(self) -> str:
        """``queue 'q': message-ttl: policy 'p' sets 60000, argument x-message-ttl 1000:
        1000 applies (the lower value wins)``."""
        applies = f"{self.effective!r} applies" if self.winner != "unknown" else "which applies is"
        return (
            f"queue {self.queue!r}: {self.key}: policy {self.policy!r} sets "
            f"{self.policy_value!r}, argument x-{self.key} {self.argument_value!r}: "
            f"{applies} ({self.rule})"
        )


def effective_policy(queue: Queue, policies: list[Policy] | tuple[Policy, ...]) -> Policy | None:
    """The highest-priority policy of ``policies`` that selects ``queue`` (the first on a tie)."""
    best: Policy | None = None
    for policy in policies:
        if policy.applies_to_queue(queue.name, queue.queue_type) and (
            best is None or policy.priority > best.priority
        ):
            best = policy
    return best


def policy_overlaps(
    queue: Queue, policies: list[Policy] | tuple[Policy, ...]
) -> list[PolicyOverlap]:
    """Every key set both by ``queue``'s arguments and by the policy in force for it.

    Args:
        queue: the queue (its name selects the policy).
        policies: the policies that exist; the highest-priority match is in force.
    """
    policy = effective_policy(queue, policies)
    if policy is None:
        return []
    arguments = queue.declare_arguments()
    result = []
    for key, value in (policy.definition or {}).items():
        argument = f"x-{key}"
        if argument not in arguments:
            continue
        ours = arguments[argument]
        if key == "expires" and queue.queue_type == "quorum":
            winner, effective = "policy", value
            rule = "a quorum queue takes expires from the policy before RabbitMQ 3.13"
        elif key in LOWER_WINS:
            lower_is_policy = _lower(key, value, ours)
            winner = "policy" if lower_is_policy else "argument"
            effective = value if lower_is_policy else ours
            rule = "the lower value wins"
            if key == "delivery-limit" and (_unlimited(value) or _unlimited(ours)):
                rule = "the lower value wins; -1 is unlimited"
        elif key in ARGUMENT_WINS:
            winner, effective, rule = "argument", ours, "the queue argument wins"
        else:
            winner, effective = "unknown", None
            rule = "no documented rule for this key; see RabbitMQ's docs"
        result.append(
            PolicyOverlap(queue.name, key, policy.name, value, ours, winner, effective, rule)
        )
    return result


def _unlimited(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value < 0


def _lower(key: str, policy_value: Any, argument_value: Any) -> bool:
    """Whether the policy's value is the lower one (ties go to the argument)."""
    if not (isinstance(policy_value, int) and isinstance(argument_value, int)):
        return False
    if key == "delivery-limit" and (_unlimited(policy_value) or _unlimited(argument_value)):
        # rabbit_quorum_queue: a negative limit on either side yields to the other.
        return _unlimited(argument_value) and not _unlimited(policy_value)
    return policy_value < argument_value


def _extra(ours: TopologyData, theirs: TopologyData) -> list[str]:
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
    for p in theirs.policies:
        if ours.policy(p.name) is None:
            lines.append(f"{p.label}: not in ours")
    return lines


def _binding_matches(b: Binding, o: Binding) -> bool:
    return not isinstance(o.destination, Queue) and b.same_as(o)

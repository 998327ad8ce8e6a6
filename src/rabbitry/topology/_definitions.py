"""Loading and saving topologies: our own dict/JSON/YAML form and RabbitMQ definitions.

Two document shapes are read:

* **our form** — ``{"exchanges": [...], "queues": [...], "bindings": [...],
  "policies": [...]}`` where each
  entry has the constructor's keyword names (``message_ttl``, ``alternate_exchange``…).
  Unknown keys are errors, so a typo (``durabel``) does not pass silently. A ``vhost``
  key is tolerated (and ignored) so entries copied from an export still load.
* **a definitions export** — what ``rabbitmqctl export_definitions`` and the management
  API's ``GET /api/definitions`` produce: the same three lists, each entry with
  ``vhost`` and the raw ``arguments`` table (policies with ``apply-to`` and
  ``definition``), next to users, permissions and so on. Only
  the entities of one vhost are read; other keys are ignored (exports gain keys between
  RabbitMQ versions).

A document is taken as an export when it has ``rabbit_version``/``rabbitmq_version`` or
any entity carries a ``vhost``.

YAML needs PyYAML (``pip install rabbitry[yaml]``); it is imported only when used.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..exceptions import TopologyValidationError
from ._model import Binding, Exchange, Queue
from ._policy import Policy, broker_policies

if TYPE_CHECKING:
    import os

    from ._base import T, TopologyData

__all__ = [
    "from_definitions",
    "from_dict",
    "is_definitions",
    "load",
    "parse_text",
    "to_definitions",
    "to_dict",
]

_SECTIONS = (
    ("exchanges", Exchange),
    ("queues", Queue),
    ("bindings", Binding),
    ("policies", Policy),
)


def _fields(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def _entry(section: str, index: int, raw: object) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise TopologyValidationError(
            "topology", f"{section}[{index}]", f"must be a mapping, got {type(raw).__name__}"
        )
    return dict(raw)


def _section(data: Mapping[str, Any], section: str) -> list[Any]:
    raw = data.get(section) or []
    if not isinstance(raw, list | tuple):
        raise TopologyValidationError(
            "topology", section, f"must be a list, got {type(raw).__name__}"
        )
    return list(raw)


def is_definitions(data: Mapping[str, Any]) -> bool:
    """True when ``data`` looks like a RabbitMQ definitions export."""
    if "rabbit_version" in data or "rabbitmq_version" in data:
        return True
    for section, _ in _SECTIONS:
        for raw in _section(data, section):
            if isinstance(raw, Mapping) and "vhost" in raw:
                return True
    return False


def from_dict(make: type[T], data: Mapping[str, Any]) -> T:
    """Build a :class:`Topology` from our own form (see the module docstring)."""
    if not isinstance(data, Mapping):
        raise TopologyValidationError(
            "topology", "document", f"must be a mapping, got {type(data).__name__}"
        )
    unknown = set(data) - {name for name, _ in _SECTIONS}
    if unknown:
        raise TopologyValidationError(
            "topology",
            ", ".join(sorted(map(str, unknown))),
            "unknown section; expected exchanges, queues, bindings and policies",
        )
    built: dict[str, list[Any]] = {}
    for section, cls in _SECTIONS:
        known = _fields(cls)
        items = []
        for index, raw in enumerate(_section(data, section)):
            entry = _entry(section, index, raw)
            entry.pop("vhost", None)
            extra = sorted(set(entry) - set(known))
            if extra:
                label = f"{section}[{index}]"
                if "name" in entry:
                    label += f" {entry['name']!r}"
                raise TopologyValidationError(
                    label, ", ".join(extra), f"unknown field; known fields: {', '.join(known)}"
                )
            if cls is not Binding and "name" not in entry:
                raise TopologyValidationError(f"{section}[{index}]", "name", "is required")
            try:
                items.append(cls(**entry))
            except TypeError as exc:  # a required field is missing
                raise TopologyValidationError(f"{section}[{index}]", "fields", str(exc)) from None
        built[section] = items
    return make(built["exchanges"], built["queues"], built["bindings"], built["policies"])


def from_definitions(make: type[T], data: Mapping[str, Any], vhost: str = "/") -> T:
    """Build a :class:`Topology` from a RabbitMQ definitions export (one vhost).

    Entries without a ``vhost`` key are taken as belonging to ``vhost`` (a single-vhost
    export from the management API has none).
    """
    if not isinstance(data, Mapping):
        raise TopologyValidationError(
            "definitions", "document", f"must be a mapping, got {type(data).__name__}"
        )

    def mine(section: str) -> list[dict[str, Any]]:
        entries = [_entry(section, i, raw) for i, raw in enumerate(_section(data, section))]
        return [e for e in entries if e.get("vhost", vhost) == vhost]

    exchanges = [
        Exchange(
            e["name"],
            e.get("type", "direct"),
            durable=bool(e.get("durable", True)),
            auto_delete=bool(e.get("auto_delete", False)),
            internal=bool(e.get("internal", False)),
            arguments=e.get("arguments") or None,
        )
        for e in mine("exchanges")
        if e.get("name") and not str(e["name"]).startswith("amq.")
    ]
    queues = []
    for e in mine("queues"):
        arguments = dict(e.get("arguments") or {})
        if "x-queue-type" not in arguments and isinstance(e.get("type"), str):
            arguments["x-queue-type"] = e["type"]  # newer exports carry it outside too
        queues.append(
            Queue(
                e["name"],
                durable=bool(e.get("durable", True)),
                auto_delete=bool(e.get("auto_delete", False)),
                arguments=arguments or None,
            )
        )
    bindings = [
        Binding(
            e["source"],
            e["destination"],
            e.get("routing_key", ""),
            arguments=e.get("arguments") or None,
            destination_type=e.get("destination_type", "queue"),
        )
        for e in mine("bindings")
        if e.get("source")  # the default exchange's implicit bindings are not exported
    ]
    with broker_policies():  # the broker checked their keys; plugins may add keys
        policies = [
            Policy(
                e["name"],
                e.get("pattern", ""),
                apply_to=e.get("apply-to", "all"),
                definition=e.get("definition") or None,
                priority=e.get("priority", 0),
            )
            for e in mine("policies")
        ]
    return make(exchanges, queues, bindings, policies)


def to_dict(topology: TopologyData) -> dict[str, Any]:
    """Our own form: only fields that differ from their defaults.

    Raises:
        TopologyValidationError: a binding refers to a server-named queue (it has no
            name to write down).
    """
    result: dict[str, Any] = {}
    for section, cls in _SECTIONS:
        defaults = {f.name: f.default for f in fields(cls)}
        entries = []
        for item in getattr(topology, section):
            if isinstance(item, Binding) and isinstance(item.destination, Queue):
                raise TopologyValidationError(
                    item.label, "destination", "a server-named queue cannot be written down"
                )
            entry: dict[str, Any] = {}
            for name, default in defaults.items():
                value = getattr(item, name)
                if name in ("name", "source", "destination") or value != default:
                    entry[name] = dict(value) if isinstance(value, Mapping) else value
            entries.append(entry)
        if entries:
            result[section] = entries
    return result


def to_definitions(topology: TopologyData, vhost: str = "/") -> dict[str, Any]:
    """The topology as a definitions document for ``rabbitmqctl import_definitions``.

    Exclusive and server-named queues, and bindings to them, are left out: they belong
    to one connection, and RabbitMQ's own export leaves them out too.
    """
    skipped = {q.name for q in topology.queues if q.exclusive or not q.name}
    exchanges = [
        {
            "name": x.name,
            "vhost": vhost,
            "type": x.type,
            "durable": x.durable,
            "auto_delete": x.auto_delete,
            "internal": x.internal,
            "arguments": x.declare_arguments(),
        }
        for x in topology.exchanges
    ]
    queues = [
        {
            "name": q.name,
            "vhost": vhost,
            "durable": q.durable,
            "auto_delete": q.auto_delete,
            "arguments": q.declare_arguments(),
        }
        for q in topology.queues
        if q.name not in skipped
    ]
    bindings = [
        {
            "source": b.source,
            "vhost": vhost,
            "destination": b.destination_name,
            "destination_type": b.destination_type,
            "routing_key": b.routing_key,
            "arguments": dict(b.arguments or {}),
        }
        for b in topology.bindings
        if not (b.destination_type == "queue" and b.destination_name in skipped)
        and not isinstance(b.destination, Queue)
    ]
    policies = [
        {
            "vhost": vhost,
            "name": p.name,
            "pattern": p.pattern,
            "apply-to": p.apply_to,
            "definition": dict(p.definition or {}),
            "priority": p.priority,
        }
        for p in topology.policies
    ]
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings, "policies": policies}


def _yaml() -> Any:
    try:
        return importlib.import_module("yaml")
    except ImportError:
        raise ImportError(
            "reading or writing YAML needs PyYAML: pip install 'rabbitry[yaml]'"
        ) from None


def parse_text(text: str, fmt: str) -> Any:
    """Parse a JSON or YAML document into plain data.

    Raises:
        TopologyValidationError: the text is not valid JSON/YAML.
        ImportError: YAML was asked for and PyYAML is not installed.
    """
    if fmt == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise TopologyValidationError("topology", "document", f"invalid JSON: {exc}") from None
    yaml = _yaml()
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TopologyValidationError("topology", "document", f"invalid YAML: {exc}") from None


def from_data(make: type[T], data: Any, vhost: str) -> T:
    """Our form or a definitions export, whichever ``data`` is."""
    if data is None:
        return make()
    if isinstance(data, Mapping) and is_definitions(data):
        return from_definitions(make, data, vhost)
    return from_dict(make, data)


def load(make: type[T], path: str | os.PathLike[str], vhost: str = "/") -> T:
    """Read a topology file: ``.json``, or ``.yaml``/``.yml`` (needs PyYAML).

    Raises:
        TopologyValidationError: unknown suffix, invalid document or invalid entities.
        OSError: the file cannot be read.
    """
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix == ".json":
        fmt = "json"
    elif suffix in (".yaml", ".yml"):
        fmt = "yaml"
    else:
        raise TopologyValidationError(
            f"file {str(file)!r}", "suffix", "must be .json, .yaml or .yml"
        )
    return from_data(make, parse_text(file.read_text(encoding="utf-8"), fmt), vhost)


def dump_yaml(data: Any) -> str:
    """YAML text for plain data (needs PyYAML)."""
    text: str = _yaml().safe_dump(data, sort_keys=False, allow_unicode=True)
    return text

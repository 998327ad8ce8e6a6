"""The management HTTP API's requests and answers, without any I/O (sans-IO).

Each operation is a :class:`Request`: the HTTP method, the path under ``/api``, an
optional JSON body and a function that turns the decoded answer into what the client
returns. :class:`~rabbitry.management.ManagementClient` and
:class:`~rabbitry.management.AsyncManagementClient` only send them, so the two stay
identical by construction.

Path segments (vhost, queue, policy and connection names) are percent-encoded whole:
the default vhost ``/`` is ``%2F``, as the API requires.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from ..exceptions import LocalProtocolError, ManagementError, ManagementNotFound
from ..protocol.frames import split_timestamp
from ..protocol.spec import BasicProperties
from ..topology._policy import Policy, broker_policies

__all__ = [
    "QueueInfo",
    "Request",
    "error_for",
    "policy_from_api",
    "publish",
    "publish_properties",
    "queue_from_api",
]

T = TypeVar("T")


def _seg(value: str) -> str:
    return quote(value, safe="")


@dataclass(frozen=True)
class Request(Generic[T]):
    """One API call: ``method path`` with ``body``; ``parse`` turns the answer into ``T``."""

    method: str
    path: str
    parse: Callable[[Any], T]
    body: Any = None
    #: The answer of a non-GET request is JSON that ``parse`` reads (``publish``).
    reads_answer: bool = False


def _raw(data: Any) -> Any:
    return data


def _none(data: Any) -> None:
    return None


@dataclass(frozen=True)
class QueueInfo:
    """A queue as the management API shows it.

    Counts and rates come from the broker's statistics, refreshed every
    ``collect_statistics_interval`` (5 s by default), so they lag a little; a passive
    ``queue_declare`` gives the exact ready count.

    Attributes:
        name: the queue name.
        vhost: its vhost.
        type: ``classic``, ``quorum`` or ``stream``.
        durable: survives a restart.
        auto_delete: deleted with its last consumer.
        exclusive: belongs to one connection.
        arguments: its ``x-`` arguments.
        policy: the name of the policy that applies to it, if any.
        effective_policy_definition: the keys that policy (and operator policies) set.
        messages: ready + unacknowledged messages (the depth).
        messages_ready: messages waiting for a consumer.
        messages_unacknowledged: delivered, not yet acknowledged.
        consumers: subscribed consumers.
        publish_rate: messages/s published into the queue (recent average).
        deliver_rate: messages/s delivered or fetched (recent average).
        ack_rate: messages/s acknowledged (recent average).
        state: ``running``, ``idle``, ``down``...
        raw: the API's whole answer for this queue.
    """

    name: str
    vhost: str
    type: str
    durable: bool
    auto_delete: bool
    exclusive: bool
    arguments: Mapping[str, Any]
    policy: str | None
    effective_policy_definition: Mapping[str, Any]
    messages: int
    messages_ready: int
    messages_unacknowledged: int
    consumers: int
    publish_rate: float
    deliver_rate: float
    ack_rate: float
    state: str | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)


def _rate(stats: Any, key: str) -> float:
    if isinstance(stats, Mapping):
        details = stats.get(f"{key}_details")
        if isinstance(details, Mapping) and isinstance(details.get("rate"), int | float):
            return float(details["rate"])
    return 0.0


def _count(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def queue_from_api(data: Any) -> QueueInfo:
    """A :class:`QueueInfo` from one entry of ``GET /api/queues``."""
    stats = data.get("message_stats") or {}
    return QueueInfo(
        name=data["name"],
        vhost=data.get("vhost", "/"),
        type=data.get("type") or (data.get("arguments") or {}).get("x-queue-type") or "classic",
        durable=bool(data.get("durable", True)),
        auto_delete=bool(data.get("auto_delete", False)),
        exclusive=bool(data.get("exclusive", False)),
        arguments=dict(data.get("arguments") or {}),
        policy=data.get("policy") or None,
        effective_policy_definition=dict(data.get("effective_policy_definition") or {}),
        messages=_count(data, "messages"),
        messages_ready=_count(data, "messages_ready"),
        messages_unacknowledged=_count(data, "messages_unacknowledged"),
        consumers=_count(data, "consumers"),
        publish_rate=_rate(stats, "publish"),
        deliver_rate=_rate(stats, "deliver_get"),
        ack_rate=_rate(stats, "ack"),
        state=data.get("state"),
        raw=data,
    )


def policy_from_api(data: Any) -> Policy:
    """A validated :class:`~rabbitry.topology.Policy` from ``GET /api/policies``."""
    with broker_policies():  # the broker checked the keys; plugins may add keys
        return _policy(data)


def _policy(data: Any) -> Policy:
    return Policy(
        data["name"],
        data.get("pattern", ""),
        apply_to=data.get("apply-to", "all"),
        definition=dict(data.get("definition") or {}),
        priority=int(data.get("priority", 0)),
    )


def _queues(data: Any) -> list[QueueInfo]:
    return [queue_from_api(item) for item in data]


def _policies(data: Any) -> list[Policy]:
    return [policy_from_api(item) for item in data]


def _in(vhost: str | None) -> str:
    return "" if vhost is None else f"/{_seg(vhost)}"


# --------------------------------------------------------------------------- requests


def overview() -> Request[dict[str, Any]]:
    return Request("GET", "/overview", _raw)


def vhosts() -> Request[list[dict[str, Any]]]:
    return Request("GET", "/vhosts", _raw)


def create_vhost(name: str) -> Request[None]:
    return Request("PUT", f"/vhosts/{_seg(name)}", _none, {})


def delete_vhost(name: str) -> Request[None]:
    return Request("DELETE", f"/vhosts/{_seg(name)}", _none)


def set_permissions(vhost: str, user: str, configure: str, write: str, read: str) -> Request[None]:
    body = {"configure": configure, "write": write, "read": read}
    return Request("PUT", f"/permissions/{_seg(vhost)}/{_seg(user)}", _none, body)


def queues(vhost: str | None) -> Request[list[QueueInfo]]:
    return Request("GET", f"/queues{_in(vhost)}", _queues)


def queue(name: str, vhost: str) -> Request[QueueInfo]:
    return Request("GET", f"/queues/{_seg(vhost)}/{_seg(name)}", queue_from_api)


def delete_queue(name: str, vhost: str) -> Request[None]:
    return Request("DELETE", f"/queues/{_seg(vhost)}/{_seg(name)}", _none)


def purge_queue(name: str, vhost: str) -> Request[None]:
    return Request("DELETE", f"/queues/{_seg(vhost)}/{_seg(name)}/contents", _none)


def exchanges(vhost: str | None) -> Request[list[dict[str, Any]]]:
    return Request("GET", f"/exchanges{_in(vhost)}", _raw)


def exchange(name: str, vhost: str) -> Request[dict[str, Any]]:
    return Request("GET", f"/exchanges/{_seg(vhost)}/{_seg(name)}", _raw)


def bindings(vhost: str | None) -> Request[list[dict[str, Any]]]:
    return Request("GET", f"/bindings{_in(vhost)}", _raw)


def connections() -> Request[list[dict[str, Any]]]:
    return Request("GET", "/connections", _raw)


def close_connection(name: str) -> Request[None]:
    # The API takes the reason from an X-Reason header; the clients add it.
    return Request("DELETE", f"/connections/{_seg(name)}", _none)


def definitions(vhost: str | None) -> Request[dict[str, Any]]:
    return Request("GET", f"/definitions{_in(vhost)}", _raw)


def import_definitions(document: Mapping[str, Any], vhost: str | None) -> Request[None]:
    if not isinstance(document, Mapping):
        raise TypeError(f"definitions: must be a mapping, got {type(document).__name__}")
    return Request("POST", f"/definitions{_in(vhost)}", _none, dict(document))


def policies(vhost: str | None) -> Request[list[Policy]]:
    return Request("GET", f"/policies{_in(vhost)}", _policies)


def policy(name: str, vhost: str) -> Request[Policy]:
    return Request("GET", f"/policies/{_seg(vhost)}/{_seg(name)}", policy_from_api)


def put_policy(item: Policy, vhost: str) -> Request[None]:
    if not isinstance(item, Policy):
        raise TypeError(f"policy: must be a rabbitry.topology.Policy, got {type(item).__name__}")
    body = {
        "pattern": item.pattern,
        "definition": dict(item.definition or {}),
        "priority": item.priority,
        "apply-to": item.apply_to,
    }
    return Request("PUT", f"/policies/{_seg(vhost)}/{_seg(item.name)}", _none, body)


def delete_policy(name: str, vhost: str) -> Request[None]:
    return Request("DELETE", f"/policies/{_seg(vhost)}/{_seg(name)}", _none)


# --------------------------------------------------------------------------- publish

#: The API's name of the default exchange (``""`` over AMQP).
DEFAULT_EXCHANGE = "amq.default"
_JSON_SCALARS = (str, bool, int, float)


def _json_header(value: Any, path: str) -> Any:
    """``value`` as JSON the API turns back into the same AMQP field, else an error.

    The API maps JSON strings to longstr, integers to long, floats to double, booleans,
    lists to arrays and objects to tables; anything else (bytes, datetime, Decimal,
    ``None``, the typed ints such as ``Int8``) has no JSON form that keeps its type.
    """
    cls = type(value)
    if cls in _JSON_SCALARS:
        return value
    if isinstance(value, Mapping):
        return {
            _json_key(key, path): _json_header(item, f"{path}[{key!r}]")
            for key, item in value.items()
        }
    if cls is list or cls is tuple:
        return [_json_header(item, f"{path}[{index}]") for index, item in enumerate(value)]
    raise LocalProtocolError(
        f"{path}: the management API carries headers as JSON (str, int, float, bool, "
        f"list, dict), so a {cls.__name__} cannot keep its type; publish it over AMQP"
    )


def _json_key(key: Any, path: str) -> str:
    if type(key) is not str:
        raise LocalProtocolError(f"{path}: table keys must be str, got {type(key).__name__}")
    return key


def publish_properties(
    properties: BasicProperties | None,
    persistent: bool | None = None,
    expiration: Any = None,
) -> dict[str, Any]:
    """The JSON ``properties`` of a management-API publish, validated as over AMQP.

    ``properties`` goes through the same checks as a ``basic.publish`` (it is encoded
    once, which raises :class:`~rabbitry.exceptions.LocalProtocolError` naming the field);
    ``persistent`` and ``expiration`` are read as :meth:`rabbitry.Publisher.publish`
    reads them. Headers must also have a JSON form (see :func:`_json_header`).
    """
    from ..publisher import expiration_ms

    if properties is None:
        properties = BasicProperties()
    elif not isinstance(properties, BasicProperties):
        raise LocalProtocolError(
            f"basic.properties: must be a rabbitry.BasicProperties, got {type(properties).__name__}"
        )
    if persistent is not None and not isinstance(persistent, bool):
        raise LocalProtocolError(f"persistent: must be a bool, got {type(persistent).__name__}")
    properties.encode()  # the AMQP path's validation: types, ranges, lengths
    out: dict[str, Any] = {}
    for name in BasicProperties.FIELDS:
        value = getattr(properties, name)
        if value is None:
            continue
        if name == "headers":
            value = _json_header(value, "basic.properties.headers")
        elif name == "timestamp":
            value = split_timestamp(value, "basic.properties.timestamp")
        out[name] = value
    if persistent is not None:
        out["delivery_mode"] = 2 if persistent else 1
    if expiration is not None:
        out["expiration"] = expiration_ms(expiration)
    return out


def _routed(data: Any) -> bool:
    if not isinstance(data, Mapping) or not isinstance(data.get("routed"), bool):
        raise ManagementError(200, f"the publish answer has no 'routed' flag: {data!r}")
    return bool(data["routed"])


def publish(
    exchange: str,
    routing_key: str,
    body: bytes | bytearray | memoryview | str,
    properties: BasicProperties | None,
    persistent: bool | None,
    expiration: Any,
    vhost: str,
) -> Request[bool]:
    """``POST /api/exchanges/{vhost}/{exchange}/publish``; the answer is ``routed``.

    A ``str`` body is sent as UTF-8 text (``payload_encoding: string``); bytes are sent
    base64-encoded, so any bytes arrive unchanged.
    """
    for field_name, value in (
        ("exchange", exchange),
        ("routing_key", routing_key),
        ("vhost", vhost),
    ):
        if not isinstance(value, str):
            raise LocalProtocolError(
                f"basic.publish.{field_name}: must be a str, got {type(value).__name__}"
            )
        if field_name != "vhost" and len(value.encode("utf-8", "surrogateescape")) > 255:
            raise LocalProtocolError(f"basic.publish.{field_name}: shortstr longer than 255 bytes")
    if isinstance(body, str):
        payload, encoding = body, "string"
    elif isinstance(body, bytes | bytearray | memoryview):
        payload, encoding = base64.b64encode(bytes(body)).decode("ascii"), "base64"
    else:
        raise LocalProtocolError(
            "basic.publish.body: must be bytes, bytearray, memoryview or str, "
            f"got {type(body).__name__}"
        )
    document = {
        "properties": publish_properties(properties, persistent, expiration),
        "routing_key": routing_key,
        "payload": payload,
        "payload_encoding": encoding,
    }
    name = exchange or DEFAULT_EXCHANGE
    path = f"/exchanges/{_seg(vhost)}/{_seg(name)}/publish"
    return Request("POST", path, _routed, document, reads_answer=True)


# --------------------------------------------------------------------------- answers


def error_for(status: int, text: str, method: str, path: str) -> ManagementError:
    """The typed error for an HTTP error answer (the API's JSON ``reason`` if any)."""
    reason = text.strip() or f"HTTP {status}"
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, Mapping):
        parts = [str(data[k]) for k in ("error", "reason") if data.get(k)]
        if parts:
            reason = ": ".join(dict.fromkeys(parts))
    cls = (
        ManagementNotFound
        if status == 404 or _broker_not_found(status, reason)
        else ManagementError
    )
    return cls(status, reason, method, path)


def _broker_not_found(status: int, reason: str) -> bool:
    """A 400 that carries the broker's own 404: the API passed on an AMQP
    ``NOT_FOUND`` (publishing to a missing exchange answers
    ``bad_request: 404 NOT_FOUND - no exchange 'x' in vhost '/'``)."""
    return status == 400 and "404 NOT_FOUND" in reason

"""The checks of topology values: AMQP short strings, integers in a range, booleans,
argument tables, and the rules of the policy keys. Each raises
:class:`~rabbitry.exceptions.TopologyValidationError` naming the entity and field."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..exceptions import LocalProtocolError, TopologyValidationError
from ..protocol.frames import encode_table

_MAX_SHORTSTR = 255
MAX_AGE = re.compile(r"[0-9]+[YMDhms]")


def check_shortstr(entity: str, name: str, value: object, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise TopologyValidationError(entity, name, f"must be a str, got {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise TopologyValidationError(entity, name, "must be encodable as UTF-8") from None
    if size > _MAX_SHORTSTR:
        raise TopologyValidationError(
            entity, name, f"must be at most 255 UTF-8 bytes (AMQP shortstr), got {size}"
        )
    if not empty and not value:
        raise TopologyValidationError(entity, name, "must not be empty")
    return value


def is_reserved(name: str) -> bool:
    """A name only the broker may create (``amq.*``): apply checks it, never declares it."""
    return name.startswith("amq.")


def check_declarable_name(entity: str, name: str, allowed: tuple[str, ...] | str) -> None:
    # RabbitMQ answers 403 ACCESS_REFUSED: "... contains reserved prefix 'amq.*'" to a
    # non-passive declare. Only the broker's own entities may be named so; apply checks
    # those with a passive declare.
    if is_reserved(name) and not (
        name in allowed if isinstance(allowed, tuple) else name.startswith(allowed)
    ):
        raise TopologyValidationError(
            entity,
            "name",
            "names starting with 'amq.' are reserved by the broker (only its built-in "
            "exchanges and amq.gen-* server-named queues may appear; they are checked "
            "with a passive declare, never declared)",
        )


def check_integer(
    entity: str, name: str, value: object, low: int, high: int | None, unit: str
) -> int:
    span = f"in {low}..{high}" if high is not None else f">= {low}"
    rule = f"must be an integer {span}{unit}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TopologyValidationError(entity, name, f"{rule}, got {value!r}")
    if value < low or (high is not None and value > high):
        raise TopologyValidationError(entity, name, f"{rule}, got {value}")
    return int(value)


def check_boolean(entity: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TopologyValidationError(entity, name, f"must be True or False, got {value!r}")
    return value


def check_arguments(entity: str, value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TopologyValidationError(
            entity, "arguments", f"must be a mapping, got {type(value).__name__}"
        )
    result: dict[str, Any] = {}
    for key, item in value.items():
        check_shortstr(entity, "arguments", key, empty=False)
        result[key] = item
    return result


def check_encodable(entity: str, arguments: Mapping[str, Any]) -> None:
    try:
        encode_table(arguments, "arguments")
    except LocalProtocolError as exc:
        raise TopologyValidationError(entity, "arguments", str(exc)) from None


def _same(a: object, b: object) -> bool:
    """Equal, without letting ``True == 1`` pass."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def lift_argument(
    obj: object, entity: str, arguments: dict[str, Any], mapping: Iterable[tuple[str, str]]
) -> None:
    """Move arguments that have a typed field into it; refuse contradictions."""
    for name, argument in mapping:
        if argument not in arguments:
            continue
        raw = arguments[argument]
        ours = getattr(obj, name)
        unset = ours is None or ours is False
        if unset:
            # x-single-active-consumer=false is sent as given: RabbitMQ treats an
            # explicit false and no argument as different on re-declare (406).
            if raw is False:
                continue
            object.__setattr__(obj, name, raw)
            del arguments[argument]
        elif _same(ours, raw):
            del arguments[argument]
        else:
            raise TopologyValidationError(
                entity,
                name,
                f"{name}={ours!r} contradicts arguments[{argument!r}]={raw!r}; give one of them",
            )


def policy_int(low: int, high: int | None, unit: str = "") -> Any:
    def check(entity: str, name: str, value: object) -> None:
        check_integer(entity, name, value, low, high, unit)

    return check


def policy_str(empty: bool = True) -> Any:
    def check(entity: str, name: str, value: object) -> None:
        check_shortstr(entity, name, value, empty=empty)

    return check


def policy_choice(choices: tuple[Any, ...]) -> Any:
    def check(entity: str, name: str, value: object) -> None:
        if isinstance(value, bool) or value not in choices:
            shown = ", ".join(map(str, choices))
            raise TopologyValidationError(entity, name, f"must be one of {shown}, got {value!r}")

    return check


def policy_max_age(entity: str, name: str, value: object) -> None:
    if not (isinstance(value, str) and MAX_AGE.fullmatch(value) is not None):
        raise TopologyValidationError(
            entity,
            name,
            f"must be a number and a unit Y, M, D, h, m or s (e.g. '7D'), got {value!r}",
        )

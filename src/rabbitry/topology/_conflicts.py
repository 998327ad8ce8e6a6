"""A declaration the broker refused with 406 PRECONDITION_FAILED, made readable.

RabbitMQ answers a re-declare with different properties with 406
PRECONDITION_FAILED and a text naming the first property that differs::

    inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/':
        received '100' but current is '200'
    inequivalent arg 'x-max-length' for queue 'q' in vhost '/':
        received the value '5' of type 'signedint' but current is none

A passive declare on a fresh channel then confirms that the entity exists (it returns
no arguments, so the text is the only source of the values), and the 406 becomes a
:class:`~rabbitry.TopologyConflict` with the argument and both values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..exceptions import NotFound, ResourceLocked, TopologyConflict, TopologyError
from ._model import Exchange

if TYPE_CHECKING:
    from ..exceptions import PreconditionFailed
    from ._model import Queue
    from ._session import Session

__all__ = ["Inequivalent", "conflict_error", "parse_inequivalent", "value_from_reply"]


_VALUE = r"none|the value '.*?' of type '[a-z]+'|'.*?'"
_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<argument>[^']*)' for (?P<kind>exchange|queue) '(?P<name>.*)' "
    rf"in vhost '(?P<vhost>.*)': received (?P<received>{_VALUE}) "
    rf"but current is (?P<current>{_VALUE})$",
    re.DOTALL,
)
_TYPED = re.compile(r"the value '(?P<value>.*)' of type '(?P<type>[a-z]+)'$", re.DOTALL)
_INT_TYPES = {
    "byte",
    "unsignedbyte",
    "short",
    "unsignedshort",
    "signedint",
    "unsignedint",
    "long",
    "timestamp",
}


@dataclass(frozen=True)
class Inequivalent:
    """The parts of an "inequivalent arg" reply."""

    argument: str
    kind: str
    name: str
    vhost: str
    received: str
    current: str


def parse_inequivalent(reply_text: str) -> Inequivalent | None:
    """Split RabbitMQ's "inequivalent arg" 406 text.

    Args:
        reply_text: the reply text of the channel.close.

    Returns:
        Its parts (the argument, the entity, the value sent and the current one),
        or ``None`` if the text is not one.
    """
    match = _INEQUIVALENT.search(reply_text.strip())
    if match is None:
        return None
    return Inequivalent(**match.groupdict())


def value_from_reply(text: str, like: Any = None) -> Any:
    """A value as the broker printed it, converted back to a Python value.

    ``none`` is ``None``; ``the value 'X' of type 'T'`` converts by ``T``; a bare
    ``'X'`` (the broker's form when both sides have the same type) converts like
    ``like``, the value we sent.
    """
    if text == "none":
        return None
    typed = _TYPED.match(text)
    if typed is not None:
        raw, kind = typed["value"], typed["type"]
        if kind == "bool":
            return raw == "true"
        if kind in _INT_TYPES:
            return _int(raw)
        if kind in ("double", "float"):
            try:
                return float(raw)
            except ValueError:
                return raw
        return raw
    raw = text[1:-1] if len(text) >= 2 and text[0] == text[-1] == "'" else text
    if isinstance(like, bool):
        return raw == "true"
    if isinstance(like, int):
        return _int(raw)
    if isinstance(like, float):
        try:
            return float(raw)
        except ValueError:
            return raw
    return raw


def _int(raw: str) -> int | str:
    try:
        return int(raw)
    except ValueError:
        return raw


def _our_value(entity: Exchange | Queue, argument: str, arguments: dict[str, Any]) -> Any:
    if argument in ("durable", "auto_delete", "internal", "exclusive", "type"):
        return getattr(entity, argument, None)
    return arguments.get(argument)


async def conflict_error(
    session: Session,
    entity: Exchange | Queue,
    arguments: dict[str, Any],
    exc: PreconditionFailed,
) -> TopologyError:
    """Turn a 406 on declare into the error to raise (the 406 closed the channel)."""
    parsed = parse_inequivalent(exc.reply_text)
    exists = True
    if entity.name:
        channel = await session.channel()
        try:
            if isinstance(entity, Exchange):
                await channel.exchange_declare(entity.name, passive=True)
            else:
                await channel.queue_declare(entity.name, passive=True)
        except NotFound:
            exists = False
        except ResourceLocked:
            pass  # an exclusive queue of another connection: it exists
    if parsed is None:
        return TopologyError(
            f"{entity.label}: the broker refused the declaration: {exc.reply_text}"
        )
    if not exists:
        return TopologyError(
            f"{entity.label}: the broker reported a conflict ({exc.reply_text}), but the "
            "entity no longer exists; apply again"
        )
    ours = _our_value(entity, parsed.argument, arguments)
    theirs = value_from_reply(parsed.current, like=ours)
    return TopologyConflict(entity.KIND, entity.name, parsed.argument, ours, theirs, exc.reply_text)

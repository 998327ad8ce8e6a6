"""The root of the exception tree and the message protocol errors name.

Part of :mod:`rabbitry.exceptions`, which re-exports every name; its classes say they
belong there (``__module__``), so their names, pickles and tracebacks are those of
``rabbitry.exceptions``. Like it, this module imports nothing from the package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

# Turns (class id, method id) into "queue.declare" in error texts. This module imports
# nothing of the package; rabbitry.protocol, when it is imported, hands it the spec's
# names through name_methods_with().
_namer: Callable[[int, int], str] = "{}.{}".format


def name_methods_with(namer: Callable[[int, int], str]) -> None:
    """Name AMQP methods in error texts with ``namer`` (for the library's own use).

    Args:
        namer: Turns a class id and a method id into a name such as ``"queue.declare"``.
    """
    global _namer
    _namer = namer


def method_name(class_id: int, method_id: int) -> str:
    """The name of an AMQP method in error texts.

    Args:
        class_id: The method's class id.
        method_id: The method's id within its class.

    Returns:
        ``"queue.declare"`` once :mod:`rabbitry.protocol` is imported, else ``"50.10"``.
    """
    return _namer(class_id, method_id)


class Message(Protocol):
    """The message an error carries: a :class:`rabbitry.Message` (a returned, delivered
    or reply message).

    This module is the bottom of the package and imports nothing from it, so the
    errors name the message by what they and their callers use of it.
    """

    body: bytes
    properties: Any
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    consumer_tag: str
    message_count: int | None
    reply_code: int
    reply_text: str

    @property
    def headers(self) -> dict[str, Any]: ...

    def ack(self, multiple: bool = False) -> Any: ...

    def nack(self, multiple: bool = False, requeue: bool = True) -> Any: ...

    def reject(self, requeue: bool = True) -> Any: ...


class AMQPError(Exception):
    """Base class of every rabbitry exception."""

    __module__ = "rabbitry.exceptions"

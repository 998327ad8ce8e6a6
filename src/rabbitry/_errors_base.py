"""The root of the exception tree and the message protocol errors name.

Part of :mod:`rabbitry.exceptions`, which re-exports every name; its classes say they
belong there (``__module__``), so their names, pickles and tracebacks are those of
``rabbitry.exceptions``. Like it, this module imports nothing from the package.
"""

from __future__ import annotations

from typing import Any, Protocol


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

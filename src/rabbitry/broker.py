"""What the broker said about itself in ``connection.start``, and the defaults that follow.

RabbitMQ sends its ``product``, ``version`` and a ``capabilities`` table in the
server-properties of ``connection.start``. Some of its defaults changed between major
versions, and a client that assumes the old ones loses messages or reports a broker
refusal as an unknown outcome:

========================  ====================  ======================
setting                   RabbitMQ 3.8 - 3.13   RabbitMQ 4.0 and later
========================  ====================  ======================
``max_message_size``      128 MiB               16 MiB
quorum ``delivery-limit`` unlimited             20
classic mirroring         ``ha-*`` policies     removed
========================  ====================  ======================

Both values are only the brokers' *defaults*: a broker configured otherwise
(``max_message_size`` in ``rabbitmq.conf``) needs the matching client option.
"""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = [
    "RABBITMQ_3_MAX_MESSAGE_SIZE",
    "RABBITMQ_4_MAX_MESSAGE_SIZE",
    "default_max_message_size",
    "server_capabilities",
    "server_version",
]

#: The broker's default ``max_message_size`` from RabbitMQ 3.8 to 3.13 (128 MiB).
RABBITMQ_3_MAX_MESSAGE_SIZE: Final = 128 * 1024 * 1024
#: The broker's default ``max_message_size`` from RabbitMQ 4.0 on (16 MiB).
RABBITMQ_4_MAX_MESSAGE_SIZE: Final = 16 * 1024 * 1024

_VERSION_RE: Final = re.compile(r"\s*(\d+(?:\.\d+)*)")


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def server_version(server_properties: dict[str, Any]) -> tuple[int, ...]:
    """The broker's version from its server-properties, e.g. ``(4, 0, 5)``.

    Only the leading dotted numbers count (``"3.10.8"``, ``"4.0.5+dfsg"``,
    ``"4.1.0-beta.3"`` → ``(4, 1, 0)``). Empty when the broker sent no version it could
    parse (an AMQP broker other than RabbitMQ, or a connection not opened yet).

    Args:
        server_properties: the ``connection.start`` server-properties table.
    """
    match = _VERSION_RE.match(_text(server_properties.get("version")))
    if match is None:
        return ()
    return tuple(int(part) for part in match.group(1).split("."))


def server_capabilities(server_properties: dict[str, Any]) -> dict[str, bool]:
    """The broker's ``capabilities`` table (``publisher_confirms``, ``per_consumer_qos``...).

    Args:
        server_properties: the ``connection.start`` server-properties table.
    """
    table = server_properties.get("capabilities")
    if not isinstance(table, dict):
        return {}
    return {str(key): bool(value) for key, value in table.items()}


def default_max_message_size(version: tuple[int, ...]) -> int:
    """The broker's default ``max_message_size`` for ``version`` (16 MiB from 4.0 on).

    An unknown version (``()``) gets the older, larger value: the client then leaves the
    refusal to the broker rather than refusing what the broker would accept.
    """
    return RABBITMQ_4_MAX_MESSAGE_SIZE if version >= (4,) else RABBITMQ_3_MAX_MESSAGE_SIZE

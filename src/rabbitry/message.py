"""Messages as they come out of the broker, their properties, and the AMQP number types.

A field table (``headers``, arguments) maps plain Python values to RabbitMQ's type
letters; wrap a number in :class:`Int8`, :class:`UInt8`, :class:`Int16`,
:class:`UInt16`, :class:`Int32`, :class:`UInt32`, :class:`Int64` or :class:`Float32`
to send it with another letter.
"""

from .protocol.frames import Float32, Int8, Int16, Int32, Int64, UInt8, UInt16, UInt32
from .protocol.message import Message, Properties, Settled

__all__ = [
    "Float32",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "Message",
    "Properties",
    "Settled",
    "UInt8",
    "UInt16",
    "UInt32",
]

"""The sans-IO AMQP 0-9-1 core: bytes in, events out; no sockets, threads or clocks.

See ``docs/sansio.md`` for how an engine drives it.
"""

from .. import exceptions as _exceptions
from .channel import ChannelProtocol, ChannelState
from .connection import ConnectionProtocol, ConnectionState
from .frames import (
    Float32,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
)
from .spec import method_name as _method_name

# The errors name the method a broker close was about ("queue.declare"); rabbitry.exceptions
# sits below this package and gets the names from it.
_exceptions.name_methods_with(_method_name)

__all__ = [
    "ChannelProtocol",
    "ChannelState",
    "ConnectionProtocol",
    "ConnectionState",
    "Float32",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "UInt8",
    "UInt16",
    "UInt32",
]

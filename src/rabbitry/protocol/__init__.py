"""The sans-IO AMQP 0-9-1 core: bytes in, events out; no sockets, threads or clocks.

See ``docs/sansio.md`` for how an engine drives it.
"""

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

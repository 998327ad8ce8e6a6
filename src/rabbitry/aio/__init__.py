"""The asyncio engine: :class:`AsyncConnection` and :class:`AsyncChannel`.

This :class:`AsyncConnection` is the engine: connection I/O, channels and recovery.
Applications use :class:`rabbitry.AsyncConnection`, which derives from it and adds the
factories of the high-level objects (``publisher()``, ``consumer()``, ...).
"""

from .channel import AsyncChannel
from .connection import AsyncConnection

__all__ = ["AsyncChannel", "AsyncConnection"]

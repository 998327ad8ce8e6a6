"""The asyncio engine: :class:`AsyncConnection` and :class:`AsyncChannel`."""

from .channel import AsyncChannel
from .connection import AsyncConnection

__all__ = ["AsyncChannel", "AsyncConnection"]

"""The thread-safe synchronous API: :class:`Connection` and :class:`Channel`.

A facade over the asyncio engine running on one IO thread per connection.
"""

from .channel import Channel
from .connection import Connection

__all__ = ["Channel", "Connection"]

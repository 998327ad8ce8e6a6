"""What a consumer remembers and counts: :class:`DedupStore`, :class:`MemoryDedupStore`
and :class:`ConsumerStats` (exported by :mod:`rabbitry.consumer` and :mod:`rabbitry`)."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from ..exceptions import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["ConsumerStats", "DedupStore", "MemoryDedupStore"]


class DedupStore(Protocol):
    """Remembers processed message ids so redelivered duplicates skip the handler."""

    def seen(self, key: str) -> bool:
        """Whether ``key`` was processed before (and is still remembered).

        Args:
            key: a message id.

        Returns:
            ``True`` if it was.
        """
        ...

    def add(self, key: str) -> None:
        """Remember that ``key`` was processed.

        Args:
            key: a message id.
        """
        ...


class MemoryDedupStore:
    """An in-memory LRU of message ids with a time to live.

    Args:
        max_size: ids remembered at most (least recently used go first).
        ttl: seconds an id is remembered.
        clock: monotonic time source (tests pass a fake one).
    """

    def __init__(
        self,
        max_size: int = 100_000,
        ttl: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_size < 1:
            raise ConfigurationError(f"max_size: must be >= 1, got {max_size}")
        if ttl <= 0:
            raise ConfigurationError(f"ttl: must be > 0 seconds, got {ttl}")
        self._entries: OrderedDict[str, float] = OrderedDict()
        self._max_size = max_size
        self._ttl = ttl
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def seen(self, key: str) -> bool:
        """Whether ``key`` was added less than ``ttl`` seconds ago.

        Args:
            key: a message id.

        Returns:
            ``True`` if it was (it becomes the most recently used).
        """
        stamp = self._entries.get(key)
        if stamp is None:
            return False
        if self._clock() - stamp > self._ttl:
            del self._entries[key]
            return False
        self._entries.move_to_end(key)
        return True

    def add(self, key: str) -> None:
        """Remember ``key`` now; evicts the oldest ids past ``max_size``.

        Args:
            key: a message id.
        """
        self._entries[key] = self._clock()
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_size:
            self._entries.popitem(last=False)


class ConsumerStats:
    """Counters of what the consumer did (read them any time)."""

    __slots__ = (
        "acked",
        "deduplicated",
        "delivered",
        "dropped",
        "dropped_records",
        "failed",
        "parked",
        "released",
        "requeued",
        "resubscribed",
        "retried",
    )

    def __init__(self) -> None:
        self.delivered = 0
        self.acked = 0
        self.failed = 0
        self.dropped = 0
        #: Records lost to drops: those of a dropped batch envelope, and 1 per plain
        #: message.
        self.dropped_records = 0
        self.retried = 0
        self.parked = 0
        self.requeued = 0
        self.released = 0
        self.deduplicated = 0
        self.resubscribed = 0

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict."""
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"ConsumerStats({self.as_dict()})"

"""A Jepsen-style message checker for the fault tests.

Every message carries a unique id. The workload reports what it attempted, what the
broker confirmed, what failed (and how), and every delivery; the checker derives

* ``lost``: confirmed but never delivered (must be 0: a confirm is a promise);
* ``unexpected``: delivered but never attempted (must be 0);
* ``duplicates``: deliveries beyond the first per id (allowed, counted, bounded);
* ``unknown``: neither confirmed nor failed (the outcome was never reported).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Checker:
    attempted: set[str] = field(default_factory=set)
    confirmed: set[str] = field(default_factory=set)
    failed: dict[str, BaseException] = field(default_factory=dict)
    delivered: Counter[str] = field(default_factory=Counter)
    redelivered: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def attempt(self, message_id: str) -> None:
        with self._lock:
            self.attempted.add(message_id)

    def confirm(self, message_id: str) -> None:
        with self._lock:
            self.confirmed.add(message_id)

    def fail(self, message_id: str, exc: BaseException) -> None:
        with self._lock:
            self.failed[message_id] = exc

    def deliver(self, message_id: str, redelivered: bool = False) -> None:
        with self._lock:
            self.delivered[message_id] += 1
            self.redelivered += redelivered

    @property
    def lost(self) -> set[str]:
        return self.confirmed - self.delivered.keys()

    @property
    def unexpected(self) -> set[str]:
        return self.delivered.keys() - self.attempted

    @property
    def duplicates(self) -> int:
        return sum(count - 1 for count in self.delivered.values())

    @property
    def unknown(self) -> set[str]:
        return self.attempted - self.confirmed - self.failed.keys()

    def summary(self) -> str:
        return (
            f"attempted={len(self.attempted)} confirmed={len(self.confirmed)} "
            f"failed={len(self.failed)} unknown={len(self.unknown)} "
            f"delivered={len(self.delivered)} lost={len(self.lost)} "
            f"unexpected={len(self.unexpected)} duplicates={self.duplicates} "
            f"redelivered={self.redelivered}"
        )

    def check(self, *, max_duplicates: int | None = None, allow_failed: bool = False) -> None:
        """Assert the pass criteria: lost = 0, unexpected = 0, every outcome reported."""
        print(f"checker: {self.summary()}")
        assert not self.lost, f"lost {len(self.lost)}: {sorted(self.lost)[:5]} ({self.summary()})"
        assert not self.unexpected, f"unexpected: {sorted(self.unexpected)[:5]}"
        assert not self.unknown, f"no outcome for {len(self.unknown)}: {sorted(self.unknown)[:5]}"
        if not allow_failed:
            assert not self.failed, f"failed: {list(self.failed.items())[:3]}"
        if max_duplicates is not None:
            assert self.duplicates <= max_duplicates, self.summary()

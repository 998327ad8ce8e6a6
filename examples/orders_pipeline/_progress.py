"""Progress bars while the pipeline runs (rich)."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Display", "QuietDisplay", "RichDisplay", "make_display"]


class Display(Protocol):
    """Where the pipeline reports progress (called from several threads)."""

    def step(self, text: str) -> None: ...

    def published(self, done: int, total: int) -> None: ...

    def consumed(self, done: int, total: int, counters: Any) -> None: ...

    def close(self) -> None: ...


class QuietDisplay:
    """Reports nothing (tests, ``--quiet``)."""

    def step(self, text: str) -> None:
        pass

    def published(self, done: int, total: int) -> None:
        pass

    def consumed(self, done: int, total: int, counters: Any) -> None:
        pass

    def close(self) -> None:
        pass


class RichDisplay:
    """Two progress bars: confirmed publishes, and rows consumed by the Spark stream."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = Console()
        self.progress = Progress(
            TextColumn("{task.description:<14}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[extra]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._publish = self.progress.add_task("confirmed", total=None, extra="", start=False)
        self._consume = self.progress.add_task("Spark consumed", total=None, extra="", start=False)
        # Started with the first number: Spark's JVM writes to the terminal while it
        # starts, which would tear a live display.
        self._live = False

    def _start(self) -> None:
        if not self._live:
            self._live = True
            self.progress.start()

    def step(self, text: str) -> None:
        self.progress.console.print(f"[dim]•[/] {text}")

    def published(self, done: int, total: int) -> None:
        self._start()
        self.progress.start_task(self._publish)
        self.progress.update(self._publish, completed=done, total=total)

    def consumed(self, done: int, total: int, counters: Any) -> None:
        self._start()
        if done:
            self.progress.start_task(self._consume)
        extra = (
            f"ok {counters.aggregated_rows:,} retried {counters.retried:,} "
            f"parked {counters.parked_invalid + counters.parked_failing:,}"
            if done
            else "first micro-batch running (Spark warms up)"
        )
        self.progress.update(self._consume, completed=done, total=max(total, done), extra=extra)

    def close(self) -> None:
        self.progress.stop()  # idempotent


def make_display(progress: bool) -> Display:
    return RichDisplay() if progress else QuietDisplay()

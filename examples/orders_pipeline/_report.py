"""Progress bars while the pipeline runs, and the summary table at the end (rich)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._pipeline import Summary

__all__ = ["Display", "QuietDisplay", "RichDisplay", "make_display", "summary_rows"]


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


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f} msg/s" if seconds > 0 else "-"


def summary_rows(summary: Summary) -> list[tuple[str, str, str]]:
    """(what, number, note) rows of the summary table."""
    s = summary
    return [
        ("published", f"{s.published:,}", f"{s.expected_duplicates:,} deliberate duplicates"),
        ("confirmed by the broker", f"{s.confirmed:,}", _rate(s.confirmed, s.publish_seconds)),
        ("unroutable (alternate exchange)", f"{s.unroutable:,}", s.names.unrouted),
        ("consumed by Spark", f"{s.consumed:,}", f"retries included, {s.batches} batches"),
        ("  source: body bytes", f"{s.body_bytes:,}", "of the rows after dedup"),
        ("  source: redelivered", f"{s.redelivered:,}", "rows the broker flagged redelivered"),
        ("  sink: moves published", f"{s.moves_published:,}", "retries and parked, all confirmed"),
        ("duplicates dropped", f"{s.duplicates_dropped:,}", "by message_id"),
        ("orders aggregated", f"{s.aggregated:,}", f"{s.recovered:,} of them after a retry"),
        ("retries (retry tiers)", f"{s.retried:,}", "transient enrichment failures"),
        ("parked: invalid", f"{s.parked_invalid:,}", "malformed JSON or a broken rule"),
        ("parked: still failing", f"{s.parked_failing:,}", "after max attempts"),
        ("lost", f"{s.lost:,}", "must be 0"),
        ("revenue rows", f"{s.revenue_rows:,}", f"{s.revenue_eur:,.2f} EUR in total"),
        ("publish time", f"{s.publish_seconds:.1f} s", ""),
        ("first batch done after", f"{s.first_batch_seconds:.1f} s", "Spark start-up included"),
        ("time in micro-batches", f"{s.batch_seconds:.1f} s", _rate(s.consumed, s.batch_seconds)),
        ("elapsed", f"{s.elapsed_seconds:.1f} s", _rate(s.consumed, s.elapsed_seconds)),
    ]


def print_summary(summary: Summary, kept: bool) -> None:
    """Print the summary table, where the output is, and the verdict."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"orders pipeline, run {summary.run_id}")
    table.add_column("")
    table.add_column("count", justify="right")
    table.add_column("")
    for what, number, note in summary_rows(summary):
        style = "bold red" if what == "lost" and summary.lost else None
        table.add_row(what, number, note, style=style)
    console.print(table)
    console.print(f"orders (Parquet):  {summary.orders_path}")
    console.print(f"revenue (Parquet): {summary.revenue_path}")
    work = summary.names.work
    if kept:
        console.print(
            f"parking lot:       {work}.parking-lot (kept: `rabbitry dlq inspect {work}`)"
        )
    verdict = "[bold green]OK[/]" if summary.ok else "[bold red]FAILED[/]"
    console.print(f"{verdict}: every message is accounted for" if summary.ok else verdict)

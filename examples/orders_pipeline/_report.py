"""The summary table printed at the end of a run (rich)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._pipeline import Summary

__all__ = ["print_summary", "summary_rows"]


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
        *(
            [("  source: super stream", f"{s.partitions} partitions", s.names.exchange)]
            if s.partitions is not None
            else []
        ),
        ("  source: body bytes", f"{s.body_bytes:,}", "of the rows after dedup"),
        ("  source: redelivered", f"{s.redelivered:,}", "rows the broker flagged redelivered"),
        ("  moves published", f"{s.moves_published:,}", "retries and parked, all confirmed"),
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
        (
            "  after the first batch",
            f"{s.steady_seconds:.1f} s",
            f"{_rate(s.steady_rows, s.steady_seconds)}, {s.steady_rows:,} rows",
        ),
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

"""The reference pipeline behind ``make demo``: orders through RabbitMQ into Spark.

1. Declares the topology: a topic exchange with an alternate exchange (nothing
   unroutable is lost), a work queue, its retry tiers and its parking lot
   (:class:`rabbitry.topology.RetryPolicy`).
2. Publishes a generated stream of order events with publisher confirms (asyncio
   API), a few percent of them malformed, invalid, failing, unroutable or duplicated.
3. Runs a PySpark Structured Streaming job (local mode) reading the work queue through
   ``format("rabbitmq")`` (or, with ``--partitions N``, every partition of a super
   stream the orders are published to by customer): parse and validate, drop
   duplicates by ``message_id``, convert to EUR (the step whose transient failures are
   retried), write the orders to Parquet, send retries and parked records back through
   the ``rabbitmq`` sink.
4. Aggregates revenue per category per minute into Parquet and prints a summary.

It is an application built on rabbitry, not part of the installed package: it lives in
the repository's ``examples/`` folder and is imported as ``orders_pipeline`` with that
folder on the path. Run it with ``make demo``, or from the repository root with
``PYTHONPATH=examples python -m orders_pipeline --help`` (needs
``pip install 'rabbitry[spark,cli]'`` and Java 17+). Design, guarantees and measured
timings: ``docs/pipeline.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ._events import FAULT_HEADER, Event, EventPlan, Mix, generate
from ._pipeline import (
    InvalidOrder,
    Names,
    PipelineConfig,
    PipelineError,
    RateServiceUnavailable,
    Summary,
    build_topology,
    java_problem,
    run,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "FAULT_HEADER",
    "Event",
    "EventPlan",
    "InvalidOrder",
    "Mix",
    "Names",
    "PipelineConfig",
    "PipelineError",
    "RateServiceUnavailable",
    "Summary",
    "build_topology",
    "generate",
    "main",
    "run",
]


def _parser() -> argparse.ArgumentParser:
    defaults = PipelineConfig(run_id="x")
    parser = argparse.ArgumentParser(
        prog="python -m orders_pipeline",
        description="Publish order events with confirms, process them with a Spark "
        "streaming job reading RabbitMQ, retry and park failures, write Parquet.",
    )
    parser.add_argument("--url", default=defaults.url, help="broker URL (RABBITMQ_URL)")
    parser.add_argument(
        "-n", "--events", type=int, default=defaults.events, help="messages to publish"
    )
    parser.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="rows per micro-batch"
    )
    parser.add_argument("--output", type=Path, default=defaults.output_dir, help="output directory")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="generator seed")
    parser.add_argument("--run-id", help="names the run's queues and output (default: random)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the queues (and parked messages) afterwards"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--master", default=defaults.master, help="Spark master")
    parser.add_argument(
        "--partitions",
        type=int,
        metavar="N",
        help="orders through a super stream of N partitions (keyed by customer) instead "
        "of the work queue",
    )
    parser.add_argument(
        "--dedup-window",
        type=float,
        default=defaults.dedup_window,
        metavar="SECONDS",
        help="how long the stream remembers a message id to drop its copies (default %(default)g)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the pipeline from the command line; returns the exit code.

    0: every message accounted for; 1: something was lost or miscounted; 2: the
    environment is not ready (no Java, no pyspark, bad arguments).
    """
    args = _parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    problem = java_problem()
    if problem is None:
        try:
            import pyarrow  # noqa: F401
            import pyspark  # noqa: F401
            import rich  # noqa: F401
        except ImportError as exc:
            problem = (
                f"{exc.name} is not installed; the demo needs "
                "pip install 'rabbitry[spark,cli]' (make demo installs it)"
            )
    if problem is not None:
        print(f"orders pipeline: {problem}", file=sys.stderr)
        return 2
    try:
        config = PipelineConfig(
            url=args.url,
            events=args.events,
            batch_size=args.batch_size,
            output_dir=args.output,
            seed=args.seed,
            keep_topology=args.keep,
            progress=not args.quiet,
            master=args.master,
            partitions=args.partitions,
            dedup_window=args.dedup_window,
            **({"run_id": args.run_id} if args.run_id else {}),
        )
    except ValueError as exc:
        print(f"orders pipeline: {exc}", file=sys.stderr)
        return 2
    from ._report import print_summary

    summary = run(config)
    print_summary(summary, kept=config.keep_topology)
    return 0 if summary.ok else 1

"""PySpark names that differ across Spark 4.x, with stand-ins where a version lacks them.

Admission control and AvailableNow for Python sources came with Spark 4.2; the Arrow
stream writer with Spark 4.1.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamWriter

__all__ = [
    "STREAM_ARROW",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxRows",
    "StreamWriterBase",
    "SupportsTriggerAvailableNow",
]

try:  # Spark 4.2+: admission control and AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    ReadLimit = object  # type: ignore[assignment,misc]
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in: Spark < 4.2 runs AvailableNow as a single batch."""


try:  # Spark 4.1+
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as StreamWriterBase

    STREAM_ARROW = True
except ImportError:  # pragma: no cover - Spark 4.0
    StreamWriterBase = DataSourceStreamWriter  # type: ignore[assignment,misc]
    STREAM_ARROW = False

"""The Spark data source's errors: in rabbitry's tree, with their old bases, picklable."""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING

import pytest

import rabbitry.spark as spark_module
from rabbitry import _errors_spark
from rabbitry.exceptions import (
    AMQPConnectionError,
    AMQPError,
    ConfigurationError,
    InvalidStateError,
    PublishError,
)

if TYPE_CHECKING:
    from collections.abc import Callable

# Each error, the bases it must keep (builtin ones from before it joined the tree
# included), and an instance as the data source raises it.
CASES: list[tuple[BaseException, tuple[type[BaseException], ...]]] = [
    (_errors_spark.SourceCancelled("cancelled"), (AMQPError, RuntimeError)),
    (_errors_spark.BrokerUnavailable("gone"), (AMQPConnectionError, RuntimeError)),
    (_errors_spark.ReplayUnavailable("held"), (InvalidStateError, RuntimeError)),
    (_errors_spark.DataLossError("retention"), (AMQPError, RuntimeError)),
    (_errors_spark.QueueBusy("consumer"), (InvalidStateError, RuntimeError)),
    (_errors_spark.DeliveryCountRefused("opt in"), (ConfigurationError, ValueError)),
    (
        _errors_spark.DeliveryLimitReached("limit", queue="q", limit=20),
        (AMQPError, RuntimeError),
    ),
    (
        _errors_spark.DeliveryLimitRefused("refused", queue="q", limit=5),
        (_errors_spark.DeliveryLimitReached, AMQPError, RuntimeError),
    ),
    (_errors_spark.ReadInterrupted("recovered"), (AMQPError, RuntimeError)),
    (_errors_spark.PublishFailed("not confirmed"), (PublishError, RuntimeError)),
    (
        _errors_spark.UnroutableRows("returned", 3, {("ex", "key"): 3}),
        (_errors_spark.PublishFailed, PublishError, RuntimeError),
    ),
]


def test_every_error_of_the_module_is_covered() -> None:
    assert sorted(type(error).__name__ for error, _ in CASES) == sorted(_errors_spark.__all__)


@pytest.mark.parametrize(("error", "bases"), CASES, ids=lambda c: type(c).__name__)
def test_error_keeps_its_bases_and_survives_pickling(
    error: BaseException, bases: tuple[type[BaseException], ...]
) -> None:
    for base in bases:
        assert isinstance(error, base)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)


def test_errors_are_importable_where_they_were() -> None:
    from rabbitry.spark import _batch, _core, _restart, _streams, _write

    modules = {
        "SourceCancelled": _core,
        "BrokerUnavailable": _core,
        "PublishFailed": _core,
        "ReplayUnavailable": _core,
        "QueueBusy": _batch,
        "DeliveryCountRefused": _batch,
        "DeliveryLimitReached": _batch,
        "ReadInterrupted": _batch,
        "DataLossError": _streams,
        "DeliveryLimitRefused": _restart,
        "UnroutableRows": _write,
    }
    for name, module in modules.items():
        cls = getattr(_errors_spark, name)
        assert getattr(module, name) is cls
        assert getattr(spark_module, name) is cls


def test_a_refused_envelope_row_is_not_reported_as_a_publishing_failure(
    url: str, make_queue: Callable[..., str]
) -> None:
    """PublishFailed is an AMQPError now: the write's ``except AMQPError`` lets it through
    as it is instead of wrapping it in a "publishing failed" error."""
    pytest.importorskip("pyarrow")
    from rabbitry.spark._options import parse_write_options
    from rabbitry.spark._write import publish_rows

    options = parse_write_options({"url": url, "routingKey": make_queue(), "batchRecords": "4"})
    with pytest.raises(_errors_spark.PublishFailed) as caught:
        publish_rows(options, [{"body": b"x", "headers": {"a": "b"}}], "job:4", 4, 0)
    assert str(caught.value).startswith("option batchRecords: row 0 has a 'headers'")
    assert caught.value.__cause__ is None

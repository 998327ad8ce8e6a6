"""The Spark data source's errors: in rabbitry's tree, builtins too, picklable."""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING

import pytest

import rabbitry.spark as spark_module
from rabbitry import exceptions as rabbitry_exceptions
from rabbitry.exceptions import (
    AMQPConnectionError,
    AMQPError,
    ConfigurationError,
    InvalidStateError,
    PublishError,
)
from rabbitry.exceptions import _spark as spark_errors

if TYPE_CHECKING:
    from collections.abc import Callable

# Each error, the bases it has (builtin ones included, so ``except RuntimeError`` and
# ``except ValueError`` catch it), and an instance as the data source raises it.
CASES: list[tuple[BaseException, tuple[type[BaseException], ...]]] = [
    (rabbitry_exceptions.SourceCancelled("cancelled"), (AMQPError, RuntimeError)),
    (rabbitry_exceptions.BrokerUnavailable("gone"), (AMQPConnectionError, RuntimeError)),
    (rabbitry_exceptions.ReplayUnavailable("held"), (InvalidStateError, RuntimeError)),
    (rabbitry_exceptions.DataLossError("retention"), (AMQPError, RuntimeError)),
    (rabbitry_exceptions.QueueBusy("consumer"), (InvalidStateError, RuntimeError)),
    (rabbitry_exceptions.DeliveryCountRefused("opt in"), (ConfigurationError, ValueError)),
    (
        rabbitry_exceptions.DeliveryLimitReached("limit", queue="q", limit=20),
        (AMQPError, RuntimeError),
    ),
    (
        rabbitry_exceptions.DeliveryLimitRefused("refused", queue="q", limit=5),
        (rabbitry_exceptions.DeliveryLimitReached, AMQPError, RuntimeError),
    ),
    (rabbitry_exceptions.ReadInterrupted("recovered"), (AMQPError, RuntimeError)),
    (rabbitry_exceptions.PublishFailed("not confirmed"), (PublishError, RuntimeError)),
    (
        rabbitry_exceptions.UnroutableRows("returned", 3, {("ex", "key"): 3}),
        (rabbitry_exceptions.PublishFailed, PublishError, RuntimeError),
    ),
]


def test_every_error_of_the_module_is_covered() -> None:
    assert sorted(type(error).__name__ for error, _ in CASES) == sorted(spark_errors.__all__)


@pytest.mark.parametrize(("error", "bases"), CASES, ids=lambda c: type(c).__name__)
def test_error_has_its_bases_and_survives_pickling(
    error: BaseException, bases: tuple[type[BaseException], ...]
) -> None:
    for base in bases:
        assert isinstance(error, base)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)


def test_errors_are_importable_from_the_spark_modules_that_raise_them() -> None:
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
        cls = getattr(rabbitry_exceptions, name)
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
    with pytest.raises(rabbitry_exceptions.PublishFailed) as caught:
        publish_rows(options, [{"body": b"x", "headers": {"a": "b"}}], "job:4", 4, 0)
    assert str(caught.value).startswith("option batchRecords: row 0 has a 'headers'")
    assert caught.value.__cause__ is None

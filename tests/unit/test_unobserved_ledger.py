"""The ledger of failed publishes nobody looked at, and the properties given as a mapping."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import pickle

import pytest

from rabbitry import Properties
from rabbitry.exceptions import (
    LocalProtocolError,
    Nacked,
    PublishRefused,
    UnobservedPublishFailures,
)
from rabbitry.publisher import OutgoingMessage, as_properties
from rabbitry.publishing import unobserved
from rabbitry.publishing.unobserved import UnobservedLedger
from rabbitry.sync._portal import ConfirmFuture


@pytest.fixture(autouse=True)
def _fresh_log_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ERROR lines are rate-limited per process: each test starts a new interval."""
    monkeypatch.setattr(unobserved, "_LIMIT", unobserved._LogLimit())


async def test_asyncio_futures_count_until_retrieved_and_watched_ones_never() -> None:
    loop = asyncio.get_running_loop()
    ledger = UnobservedLedger("AsyncPublisher")
    forgotten, retrieved, awaited = (loop.create_future() for _ in range(3))
    awaiting = asyncio.ensure_future(awaited)
    await asyncio.sleep(0)  # the task waits on the future: a done-callback
    for n, future in enumerate((forgotten, retrieved, awaited), 1):
        ledger.fail(future, Nacked(n))
    assert retrieved.exception() is not None
    with pytest.raises(Nacked):
        await awaiting
    assert ledger.pending() == 1
    with pytest.raises(UnobservedPublishFailures) as caught:
        ledger.report()
    assert caught.value.count == 1
    assert caught.value.failures == [forgotten.exception()]
    assert "Nacked" in str(caught.value) and "#1" in str(caught.value)
    ledger.report()  # reported once; the ledger then records nothing more
    ledger.fail(loop.create_future(), Nacked(4))
    ledger.report()


def test_confirm_futures_count_until_result_exception_or_a_callback() -> None:
    ledger = UnobservedLedger("Publisher")
    futures = [ConfirmFuture[None]() for _ in range(4)]
    futures[3].add_done_callback(lambda f: None)
    for n, future in enumerate(futures, 1):
        ledger.fail(future, Nacked(n))
    with pytest.raises(Nacked):
        futures[1].result()
    assert futures[2].exception() is not None
    with pytest.raises(UnobservedPublishFailures) as caught:
        ledger.report()
    assert caught.value.count == 1 and caught.value.first is futures[0].exception()


def test_other_settleables_are_not_recorded() -> None:
    ledger = UnobservedLedger("AsyncPublisher")
    plain: concurrent.futures.Future[None] = concurrent.futures.Future()
    ledger.fail(plain, Nacked(1))  # not a future of the publishers: its caller reads it
    ledger.report()


def test_report_without_raising_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    ledger = UnobservedLedger("Publisher")
    for n in range(5):
        ledger.fail(ConfirmFuture[None](), Nacked(n))
    ledger.report(raise_error=False)
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    message = record.getMessage()
    assert "Publisher ended with 5 failed publishes" in message
    assert "(and 2 more)" in message and message.count("Nacked") == 3


def test_a_full_ledger_counts_what_it_does_not_keep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unobserved, "KEEP", 3)
    ledger = UnobservedLedger("Publisher")
    futures = [ConfirmFuture[None]() for _ in range(5)]
    for n, future in enumerate(futures):
        ledger.fail(future, Nacked(n))
    with pytest.raises(UnobservedPublishFailures) as caught:
        ledger.report(raise_error=True)
    assert caught.value.count == 5 and len(caught.value.failures) == 3


def test_a_full_ledger_drops_the_futures_looked_at_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(unobserved, "KEEP", 3)
    ledger = UnobservedLedger("Publisher")
    futures = [ConfirmFuture[None]() for _ in range(4)]
    for n, future in enumerate(futures[:3]):
        ledger.fail(future, Nacked(n))
    futures[0].exception()
    ledger.fail(futures[3], Nacked(3))
    with pytest.raises(UnobservedPublishFailures) as caught:
        ledger.report()
    assert caught.value.count == 3
    assert [e.delivery_tag for e in caught.value.failures] == [1, 2, 3]  # type: ignore[attr-defined]


def test_repeated_reports_are_rate_limited_with_counts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(unobserved._BURST + 3):
        ledger = UnobservedLedger("Publisher")
        ledger.fail(ConfirmFuture[None](), Nacked(1))
        ledger.report(raise_error=False)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(lines) == unobserved._BURST
    unobserved._LIMIT._started -= unobserved._INTERVAL  # the interval is over
    ledger = UnobservedLedger("Publisher")
    ledger.fail(ConfirmFuture[None](), Nacked(1))
    ledger.report(raise_error=False)
    last = caplog.records[-1].getMessage()
    assert "[3 similar reports with 3 failures not logged]" in last


def test_the_error_pickles_with_its_count() -> None:
    refused = [PublishRefused(n, 404, "NOT_FOUND") for n in (1, 2)]
    error = UnobservedPublishFailures(2, refused, "Publisher")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.count, len(copy.failures), str(copy)) == (2, 2, str(error))


# --------------------------------------------------------------------------- properties


def test_properties_from_a_mapping() -> None:
    props = as_properties({"message_id": "a", "headers": {"k": 1}, "delivery_mode": 2})
    assert props == Properties(message_id="a", headers={"k": 1}, delivery_mode=2)
    given = Properties(app_id="x")
    assert as_properties(given) is given
    assert OutgoingMessage(b"x", properties={"type": "t"}).properties == Properties(type="t")


def test_an_unknown_property_names_the_key_and_the_valid_ones() -> None:
    with pytest.raises(LocalProtocolError) as caught:
        as_properties({"message_id": "a", "messageId": "b"})
    assert "'messageId'" in str(caught.value) and "message_id" in str(caught.value)
    assert isinstance(caught.value, ValueError)
    with pytest.raises(LocalProtocolError, match="unknown property 'id'"):
        OutgoingMessage(b"x", properties={"id": "a"})


def test_properties_of_another_type_name_the_parameter() -> None:
    with pytest.raises(LocalProtocolError, match=r"properties: must be .* got list"):
        as_properties([("message_id", "a")])  # type: ignore[arg-type]

"""The effective delivery limit of a queue (rabbitry.spark._limits), without a broker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rabbitry.exceptions import ManagementError
from rabbitry.protocol.message import Message
from rabbitry.protocol.spec import BasicProperties
from rabbitry.spark._limits import (
    DeliveryLimit,
    broker_default_limit,
    delivery_count,
    effective_delivery_limit,
)

if TYPE_CHECKING:
    import pytest


@dataclass
class _Info:
    arguments: dict[str, Any] = field(default_factory=dict)
    effective_policy_definition: dict[str, Any] = field(default_factory=dict)


class _Management:
    def __init__(self, info: _Info | Exception) -> None:
        self.info = info
        self.asked: list[tuple[str, str]] = []

    def queue(self, name: str, vhost: str = "/") -> _Info:
        self.asked.append((name, vhost))
        if isinstance(self.info, Exception):
            raise self.info
        return self.info


def _lookup(info: _Info | Exception, version: tuple[int, ...] = (4, 0, 5), **kw: Any) -> Any:
    return effective_delivery_limit(
        "q",
        "quorum",
        version,
        management=_Management(info),  # type: ignore[arg-type]
        **kw,
    )


def test_the_broker_default_is_20_on_4x_and_none_on_3x() -> None:
    assert broker_default_limit((4, 0, 5)) == 20
    assert broker_default_limit((4, 3, 0)) == 20
    assert broker_default_limit((3, 10, 8)) is None
    assert broker_default_limit(()) is None


def test_a_quorum_queue_without_argument_or_policy_has_the_broker_default() -> None:
    assert _lookup(_Info()) == DeliveryLimit("q", 20, "broker-default", server_version=(4, 0, 5))
    assert _lookup(_Info(), (3, 10, 8)).limit is None
    assert _lookup(_Info(), (3, 10, 8)).known


def test_the_smaller_of_argument_and_policy_wins_with_its_dead_letter_target() -> None:
    both = _Info(
        {"x-delivery-limit": 9, "x-dead-letter-exchange": "dlx"},
        {"delivery-limit": 3, "dead-letter-exchange": "other", "dead-letter-routing-key": "k"},
    )
    found = _lookup(both)
    assert (found.limit, found.source) == (3, "policy")
    assert (found.dead_letter_exchange, found.dead_letter_routing_key) == ("dlx", "k")
    arg = _lookup(_Info({"x-delivery-limit": 2}, {"delivery-limit": 5}))
    assert (arg.limit, arg.source, arg.dead_letter_exchange) == (2, "argument", None)


def test_a_management_error_falls_back_to_the_stated_limit_then_to_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = ManagementError(None, "connection refused")
    stated = _lookup(down, stated=7)
    assert (stated.limit, stated.source) == (7, "option")
    unknown = _lookup(down)
    assert (unknown.limit, unknown.source, unknown.known) == (None, "unknown", False)
    assert "could not read the delivery limit of queue 'q'" in caplog.text
    assert "unknown" in unknown.describe() and "20 by default on RabbitMQ 4.x" in unknown.describe()


def test_without_management_the_stated_limit_is_used_else_unknown() -> None:
    assert effective_delivery_limit("q", "quorum", (4, 0, 5), stated=5).limit == 5
    assert effective_delivery_limit("q", "quorum", (4, 0, 5)).source == "unknown"
    assert effective_delivery_limit("q", "classic", (4, 0, 5)).source == "not-quorum"
    assert effective_delivery_limit("q", "classic", (4, 0, 5)).can_return(10_000)


def test_a_message_is_never_returned_onto_its_limit() -> None:
    # Measured: with limit 2 the deliveries carry counts None, 1, 2 and the 3rd return
    # removes the message. With one return kept in hand, counts 0 and 1... stop at 0.
    limit = DeliveryLimit("q", 2, "argument")
    assert [limit.can_return(c) for c in range(4)] == [True, False, False, False]
    assert [limit.can_return(c, spare=0) for c in range(4)] == [True, True, False, False]
    assert [limit.returns_left(c) for c in range(4)] == [2, 1, 0, 0]
    default = DeliveryLimit("q", 20, "broker-default")
    assert default.can_return(18) and not default.can_return(19)
    assert not DeliveryLimit("q", None, "unknown").can_return(0)
    assert DeliveryLimit("q", None, "broker-default").can_return(10_000)
    assert "dropped (no dead-letter exchange)" in limit.describe()


def test_delivery_count_reads_the_header() -> None:
    first = Message(b"x", properties=BasicProperties())
    again = Message(b"x", properties=BasicProperties(headers={"x-delivery-count": 4}))
    assert (delivery_count(first), delivery_count(again)) == (0, 4)

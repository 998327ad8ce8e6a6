"""The modules Topology delegates to, without a broker: the retry entities it adds
(``_retry_build``), the checks its broker operations make before sending anything
(``_on_broker``) and the reading of 406 replies (``_conflicts``)."""

from __future__ import annotations

import asyncio

import pytest

from rabbitry.exceptions import TopologyValidationError
from rabbitry.topology import (
    Binding,
    Exchange,
    Policy,
    Queue,
    RetryPolicy,
    Topology,
    _apply,
    _conflicts,
    _on_broker,
    _retry,
    _retry_policy,
    parse_inequivalent,
)
from rabbitry.topology._base import TopologyData
from rabbitry.topology._retry_build import build_retry


def _work() -> Topology:
    return Topology([Exchange("app", "topic")], [Queue("jobs")], [Binding("app", "jobs", "#")])


def test_build_retry_builds_the_class_it_is_given() -> None:
    policy = RetryPolicy([0.1, 0.5], max_attempts=4)
    built = build_retry(Topology, _work(), "jobs", policy)
    assert type(built) is Topology
    assert built == _work().with_retry("jobs", policy)
    data = build_retry(TopologyData, _work(), "jobs", policy)
    assert type(data) is TopologyData
    assert (data.exchanges, data.queues, data.bindings) == (
        built.exchanges,
        built.queues,
        built.bindings,
    )


def test_build_retry_checks_the_work_queue() -> None:
    with pytest.raises(TopologyValidationError, match="not in this topology"):
        build_retry(Topology, _work(), "other", RetryPolicy([1]))
    stream = Topology(queues=[Queue("s", queue_type="stream")])
    with pytest.raises(TopologyValidationError, match="stream queues cannot dead-letter"):
        build_retry(Topology, stream, "s", RetryPolicy([1]))


@pytest.mark.parametrize(
    ("method", "twin"), [("apply", "aapply"), ("verify", "averify"), ("delete", "adelete")]
)
def test_blocking_operations_refuse_other_connections(method: str, twin: str) -> None:
    topology = Topology(policies=[Policy("p", "^x$", definition={"max-length": 1})])
    with pytest.raises(TypeError) as caught:
        getattr(topology, method)(object())
    assert str(caught.value) == (
        f"Topology.{method}() takes a rabbitry.Connection; use await topology.{twin}"
        "(connection) with an AsyncConnection"
    )
    with pytest.raises(TypeError, match=rf"Topology\.{method}\(\)"):
        getattr(_on_broker, method)(
            topology,
            object(),
            timeout=None,
            management=None,
            **({} if method == "delete" else {"missing_exchanges": "error"}),
        )


def test_async_operations_refuse_a_thread_safe_connection() -> None:
    from rabbitry import Connection

    connection = Connection.__new__(Connection)
    for method, twin in (("aapply", "apply"), ("averify", "verify"), ("adelete", "delete")):
        with pytest.raises(TypeError) as caught:
            asyncio.run(getattr(Topology(), method)(connection))
        assert str(caught.value) == (
            f"Topology.{method}() takes an AsyncConnection; use topology.{twin}(connection) "
            "with a rabbitry.Connection"
        )


def test_retry_and_apply_keep_their_names() -> None:
    # The rules moved to _retry_policy and the 406 parsers to _conflicts; the modules
    # they left still offer them.
    for name in _retry_policy.__all__:
        assert getattr(_retry, name) is getattr(_retry_policy, name)
    assert "handle_failure" in _retry.__all__
    assert _apply.parse_inequivalent is _conflicts.parse_inequivalent is parse_inequivalent
    assert _apply.value_from_reply is _conflicts.value_from_reply

"""The broker's version and capabilities from connection.start, and the client-side
``max_message_size`` that follows them (rabbitry.broker, ConnectionProtocol)."""

from __future__ import annotations

from typing import Any

import pytest
from broker_peer import Pair

from rabbitry.broker import (
    RABBITMQ_3_MAX_MESSAGE_SIZE,
    RABBITMQ_4_MAX_MESSAGE_SIZE,
    default_max_message_size,
    server_capabilities,
    server_version,
)
from rabbitry.exceptions import LocalProtocolError, MessageTooLarge

MiB = 1024 * 1024


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("3.10.8", (3, 10, 8)),
        (b"4.0.5", (4, 0, 5)),
        ("4.0.5+dfsg", (4, 0, 5)),
        ("4.1.0-beta.3", (4, 1, 0)),
        ("4", (4,)),
        ("", ()),
        ("unknown", ()),
        (None, ()),
        (42, ()),
    ],
)
def test_server_version_reads_the_leading_numbers(version: Any, expected: tuple[int, ...]) -> None:
    assert server_version({"version": version}) == expected


def test_server_version_without_a_version_is_empty() -> None:
    assert server_version({}) == ()


def test_server_capabilities() -> None:
    props = {"capabilities": {"publisher_confirms": True, "per_consumer_qos": 1, "x": False}}
    assert server_capabilities(props) == {
        "publisher_confirms": True,
        "per_consumer_qos": True,
        "x": False,
    }
    assert server_capabilities({}) == {}
    assert server_capabilities({"capabilities": "nonsense"}) == {}


def test_default_max_message_size_by_version() -> None:
    assert RABBITMQ_4_MAX_MESSAGE_SIZE == 16 * MiB
    assert RABBITMQ_3_MAX_MESSAGE_SIZE == 128 * MiB
    assert default_max_message_size((4, 0, 5)) == 16 * MiB
    assert default_max_message_size((4,)) == 16 * MiB
    assert default_max_message_size((3, 13, 7)) == 128 * MiB
    assert default_max_message_size(()) == 128 * MiB


@pytest.mark.parametrize(
    ("version", "limit"), [("3.10.8", 128 * MiB), ("4.0.5", 16 * MiB), (None, 128 * MiB)]
)
def test_max_message_size_follows_the_broker_by_default(version: str | None, limit: int) -> None:
    pair = Pair()
    assert pair.client.max_message_size == 128 * MiB  # before connection.start
    props: dict[str, Any] = {"product": "RabbitMQ"}
    if version is not None:
        props["version"] = version
    pair.handshake(server_properties=props)
    assert pair.client.server_version == server_version(props)
    assert pair.client.max_message_size == limit


@pytest.mark.parametrize("given", [0, 1000, 512 * MiB])
def test_an_explicit_max_message_size_is_kept(given: int) -> None:
    pair = Pair(max_message_size=given)
    pair.handshake(server_properties={"product": "RabbitMQ", "version": "4.0.5"})
    assert pair.client.max_message_size == given


def test_a_body_above_the_brokers_limit_is_refused_before_sending() -> None:
    pair = Pair()
    pair.handshake(server_properties={"product": "RabbitMQ", "version": "4.0.5"})
    channel = pair.open_channel()
    with pytest.raises(MessageTooLarge) as info:
        channel.publish("", "q", b"x" * (16 * MiB + 1))
    assert isinstance(info.value, LocalProtocolError)
    assert (info.value.size, info.value.limit) == (16 * MiB + 1, 16 * MiB)
    assert "max_message_size 16777216 (16 MiB)" in str(info.value)
    pair.assert_nothing_sent()

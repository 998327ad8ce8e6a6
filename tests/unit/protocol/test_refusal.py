"""Which unconfirmed publish a refusing channel.close names (``protocol/_refusal.py``)."""

from __future__ import annotations

import pytest

from rabbitry.protocol import spec
from rabbitry.protocol._refusal import (
    PublishSummary,
    is_publish_refusal,
    refused_index,
    summarize,
)
from rabbitry.protocol.frames import content_frames, method_frame


def publish(exchange: str, body: bytes = b"x", **properties: object) -> PublishSummary | None:
    head = method_frame(1, spec.BasicPublish(exchange=exchange, routing_key="k"))
    props = spec.BasicProperties(**properties).encode()  # type: ignore[arg-type]
    frames = content_frames(1, 60, props, body, 0)
    return summarize(head, frames[1])


def test_summary_reads_exchange_size_and_properties_from_the_frames() -> None:
    summary = publish("orders", b"12345", user_id="bob")
    assert summary is not None
    assert (summary.exchange, summary.size) == ("orders", 5)
    assert summary.properties.user_id == "bob"


def test_summary_of_bytes_that_are_not_a_publish_is_none() -> None:
    assert summarize(b"\x01\x00", b"") is None


@pytest.mark.parametrize(
    ("code", "class_id", "method_id", "expected"),
    [(404, 60, 40, True), (406, 60, 40, True), (404, 50, 10, False), (200, 60, 40, False)],
)
def test_only_a_close_naming_basic_publish_is_a_refusal(
    code: int, class_id: int, method_id: int, expected: bool
) -> None:
    assert is_publish_refusal(code, class_id, method_id) is expected


@pytest.mark.parametrize(
    ("text", "index"),
    [
        ("NOT_FOUND - no exchange 'b' in vhost '/'", 1),
        ("ACCESS_REFUSED - access to exchange 'c' in vhost '/' refused for user 'u'", 2),
        ("ACCESS_REFUSED - cannot publish to internal exchange 'c' in vhost '/'", 2),
        ("ACCESS_REFUSED - write access to topic 'k' in exchange 'b' in vhost '/' refused", 1),
        ("PRECONDITION_FAILED - message size 3 is larger than configured max size 2", 2),
        ("PRECONDITION_FAILED - user_id property set to 'eve' but authenticated user was", 1),
        ("PRECONDITION_FAILED - invalid message: {delivery_mode_unknown,2}", 0),
    ],
)
def test_the_first_unconfirmed_publish_the_text_names_is_the_refused_one(
    text: str, index: int
) -> None:
    candidates = [
        publish("a", b"x", delivery_mode=2),
        publish("b", b"xx", user_id="eve"),
        publish("c", b"xxx"),
        publish("b", b"xxx", user_id="eve"),
    ]
    assert refused_index(text, candidates) == index


def test_a_text_naming_no_unconfirmed_publish_attributes_nothing() -> None:
    assert refused_index("NOT_FOUND - no exchange 'z'", [publish("a")]) is None


def test_an_unrecognised_text_attributes_only_a_lone_publish() -> None:
    assert refused_index("PRECONDITION_FAILED - something new", [publish("a")]) == 0
    assert refused_index("PRECONDITION_FAILED - something new", [None]) == 0
    assert refused_index("PRECONDITION_FAILED - something new", [publish("a"), None]) is None

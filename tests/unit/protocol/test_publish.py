"""PublishEncoder and ConfirmTracker (rabbitry.protocol.publish): the frames of a
basic.publish byte for byte, and the settling of publisher confirms."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pytest
from broker_peer import Pair

from rabbitry.exceptions import LocalProtocolError, MessageTooLarge
from rabbitry.protocol import spec
from rabbitry.protocol.frames import FRAME_OVERHEAD, FrameReader, method_frame
from rabbitry.protocol.publish import (
    ConfirmTracker,
    PublishEncoder,
    properties_prefix,
    publish_key,
    publish_parts,
    retarget,
)

END = b"\xce"


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + END


def shortstr(text: str) -> bytes:
    raw = text.encode()
    return bytes((len(raw),)) + raw


def publish_frame(channel: int, exchange: str, routing_key: str, bits: int) -> bytes:
    payload = struct.pack(">HHH", 60, 40, 0) + shortstr(exchange) + shortstr(routing_key)
    return frame(1, channel, payload + bytes((bits,)))


def header_frame(channel: int, size: int, properties: bytes) -> bytes:
    return frame(2, channel, struct.pack(">HHQ", 60, 0, size) + properties)


def wire(frames: list[bytes]) -> bytes:
    return b"".join(bytes(f) for f in frames)


# --------------------------------------------------------------------------- frames


def test_plain_publish_is_byte_exact() -> None:
    frames = PublishEncoder(3, 131072).encode("ex", "rk", b"hello")
    assert wire(frames) == (
        publish_frame(3, "ex", "rk", 0) + header_frame(3, 5, b"\x00\x00") + frame(3, 3, b"hello")
    )


@pytest.mark.parametrize(
    ("properties", "encoded"),
    [
        (spec.BasicProperties(), b"\x00\x00"),
        (
            spec.BasicProperties(content_type="text/plain", delivery_mode=2),
            b"\x90\x00" + shortstr("text/plain") + b"\x02",
        ),
        (
            spec.BasicProperties(delivery_mode=1, expiration="60000", message_id="m-1"),
            b"\x11\x80\x01" + shortstr("60000") + shortstr("m-1"),
        ),
        (
            spec.BasicProperties(
                headers={"a": 1}, priority=9, timestamp=datetime(2024, 1, 1, tzinfo=UTC)
            ),
            b"\x28\x40"
            + struct.pack(">I", 7)
            + shortstr("a")
            + b"I"
            + struct.pack(">i", 1)
            + b"\x09"
            + struct.pack(">Q", 1704067200),
        ),
        (
            spec.BasicProperties(app_id="app", user_id="guest", type="t"),
            b"\x00\x38" + shortstr("t") + shortstr("guest") + shortstr("app"),
        ),
    ],
)
def test_property_flags_and_values_are_byte_exact(
    properties: spec.BasicProperties, encoded: bytes
) -> None:
    frames = PublishEncoder(1, 4096).encode("", "q", b"x", properties, mandatory=True)
    assert wire(frames) == (
        publish_frame(1, "", "q", 1) + header_frame(1, 1, encoded) + frame(3, 1, b"x")
    )


@pytest.mark.parametrize(
    ("persistent", "expiration"), [(None, None), (True, None), (False, "0"), (True, "60000")]
)
def test_prefix_with_message_id_equals_the_generic_properties(
    persistent: bool | None, expiration: str | None
) -> None:
    encoder = PublishEncoder(2, 4096)
    fast = encoder.frames(
        "ex", "rk", False, properties_prefix(persistent, expiration), b"body", b"id-7"
    )
    mode = None if persistent is None else (2 if persistent else 1)
    generic = spec.BasicProperties(delivery_mode=mode, expiration=expiration, message_id="id-7")
    assert wire(fast) == wire(encoder.encode("ex", "rk", b"body", generic))


def test_layout_and_helpers() -> None:
    properties = spec.BasicProperties(message_id="m").encode()
    frames = PublishEncoder(4, 4096).frames("orders", "eu.new", True, properties, b"abc")
    assert len(frames) == 7
    assert publish_key(frames[0]) == ("orders", "eu.new", True)
    assert publish_parts(frames) == (properties, b"abc")
    moved = retarget(frames, 300)
    assert wire(moved) == wire(
        PublishEncoder(300, 4096).frames("orders", "eu.new", True, properties, b"abc")
    )


def test_empty_body_is_a_header_only() -> None:
    frames = PublishEncoder(1, 4096).encode("", "q", b"")
    assert len(frames) == 4
    assert wire(frames) == publish_frame(1, "", "q", 0) + header_frame(1, 0, b"\x00\x00")
    assert publish_parts(frames) == (b"\x00\x00", b"")


@pytest.mark.parametrize(("extra", "count"), [(-1, 1), (0, 1), (1, 2), (4088 * 2, 3)])
def test_body_is_split_at_frame_max(extra: int, count: int) -> None:
    body = bytes(range(256)) * 40
    body = (body * 3)[: 4096 - FRAME_OVERHEAD + extra]
    frames = PublishEncoder(9, 4096).encode("", "q", body)
    reader = FrameReader(frame_max=4096)
    parsed = reader.feed(wire(frames))
    assert reader.buffered == 0
    assert [kind for kind, _, _ in parsed] == [1, 2] + [3] * count
    assert all(channel == 9 for _, channel, _ in parsed)
    parts = [payload for kind, _, payload in parsed if kind == 3]
    assert all(len(p) == 4096 - FRAME_OVERHEAD for p in parts[:-1])
    assert b"".join(parts) == body
    assert publish_parts(frames)[1] == body
    assert publish_parts(retarget(frames, 1))[1] == body


def test_no_frame_max_sends_one_body_frame() -> None:
    body = b"z" * 100_000
    frames = PublishEncoder(1, 0).encode("", "q", body)
    assert len(frames) == 7
    assert frames[5] is body


def test_body_types_and_the_message_size_limit() -> None:
    encoder = PublishEncoder(1, 4096, max_message_size=10)
    expected = wire(encoder.encode("", "q", b"abc"))
    for body in (bytearray(b"abc"), memoryview(b"abc"), "abc"):
        assert wire(encoder.encode("", "q", body)) == expected
    assert len(encoder.encode("", "q", b"x" * 10)) == 7
    with pytest.raises(MessageTooLarge):
        encoder.encode("", "q", b"x" * 11)
    with pytest.raises(LocalProtocolError, match=r"basic\.publish\.body"):
        encoder.encode("", "q", 12)  # type: ignore[arg-type]


def test_header_at_frame_max_fits_and_one_byte_more_is_refused() -> None:
    encoder = PublishEncoder(1, 4096)
    fits = b"\x00\x00" + b"\x00" * (4096 - 20 - 2)
    frames = encoder.frames("", "q", False, fits, b"")
    assert len(frames[1]) + len(frames[2]) + len(frames[3]) == 4096
    with pytest.raises(LocalProtocolError, match="headers too large"):
        encoder.frames("", "q", False, fits + b"\x00", b"")


@pytest.mark.parametrize(
    ("exchange", "routing_key", "message_id", "match"),
    [
        ("x" * 256, "q", None, "exchange"),
        ("", "q" * 256, None, "routing_key"),
        ("", "q", b"m" * 256, "message_id"),
    ],
)
def test_invalid_fields_raise_before_anything_is_cached(
    exchange: str, routing_key: str, message_id: bytes | None, match: str
) -> None:
    encoder = PublishEncoder(1, 4096)
    with pytest.raises(LocalProtocolError, match=match):
        encoder.frames(exchange, routing_key, False, b"\x00\x80", b"x", message_id)
    if message_id is None:
        assert not encoder._heads


def test_longest_names_fit_and_a_tiny_frame_max_refuses_the_method_frame() -> None:
    head = PublishEncoder(1, 4096).method_frame("e" * 255, "r" * 255, True)
    assert head == method_frame(
        1, spec.BasicPublish(exchange="e" * 255, routing_key="r" * 255, mandatory=True)
    )
    assert head == publish_frame(1, "e" * 255, "r" * 255, 1)
    with pytest.raises(LocalProtocolError, match="frame_max 64"):
        PublishEncoder(1, 64).encode("e" * 255, "q", b"")


def test_channel_refuses_an_invalid_publish_and_queues_nothing() -> None:
    pair = Pair()
    pair.handshake()
    channel = pair.open_channel()
    pair.client_to_broker()
    with pytest.raises(LocalProtocolError):
        channel.publish("x" * 256, "q", b"body")
    with pytest.raises(LocalProtocolError, match="headers too large"):
        channel.publish("", "q", b"body", spec.BasicProperties(headers={"h": "v" * 200_000}))
    pair.assert_nothing_sent()
    channel.publish("", "q", b"body")
    pair.assert_sent(spec.BasicPublish, channel.channel_id, routing_key="q")


# --------------------------------------------------------------------------- confirms


def tracker() -> tuple[ConfirmTracker[str], list[tuple[str, int, bool]]]:
    settled: list[tuple[str, int, bool]] = []
    out: ConfirmTracker[str] = ConfirmTracker(
        lambda waiter, tag, ack: settled.append((waiter, tag, ack))
    )
    for tag in range(1, 6):
        out.add(tag, f"p{tag}")
    return out, settled


def test_single_ack_settles_that_tag_only() -> None:
    confirms, settled = tracker()
    confirms.confirm(2, False, True)
    assert settled == [("p2", 2, True)]
    assert len(confirms) == 4
    assert 2 not in confirms
    assert [tag for tag, _ in confirms] == [1, 3, 4, 5]


def test_multiple_ack_settles_every_tag_up_to_its_own() -> None:
    confirms, settled = tracker()
    confirms.confirm(3, True, True)
    assert settled == [("p1", 3, True), ("p2", 3, True), ("p3", 3, True)]
    assert list(confirms) == [(4, "p4"), (5, "p5")]


def test_a_confirm_says_whether_anything_is_left_unconfirmed() -> None:
    confirms, _ = tracker()
    assert confirms.confirm(3, True, True) is False
    assert confirms.confirm(5, False, True) is False
    assert confirms.confirm(4, False, False) is True  # a nack settles too


def test_a_settle_that_publishes_again_leaves_something_unconfirmed() -> None:
    confirms: ConfirmTracker[str] = ConfirmTracker(
        lambda waiter, tag, ack: confirms.add(9, "again") if waiter == "p1" else None
    )
    confirms.add(1, "p1")
    assert confirms.confirm(1, False, True) is False
    assert list(confirms) == [(9, "again")]


def test_out_of_order_confirms() -> None:
    confirms, settled = tracker()
    confirms.confirm(4, False, True)
    confirms.confirm(1, False, True)
    confirms.confirm(5, True, True)  # covers 2, 3 and 5; 4 is settled already
    assert settled == [
        ("p4", 4, True),
        ("p1", 1, True),
        ("p2", 5, True),
        ("p3", 5, True),
        ("p5", 5, True),
    ]
    assert not confirms


def test_unknown_and_repeated_tags_are_ignored() -> None:
    confirms, settled = tracker()
    confirms.confirm(9, False, True)
    confirms.confirm(0, True, True)
    confirms.confirm(2, False, True)
    confirms.confirm(2, False, False)
    assert settled == [("p2", 2, True)]
    assert len(confirms) == 4


def test_nack_single_and_multiple() -> None:
    confirms, settled = tracker()
    confirms.confirm(2, False, False)
    confirms.confirm(4, True, False)
    confirms.confirm(5, False, True)
    assert settled == [
        ("p2", 2, False),
        ("p1", 4, False),
        ("p3", 4, False),
        ("p4", 4, False),
        ("p5", 5, True),
    ]
    assert not confirms


def test_take_all_forgets_everything_and_numbering_starts_again() -> None:
    confirms, settled = tracker()
    confirms.confirm(1, False, True)
    assert confirms.take_all() == {2: "p2", 3: "p3", 4: "p4", 5: "p5"}
    assert not confirms
    confirms.confirm(5, True, True)
    assert settled == [("p1", 1, True)]
    # A new channel numbers from 1 again (e.g. the resend after recovery).
    confirms.add(1, "p3")
    confirms.add(2, "p5")
    assert confirms.get(2) == "p5"
    assert set(confirms.tags()) == {1, 2}
    confirms.confirm(2, True, True)
    assert settled[1:] == [("p3", 2, True), ("p5", 2, True)]

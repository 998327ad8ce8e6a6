"""The collaborators of the sans-IO state machines, each on its own: the handshake
answers, the heartbeat clock and the content assembler."""

from __future__ import annotations

import pytest

from rabbitry.exceptions import AuthenticationError, LocalProtocolError, RemoteProtocolError
from rabbitry.protocol import spec
from rabbitry.protocol._content import ContentAssembler
from rabbitry.protocol._handshake import Handshake
from rabbitry.protocol._heartbeat import HeartbeatClock
from rabbitry.protocol.events import Delivery, Event, RpcReply
from rabbitry.protocol.frames import content_frames


def _handshake(**overrides: object) -> Handshake:
    settings: dict[str, object] = {
        "username": "guest",
        "password": "secret",
        "heartbeat": 60,
        "channel_max": 2047,
        "frame_max": 131072,
        "auth_mechanism": "plain",
        "connection_name": None,
        "locale": "en_US",
        "client_properties": None,
    }
    settings.update(overrides)
    return Handshake(**settings)  # type: ignore[arg-type]


def _start(mechanisms: bytes = b"PLAIN AMQPLAIN", major: int = 0) -> spec.ConnectionStart:
    return spec.ConnectionStart(
        version_major=major,
        version_minor=9,
        server_properties={},
        mechanisms=mechanisms,
        locales=b"en_US",
    )


def test_handshake_refuses_an_unknown_mechanism_at_once() -> None:
    with pytest.raises(LocalProtocolError, match="auth_mechanism"):
        _handshake(auth_mechanism="GSSAPI")


def test_handshake_answers_start_with_the_plain_response() -> None:
    handshake = _handshake()
    assert handshake.refusal(_start()) is None
    start_ok = handshake.start_ok()
    assert start_ok.mechanism == "PLAIN"
    assert start_ok.response == b"\x00guest\x00secret"
    assert "secret" not in repr(start_ok)


def test_handshake_refusals() -> None:
    handshake = _handshake(auth_mechanism="EXTERNAL")
    refusal = handshake.refusal(_start())
    assert isinstance(refusal, AuthenticationError)
    assert "EXTERNAL" in str(refusal)
    with pytest.raises(RemoteProtocolError):
        handshake.refusal(_start(major=1))


@pytest.mark.parametrize(
    ("ours", "theirs", "agreed"),
    [
        ((60, 2047, 131072), (30, 0, 0), (30, 2047, 131072)),
        ((0, 0, 0), (60, 2047, 8192), (60, 2047, 8192)),
        ((0, 0, 0), (0, 0, 0), (0, 65535, 0)),
    ],
)
def test_handshake_negotiates_the_lower_non_zero_limits(
    ours: tuple[int, int, int], theirs: tuple[int, int, int], agreed: tuple[int, int, int]
) -> None:
    handshake = _handshake(heartbeat=ours[0], channel_max=ours[1], frame_max=ours[2])
    tune = spec.ConnectionTune(heartbeat=theirs[0], channel_max=theirs[1], frame_max=theirs[2])
    tune_ok = handshake.tune_ok(tune)
    assert (tune_ok.heartbeat, tune_ok.channel_max, tune_ok.frame_max) == agreed


def test_handshake_refuses_a_frame_max_below_the_minimum() -> None:
    with pytest.raises(RemoteProtocolError):
        _handshake().tune_ok(spec.ConnectionTune(channel_max=0, frame_max=1024, heartbeat=0))


def test_heartbeat_clock_measures_silence_from_the_last_traffic() -> None:
    clock = HeartbeatClock()
    assert clock.silence(100.0, rx_paused=False) == (0.0, 0.0)
    clock.tx_seen = True
    assert clock.silence(105.0, rx_paused=False) == (5.0, 0.0)
    assert clock.silence(107.0, rx_paused=True) == (0.0, 2.0)
    clock.rx_seen = True
    assert clock.silence(110.0, rx_paused=False) == (0.0, 5.0)


class _Sink:
    def __init__(self) -> None:
        self.max_message_size = 1000
        self.event_queue: list[Event] = []


def _deliver() -> spec.BasicDeliver:
    return spec.BasicDeliver(
        consumer_tag="c", delivery_tag=1, redelivered=False, exchange="x", routing_key="k"
    )


def test_content_assembler_joins_body_frames_into_one_delivery() -> None:
    sink = _Sink()
    content = ContentAssembler(sink, 5)
    frames = content_frames(5, 60, b"\x00\x00", b"abcdef", 8 + 4)
    header, bodies = frames[1], frames[4::3]
    content.method = _deliver()
    assert content.header(header, ()) is False
    assert len(bodies) == 2
    assert content.body(bytes(bodies[0]), ()) is False
    assert not sink.event_queue
    assert content.body(bytes(bodies[1]), ()) is False  # only a basic.get-ok answers
    (event,) = sink.event_queue
    assert isinstance(event, Delivery)
    assert event.channel == 5
    assert event.message.body == b"abcdef"
    assert content.method is None


def test_content_assembler_answers_a_get_with_an_empty_body() -> None:
    sink = _Sink()
    content = ContentAssembler(sink, 1)
    get_ok = spec.BasicGetOk(
        delivery_tag=1, redelivered=False, exchange="", routing_key="q", message_count=0
    )
    content.method = get_ok
    header = content_frames(1, 60, b"\x00\x00", b"", 0)[1]
    with pytest.raises(RemoteProtocolError, match=r"without a basic\.get"):
        content.header(header, ())
    content.method = get_ok
    assert content.header(header, (spec.BasicGetOk, spec.BasicGetEmpty)) is True
    assert isinstance(sink.event_queue[-1], RpcReply)


def test_content_assembler_refuses_frames_out_of_order_and_oversized_bodies() -> None:
    sink = _Sink()
    content = ContentAssembler(sink, 1)
    with pytest.raises(RemoteProtocolError, match="without a content header"):
        content.body(b"x", ())
    header = content_frames(1, 60, b"\x00\x00", b"x" * 2000, 0)[1]
    with pytest.raises(RemoteProtocolError, match="without a content method"):
        content.header(header, ())
    content.method = _deliver()
    with pytest.raises(RemoteProtocolError, match="max_message_size"):
        content.header(header, ())
    content.reset()
    assert content.method is None

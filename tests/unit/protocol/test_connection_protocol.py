"""ConnectionProtocol driven against the scripted BrokerPeer: handshake, SASL, tune
negotiation, heartbeats with fake time, blocking, closes, update-secret, the
never-raising receive path and channel-number allocation."""

from __future__ import annotations

import itertools
import platform
import struct

import pytest
from broker_peer import BrokerPeer, Pair
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rabbitry.exceptions import (
    AMQPError,
    AuthenticationError,
    ConnectionAccessRefused,
    ConnectionClosedByBroker,
    ConnectionClosedByClient,
    ConnectionForced,
    ConnectionLost,
    HeartbeatTimeout,
    InvalidPath,
    InvalidStateError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
)
from rabbitry.protocol import spec
from rabbitry.protocol.channel import ChannelState
from rabbitry.protocol.connection import (
    CLIENT_CAPABILITIES,
    VERSION,
    ConnectionProtocol,
    ConnectionState,
)
from rabbitry.protocol.events import (
    ChannelClosedEvent,
    ConnectionBlocked,
    ConnectionOpened,
    ConnectionTerminated,
    ConnectionUnblocked,
    Delivery,
    RpcReply,
)
from rabbitry.protocol.frames import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    decode_table,
)

OPEN = ConnectionState.OPEN
CLOSING = ConnectionState.CLOSING
CLOSED = ConnectionState.CLOSED

B = BrokerPeer


def start(mechanisms: str = "PLAIN AMQPLAIN EXTERNAL", major: int = 0, minor: int = 9) -> bytes:
    return B.send_method(
        0,
        spec.ConnectionStart(
            version_major=major,
            version_minor=minor,
            server_properties={"product": "RabbitMQ"},
            mechanisms=mechanisms.encode(),
            locales=b"en_US",
        ),
    )


def tune(channel_max: int = 2047, frame_max: int = 131072, heartbeat: int = 60) -> bytes:
    return B.send_method(
        0, spec.ConnectionTune(channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat)
    )


def started(**client_kwargs: object) -> tuple[Pair, spec.ConnectionStartOk]:
    """A pair after connection.start; returns the start-ok the client sent."""
    pair = Pair(**client_kwargs)
    pair.flush()
    assert pair.broker_to_client(start()) == []
    start_ok = pair.assert_sent(spec.ConnectionStartOk, channel=0)
    assert isinstance(start_ok, spec.ConnectionStartOk)
    return pair, start_ok


def opened(**kwargs: object) -> Pair:
    pair = Pair()
    pair.handshake(**kwargs)  # type: ignore[arg-type]
    return pair


def deliver(channel: int = 1, body: bytes = b"hello", frame_max: int = 131072) -> bytes:
    return B.send_content(
        channel,
        spec.BasicDeliver(consumer_tag="ctag", delivery_tag=1, exchange="", routing_key="q"),
        body,
        frame_max=frame_max,
    )


def only_terminated(events: list) -> AMQPError:
    assert len(events) == 1 and isinstance(events[0], ConnectionTerminated), events
    return events[0].exc


# --------------------------------------------------------------------------- handshake


def test_protocol_header_is_the_first_thing_sent() -> None:
    conn = ConnectionProtocol()
    assert conn.state is ConnectionState.AWAIT_START
    assert conn.data_to_send() == PROTOCOL_HEADER
    assert conn.data_to_send() == b""
    assert conn.events_received() == []
    assert not conn.is_open


def test_start_ok_plain_response() -> None:
    _pair, start_ok = started(username="user", password="pass")
    assert start_ok.mechanism == "PLAIN"
    assert start_ok.response == b"\x00user\x00pass"
    assert start_ok.locale == "en_US"


def test_start_ok_plain_encodes_utf8_credentials() -> None:
    _pair, start_ok = started(username="üser", password="pässword")
    assert start_ok.response == b"\x00" + "üser".encode() + b"\x00" + "pässword".encode()


def test_start_ok_amqplain_response_is_a_table_body() -> None:
    _pair, start_ok = started(username="user", password="pass", auth_mechanism="amqplain")
    assert start_ok.mechanism == "AMQPLAIN"
    response = start_ok.response
    table, end = decode_table(struct.pack(">I", len(response)) + response, 0)
    assert table == {"LOGIN": "user", "PASSWORD": "pass"}
    assert end == 4 + len(response)


def test_start_ok_external_response_is_empty() -> None:
    _pair, start_ok = started(auth_mechanism="EXTERNAL")
    assert start_ok.mechanism == "EXTERNAL"
    assert start_ok.response == b""


def test_unknown_auth_mechanism_is_refused_at_construction() -> None:
    with pytest.raises(LocalProtocolError, match="auth_mechanism"):
        ConnectionProtocol(auth_mechanism="CRAM-MD5")


def test_client_properties() -> None:
    _pair, start_ok = started(connection_name="orders-service", locale="fr_FR")
    props = start_ok.client_properties
    assert props is not None
    assert props["product"] == "rabbitry"
    assert props["version"] == VERSION
    assert props["platform"] == f"Python {platform.python_version()}"
    assert props["connection_name"] == "orders-service"
    assert props["capabilities"] == {
        "publisher_confirms": True,
        "exchange_exchange_bindings": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
        "per_consumer_qos": True,
    }
    assert props["capabilities"] == CLIENT_CAPABILITIES
    assert start_ok.locale == "fr_FR"


def test_client_properties_without_connection_name_and_with_extras() -> None:
    _pair, start_ok = started(client_properties={"team": "billing", "product": "custom"})
    props = start_ok.client_properties
    assert props is not None
    assert "connection_name" not in props
    assert props["team"] == "billing"
    assert props["product"] == "custom"  # extra entries override the defaults


def test_password_is_not_in_repr() -> None:
    conn = ConnectionProtocol(username="alice", password="s3cret")
    assert "s3cret" not in repr(conn)
    assert "alice" in repr(conn)


def test_server_properties_are_kept_and_reported() -> None:
    pair = Pair()
    opened_event = pair.handshake(server_properties={"product": "RabbitMQ", "version": "4.0"})
    assert pair.client.server_properties == {"product": "RabbitMQ", "version": "4.0"}
    assert opened_event.server_properties == {"product": "RabbitMQ", "version": "4.0"}


def test_connection_secure_is_answered_with_the_same_response() -> None:
    pair, _ = started(username="user", password="pass")
    assert pair.broker_method(0, spec.ConnectionSecure(challenge=b"?")) == []
    pair.assert_sent(spec.ConnectionSecureOk, channel=0, response=b"\x00user\x00pass")
    assert pair.broker_to_client(tune()) == []
    pair.assert_sent(spec.ConnectionTuneOk)


def test_mechanism_not_offered_terminates_with_authentication_error() -> None:
    pair = Pair(auth_mechanism="AMQPLAIN")
    pair.flush()
    exc = only_terminated(pair.broker_to_client(start(mechanisms="PLAIN EXTERNAL")))
    assert isinstance(exc, AuthenticationError)
    assert "AMQPLAIN" in str(exc) and "PLAIN, EXTERNAL" in str(exc)
    assert pair.client.state is CLOSED
    assert pair.client.close_exc is exc
    pair.assert_nothing_sent()  # no start-ok


def test_broker_close_403_during_handshake_is_authentication_error() -> None:
    pair, _ = started()
    events = pair.broker_method(
        0,
        spec.ConnectionClose(
            reply_code=403,
            reply_text="ACCESS_REFUSED - Login was refused",
            class_id=10,
            method_id=11,
        ),
    )
    exc = only_terminated(events)
    assert isinstance(exc, AuthenticationError)
    assert "ACCESS_REFUSED" in str(exc)
    assert isinstance(exc.__cause__, ConnectionAccessRefused)
    pair.assert_sent(spec.ConnectionCloseOk, channel=0)
    assert pair.client.state is CLOSED


def test_broker_close_402_while_awaiting_open_ok_is_invalid_path() -> None:
    pair, _ = started()
    pair.broker_to_client(tune())
    pair.client_to_broker()
    events = pair.broker_method(
        0,
        spec.ConnectionClose(
            reply_code=402, reply_text="NOT_FOUND - no vhost", class_id=10, method_id=40
        ),
    )
    exc = only_terminated(events)
    assert isinstance(exc, InvalidPath)
    assert (exc.reply_code, exc.class_id, exc.method_id) == (402, 10, 40)
    pair.assert_sent(spec.ConnectionCloseOk)


def test_eof_after_start_ok_is_authentication_error() -> None:
    pair, _ = started()
    pair.client.receive_eof()
    exc = only_terminated(pair.client.events_received())
    assert isinstance(exc, AuthenticationError)
    assert pair.client.state is CLOSED


def test_eof_before_start_is_connection_lost() -> None:
    conn = ConnectionProtocol()
    conn.data_to_send()
    conn.receive_eof()
    assert isinstance(only_terminated(conn.events_received()), ConnectionLost)


def test_eof_when_open_is_connection_lost_and_closes_channels_first() -> None:
    pair = opened()
    pair.open_channel()
    pair.open_channel()
    pair.client.receive_eof()
    events = pair.client.events_received()
    assert [type(e) for e in events] == [
        ChannelClosedEvent,
        ChannelClosedEvent,
        ConnectionTerminated,
    ]
    assert {e.channel for e in events[:2]} == {1, 2}
    assert all(isinstance(e.exc, ConnectionLost) for e in events)
    assert pair.client.channels == {}
    # Only once.
    pair.client.receive_eof()
    pair.client.receive_data(b"anything")
    pair.client.tick(1000.0)
    assert pair.client.events_received() == []


def test_eof_while_closing_terminates_with_the_close_reason() -> None:
    pair = opened()
    pair.client.close(200, "bye")
    pair.client_to_broker()
    pair.client.receive_eof()
    exc = only_terminated(pair.client.events_received())
    assert isinstance(exc, ConnectionClosedByClient)
    assert exc is pair.client.close_exc


def test_wrong_amqp_version_terminates() -> None:
    pair = Pair()
    pair.flush()
    exc = only_terminated(pair.broker_to_client(start(major=1, minor=0)))
    assert isinstance(exc, RemoteProtocolError)
    assert exc.reply_code == 503
    assert "1-0" in str(exc)


def test_unexpected_method_during_handshake_terminates() -> None:
    pair = Pair()
    pair.flush()
    exc = only_terminated(pair.broker_method(0, spec.ConnectionOpenOk()))
    assert isinstance(exc, RemoteProtocolError)
    assert exc.reply_code == 503
    pair.assert_nothing_sent()


def test_close_during_handshake_just_terminates() -> None:
    pair, _ = started()
    pair.client.close()
    exc = only_terminated(pair.client.events_received())
    assert isinstance(exc, ConnectionClosedByClient)
    assert pair.client.state is CLOSED
    pair.assert_nothing_sent()


# --------------------------------------------------------------------------- tune


@pytest.mark.parametrize(
    ("client", "server", "expected"),
    [
        (2047, 1000, 1000),
        (100, 2047, 100),
        (0, 2047, 2047),
        (2047, 0, 2047),
        (0, 0, 65535),
    ],
)
def test_tune_channel_max(client: int, server: int, expected: int) -> None:
    pair = Pair(channel_max=client)
    opened_event = pair.handshake(channel_max=server)
    assert opened_event.channel_max == expected
    assert pair.client.channel_max == expected
    tune_ok = pair.broker.methods[1][1]
    assert isinstance(tune_ok, spec.ConnectionTuneOk)
    assert tune_ok.channel_max == expected


@pytest.mark.parametrize(
    ("client", "server", "expected"),
    [
        (131072, 65536, 65536),
        (8192, 131072, 8192),
        (0, 131072, 131072),
        (131072, 0, 131072),
        (0, 0, 0),
        (4096, 4096, 4096),
    ],
)
def test_tune_frame_max(client: int, server: int, expected: int) -> None:
    pair = Pair(frame_max=client)
    opened_event = pair.handshake(frame_max=server)
    assert opened_event.frame_max == expected
    assert pair.client.frame_max == expected
    tune_ok = pair.broker.methods[1][1]
    assert isinstance(tune_ok, spec.ConnectionTuneOk)
    assert tune_ok.frame_max == expected


@pytest.mark.parametrize(
    ("client", "server", "expected"),
    [
        (60, 30, 30),
        (10, 60, 10),
        (0, 60, 60),
        (60, 0, 60),
        (0, 0, 0),
    ],
)
def test_tune_heartbeat(client: int, server: int, expected: int) -> None:
    pair = Pair(heartbeat=client)
    opened_event = pair.handshake(heartbeat=server)
    assert opened_event.heartbeat == expected
    assert pair.client.heartbeat == expected
    tune_ok = pair.broker.methods[1][1]
    assert isinstance(tune_ok, spec.ConnectionTuneOk)
    assert tune_ok.heartbeat == expected


def test_broker_frame_max_below_minimum_fails_the_connection() -> None:
    pair, _ = started()
    events = pair.broker_to_client(tune(frame_max=1000))  # must not raise
    exc = only_terminated(events)
    assert isinstance(exc, ProtocolError)
    assert "1000" in str(exc)
    assert pair.client.state is CLOSED
    pair.assert_nothing_sent()  # neither tune-ok nor open


def test_tune_ok_and_open_are_sent_and_opened_reports_the_tune() -> None:
    pair = Pair(virtual_host="/billing", heartbeat=30, channel_max=100, frame_max=65536)
    pair.flush()
    pair.broker_to_client(start())
    pair.assert_sent(spec.ConnectionStartOk)
    assert pair.client.state is ConnectionState.AWAIT_TUNE
    assert pair.broker_to_client(tune(channel_max=2047, frame_max=131072, heartbeat=60)) == []
    pair.assert_sent(
        spec.ConnectionTuneOk, channel=0, channel_max=100, frame_max=65536, heartbeat=30
    )
    pair.assert_sent(spec.ConnectionOpen, channel=0, virtual_host="/billing")
    assert pair.client.state is ConnectionState.AWAIT_OPEN_OK
    events = pair.broker_method(0, spec.ConnectionOpenOk())
    assert events == [ConnectionOpened({"product": "RabbitMQ"}, 100, 65536, 30)]
    assert pair.client.is_open
    assert pair.client.state is OPEN


def test_negotiated_frame_max_is_enforced_on_receive() -> None:
    pair = opened(frame_max=4096)
    # 4096 bytes overhead included is fine...
    pair.open_channel()
    body = b"x" * (4096 - 8)
    events = pair.broker_to_client(deliver(1, body + body, frame_max=4096))
    assert len(events) == 1 and isinstance(events[0], Delivery)
    # ...one more byte is not.
    pair.broker_to_client(B.frame(FRAME_BODY, 1, b"x" * (4096 - 7)))
    assert isinstance(pair.client.close_exc, RemoteProtocolError)
    assert pair.client.close_exc.reply_code == 501


# --------------------------------------------------------------------------- heartbeats


def test_heartbeat_is_queued_when_nothing_was_sent_for_half_the_interval() -> None:
    pair = opened(heartbeat=10)
    assert pair.client.heartbeat == 10
    pair.client.tick(0.0)
    assert pair.client.data_to_send() == b""
    pair.client.tick(4.9)
    assert pair.client.data_to_send() == b""
    pair.client.tick(5.0)
    data = pair.client.data_to_send()
    assert data == bytes.fromhex("08 0000 00000000 ce")
    assert data == HEARTBEAT_FRAME
    assert pair.client.events_received() == []


def test_heartbeat_is_not_queued_twice_while_unsent() -> None:
    pair = opened(heartbeat=10)
    pair.client.tick(0.0)
    pair.client.tick(5.0)
    pair.client.tick(6.0)
    assert pair.client.data_to_send() == HEARTBEAT_FRAME


def test_outgoing_traffic_postpones_the_heartbeat() -> None:
    pair = opened(heartbeat=10)
    pair.open_channel()
    pair.client.tick(0.0)
    pair.client.tick(3.0)
    pair.client.channels[1].send_method(spec.BasicQos(prefetch_count=1))
    pair.client_to_broker()  # data went out between 3 and 4
    pair.client.tick(4.0)
    pair.client.tick(8.0)
    assert pair.client.data_to_send() == b""
    pair.client.tick(9.0)
    assert pair.client.data_to_send() == HEARTBEAT_FRAME


def test_received_traffic_keeps_the_connection_alive() -> None:
    pair = opened(heartbeat=10)
    pair.client.tick(0.0)
    for now in range(1, 100):
        if now % 15 == 0:
            assert pair.broker_to_client(B.send_heartbeat()) == []
        pair.client.tick(float(now))
        pair.client.data_to_send()
    assert pair.client.state is OPEN
    assert pair.client.events_received() == []


def test_silence_for_more_than_twice_the_heartbeat_is_a_timeout() -> None:
    pair = opened(heartbeat=10)
    pair.open_channel()
    pair.client.tick(0.0)
    pair.client.tick(5.0)
    pair.client.tick(20.0)
    assert pair.client.state is OPEN
    pair.client.tick(20.5)
    events = pair.client.events_received()
    assert [type(e) for e in events] == [ChannelClosedEvent, ConnectionTerminated]
    exc = events[-1].exc
    assert isinstance(exc, HeartbeatTimeout)
    assert events[0].exc is exc
    assert pair.client.state is CLOSED
    assert pair.client.close_exc is exc
    pair.client.tick(100.0)  # no second event
    assert pair.client.events_received() == []


def test_heartbeat_zero_disables_ticks() -> None:
    pair = Pair(heartbeat=0)
    pair.handshake(heartbeat=0)
    assert pair.client.heartbeat == 0
    assert pair.client.tick_interval is None
    pair.client.tick(0.0)
    pair.client.tick(10_000.0)
    assert pair.client.data_to_send() == b""
    assert pair.client.events_received() == []
    assert pair.client.state is OPEN


@pytest.mark.parametrize(("heartbeat", "interval"), [(60, 1.0), (4, 1.0), (2, 0.5), (1, 0.25)])
def test_tick_interval(heartbeat: int, interval: float) -> None:
    pair = Pair(heartbeat=heartbeat)
    pair.handshake(heartbeat=heartbeat)
    assert pair.client.tick_interval == interval


def test_tick_interval_is_none_before_tune() -> None:
    conn = ConnectionProtocol(heartbeat=60)
    assert conn.tick_interval is None
    conn.tick(0.0)
    conn.tick(1000.0)
    assert conn.data_to_send() == PROTOCOL_HEADER


def test_heartbeat_from_broker_produces_no_event() -> None:
    pair = opened(heartbeat=10)
    assert pair.broker_to_client(B.send_heartbeat(), B.send_heartbeat()) == []
    pair.assert_nothing_sent()


# --------------------------------------------------------------------------- blocked


def test_connection_blocked_and_unblocked() -> None:
    pair = opened()
    assert pair.client.blocked_reason is None
    events = pair.broker_method(0, spec.ConnectionBlocked(reason="low on memory"))
    assert events == [ConnectionBlocked("low on memory")]
    assert pair.client.blocked_reason == "low on memory"
    events = pair.broker_method(0, spec.ConnectionUnblocked())
    assert events == [ConnectionUnblocked()]
    assert pair.client.blocked_reason is None
    pair.assert_nothing_sent()


# --------------------------------------------------------------------------- close


def test_client_close() -> None:
    pair = opened()
    pair.open_channel()
    pair.client.close(200, "bye")
    assert pair.client.state is CLOSING
    pair.assert_sent(
        spec.ConnectionClose, channel=0, reply_code=200, reply_text="bye", class_id=0, method_id=0
    )
    assert not pair.client.is_open
    pair.client.close()  # idempotent while closing
    pair.assert_nothing_sent()
    events = pair.broker_method(0, spec.ConnectionCloseOk())
    assert [type(e) for e in events] == [ChannelClosedEvent, ConnectionTerminated]
    exc = events[-1].exc
    assert isinstance(exc, ConnectionClosedByClient)
    assert (exc.reply_code, exc.reply_text) == (200, "bye")
    assert pair.client.state is CLOSED
    pair.client.close()  # idempotent when closed
    pair.assert_nothing_sent()
    assert pair.client.events_received() == []


def test_broker_close_320() -> None:
    pair = opened()
    events = pair.broker_method(
        0,
        spec.ConnectionClose(
            reply_code=320,
            reply_text="CONNECTION_FORCED - broker forced connection closure",
            class_id=0,
            method_id=0,
        ),
    )
    pair.assert_sent(spec.ConnectionCloseOk, channel=0)
    exc = only_terminated(events)
    assert isinstance(exc, ConnectionForced)
    assert exc.reply_code == 320
    assert exc.reply_text == "CONNECTION_FORCED - broker forced connection closure"
    assert (exc.class_id, exc.method_id) == (0, 0)
    assert pair.client.state is CLOSED
    assert pair.client.close_exc is exc


def test_broker_close_reports_class_and_method() -> None:
    pair = opened()
    events = pair.broker_method(
        0,
        spec.ConnectionClose(
            reply_code=503, reply_text="COMMAND_INVALID", class_id=60, method_id=40
        ),
    )
    exc = only_terminated(events)
    assert isinstance(exc, ConnectionClosedByBroker)
    assert (exc.reply_code, exc.class_id, exc.method_id) == (503, 60, 40)
    assert "basic.publish" in str(exc)


def test_broker_close_with_an_unknown_code() -> None:
    pair = opened()
    exc = only_terminated(
        pair.broker_method(
            0, spec.ConnectionClose(reply_code=599, reply_text="odd", class_id=0, method_id=0)
        )
    )
    assert type(exc) is ConnectionClosedByBroker
    assert exc.reply_code == 599


def test_broker_close_while_closing() -> None:
    pair = opened()
    pair.client.close()
    pair.assert_sent(spec.ConnectionClose)
    events = pair.broker_method(
        0, spec.ConnectionClose(reply_code=320, reply_text="forced", class_id=0, method_id=0)
    )
    pair.assert_sent(spec.ConnectionCloseOk, channel=0)
    exc = only_terminated(events)
    assert isinstance(exc, ConnectionClosedByClient)
    assert pair.client.state is CLOSED


def test_other_frames_are_discarded_while_closing() -> None:
    pair = opened()
    pair.client.close()
    pair.assert_sent(spec.ConnectionClose)
    events = pair.broker_to_client(
        B.send_method(0, spec.ConnectionBlocked(reason="x")),
        B.send_method(7, spec.ChannelOpenOk()),  # a channel we never opened
        B.send_heartbeat(),
    )
    assert events == []
    assert pair.client.state is CLOSING
    assert pair.client.blocked_reason is None
    pair.assert_nothing_sent()
    assert isinstance(only_terminated(pair.broker_method(0, spec.ConnectionCloseOk())), AMQPError)


def test_abort_terminates_with_the_given_exception() -> None:
    pair = opened()
    pair.open_channel()
    pair.client.close()
    pair.client_to_broker()
    reason = ConnectionLost("close-ok never came")
    pair.client.abort(reason)
    events = pair.client.events_received()
    assert [type(e) for e in events] == [ChannelClosedEvent, ConnectionTerminated]
    assert events[-1].exc is reason
    assert pair.client.state is CLOSED
    pair.client.abort(reason)
    assert pair.client.events_received() == []


def test_methods_refused_after_close() -> None:
    pair = opened()
    pair.client.close()
    with pytest.raises(InvalidStateError, match="closing"):
        pair.client.open_channel()
    with pytest.raises(InvalidStateError):
        pair.client.update_secret("token", "refresh")


# --------------------------------------------------------------------------- update-secret


def test_update_secret() -> None:
    pair = opened()
    pair.client.update_secret("new-token", "refresh")
    pair.assert_sent(
        spec.ConnectionUpdateSecret, channel=0, new_secret=b"new-token", reason="refresh"
    )
    with pytest.raises(InvalidStateError, match="already waiting"):
        pair.client.update_secret(b"other", "again")
    pair.assert_nothing_sent()
    events = pair.broker_method(0, spec.ConnectionUpdateSecretOk())
    assert events == [RpcReply(0, spec.ConnectionUpdateSecretOk())]
    # Once answered, another one may go.
    pair.client.update_secret(b"third", "again")
    pair.assert_sent(spec.ConnectionUpdateSecret, new_secret=b"third")


def test_update_secret_before_open_is_invalid() -> None:
    pair, _ = started()
    with pytest.raises(InvalidStateError, match="await-tune"):
        pair.client.update_secret("x", "y")


def test_unsolicited_update_secret_ok_is_a_protocol_error() -> None:
    pair = opened()
    assert pair.broker_method(0, spec.ConnectionUpdateSecretOk()) == []
    assert isinstance(pair.client.close_exc, RemoteProtocolError)
    assert pair.client.close_exc.reply_code == 503
    pair.assert_sent(spec.ConnectionClose, reply_code=503)


# --------------------------------------------------------------------------- receive path

DELIVER = spec.BasicDeliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="q")


def _method_payload(method: spec.Method) -> bytes:
    return method.PREFIX + method.encode()


# (id, bytes from the broker once channel 1 is open, expected reply code)
PROTOCOL_ERRORS = [
    ("bad-frame-end", B.frame(FRAME_METHOD, 0, _method_payload(spec.ConnectionBlocked()), 0), 501),
    ("frame-above-frame-max", B.frame(FRAME_BODY, 1, b"x" * 5000), 501),
    ("huge-size-field", struct.pack(">BHI", FRAME_METHOD, 0, 0xFFFFFFFF), 501),
    ("unopened-channel", B.send_method(2, spec.ChannelOpenOk()), 504),
    ("unknown-method", B.frame(FRAME_METHOD, 0, struct.pack(">HH", 10, 99)), 540),
    ("unknown-class", B.frame(FRAME_METHOD, 1, struct.pack(">HH", 99, 10)), 540),
    ("malformed-args", B.frame(FRAME_METHOD, 0, spec.ConnectionBlocked.PREFIX + b"\x05ab"), 502),
    (
        "trailing-args",
        B.frame(FRAME_METHOD, 0, _method_payload(spec.ConnectionUnblocked()) + b"!"),
        502,
    ),
    ("short-method", B.frame(FRAME_METHOD, 0, b"\x00\x0a"), 502),
    ("short-method-on-channel", B.frame(FRAME_METHOD, 1, b"\x00"), 502),
    ("heartbeat-on-channel-2", B.send_heartbeat(2), 501),
    ("header-without-method", B.send_header(1, 5), 505),
    ("body-without-header", B.send_body(1, b"abc"), 505),
    (
        "body-longer-than-header",
        B.send_method(1, DELIVER) + B.send_header(1, 3) + B.send_body(1, b"abcde"),
        501,
    ),
    (
        "body-longer-in-second-frame",
        B.send_method(1, DELIVER)
        + B.send_header(1, 4)
        + B.send_body(1, b"abc")
        + B.send_body(1, b"de"),
        501,
    ),
    ("method-instead-of-header", B.send_method(1, DELIVER) + B.send_method(1, DELIVER), 505),
    (
        "method-instead-of-body",
        B.send_method(1, DELIVER) + B.send_header(1, 3) + B.send_method(1, spec.ChannelFlow()),
        505,
    ),
    ("second-header", B.send_method(1, DELIVER) + B.send_header(1, 3) + B.send_header(1, 3), 505),
    ("short-header", B.send_method(1, DELIVER) + B.frame(FRAME_HEADER, 1, b"\x00<" * 3), 502),
    (
        "header-for-another-class",
        B.send_method(1, DELIVER) + B.frame(FRAME_HEADER, 1, struct.pack(">HHQH", 50, 0, 0, 0)),
        505,
    ),
    (
        "header-with-trailing-bytes",
        B.send_method(1, DELIVER)
        + B.frame(FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, 0, 0) + b"?"),
        502,
    ),
    (
        "header-with-truncated-properties",
        B.send_method(1, DELIVER)
        + B.frame(FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, 0, 0x8000) + b"\x09ab"),
        502,
    ),
    (
        "header-with-missing-property-value",
        B.send_method(1, DELIVER)
        + B.frame(FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, 0, 0x1000)),
        502,
    ),
    (
        "header-with-a-bad-headers-table",
        B.send_method(1, DELIVER)
        + B.frame(FRAME_HEADER, 1, struct.pack(">HHQHI", 60, 0, 0, 0x2000, 3) + b"\x01kZ"),
        502,
    ),
    ("unknown-frame-type-on-channel", B.frame(9, 1, b""), 501),
    ("header-on-channel-0", B.send_header(0, 0), 503),
    ("deliver-on-channel-0", B.send_content(0, DELIVER, b"x"), 503),
    ("channel-method-on-channel-0", B.send_method(0, spec.ChannelOpenOk()), 503),
    ("connection-start-when-open", start(), 503),
    ("second-open-ok", B.send_method(1, spec.ChannelOpenOk()), 503),
    (
        "publish-from-the-broker",
        B.send_content(1, spec.BasicPublish(exchange="", routing_key="q"), b"x"),
        503,
    ),
    (
        "get-ok-without-get",
        B.send_content(
            1,
            spec.BasicGetOk(delivery_tag=1, exchange="", routing_key="q", message_count=0),
            b"x",
        ),
        503,
    ),
]


@pytest.mark.parametrize(
    ("data", "reply_code"),
    [pytest.param(data, code, id=name) for name, data, code in PROTOCOL_ERRORS],
)
def test_protocol_errors_close_the_connection(data: bytes, reply_code: int) -> None:
    pair = opened(frame_max=4096)
    pair.open_channel()
    events = pair.broker_to_client(data)  # never raises
    assert events == []
    client = pair.client
    assert client.state is CLOSING
    exc = client.close_exc
    assert isinstance(exc, RemoteProtocolError)
    assert exc.reply_code == reply_code
    close = pair.assert_sent(
        spec.ConnectionClose, channel=0, reply_code=reply_code, class_id=0, method_id=0
    )
    assert isinstance(close, spec.ConnectionClose)
    assert close.reply_text == str(exc)[:255]
    pair.assert_nothing_sent()
    with pytest.raises(InvalidStateError):
        client.open_channel()
    # Valid frames other than close/close-ok are discarded, without raising.
    assert pair.broker_to_client(B.send_method(0, spec.ConnectionBlocked(reason="x"))) == []
    assert pair.broker_to_client(B.send_method(0, spec.ConnectionOpenOk())) == []
    assert client.state is CLOSING
    pair.assert_nothing_sent()
    events = pair.broker_method(0, spec.ConnectionCloseOk())
    assert [type(e) for e in events] == [ChannelClosedEvent, ConnectionTerminated]
    assert events[0].exc is exc
    assert events[1].exc is exc
    assert client.state is CLOSED
    # And once closed, everything is ignored.
    assert pair.broker_to_client(b"\xff" * 50) == []
    client.receive_eof()
    assert client.events_received() == []


def test_protocol_error_then_broker_close_sends_close_ok() -> None:
    pair = opened()
    pair.broker_to_client(B.send_method(3, spec.ChannelOpenOk()))
    pair.assert_sent(spec.ConnectionClose, reply_code=504)
    events = pair.broker_method(
        0, spec.ConnectionClose(reply_code=504, reply_text="x", class_id=0, method_id=0)
    )
    pair.assert_sent(spec.ConnectionCloseOk)
    exc = only_terminated(events)
    assert isinstance(exc, RemoteProtocolError) and exc.reply_code == 504


def test_frames_after_an_error_in_the_same_chunk_are_dropped() -> None:
    pair = opened()
    pair.open_channel()
    events = pair.broker_to_client(
        B.send_method(5, spec.ChannelOpenOk()),  # 504
        deliver(1),
    )
    assert events == []
    assert pair.client.close_exc is not None
    assert pair.client.close_exc.reply_code == 504  # type: ignore[attr-defined]


def test_frames_split_at_every_byte_are_reassembled() -> None:
    pair = opened()
    pair.open_channel()
    data = deliver(1, b"payload") + B.send_method(0, spec.ConnectionBlocked(reason="r"))
    events = []
    for i in range(len(data)):
        events += pair.broker_to_client(data[i : i + 1])
    assert [type(e) for e in events] == [Delivery, ConnectionBlocked]
    assert events[0].message.body == b"payload"


def test_protocol_error_while_closing_by_client_does_not_raise() -> None:
    pair = opened()
    pair.client.close()
    pair.client_to_broker()
    events = pair.broker_to_client(B.frame(FRAME_METHOD, 0, b"\x00\x0a", 0))
    assert pair.client.state in (CLOSING, CLOSED)
    assert all(isinstance(e, ConnectionTerminated) for e in events)
    assert isinstance(pair.client.close_exc, ConnectionClosedByClient)
    pair.assert_nothing_sent()


def test_garbage_after_a_protocol_error_is_ignored_until_close_ok() -> None:
    pair = opened()
    pair.broker_to_client(B.frame(FRAME_METHOD, 0, _method_payload(spec.ConnectionBlocked()), 0))
    first = pair.client.close_exc
    assert isinstance(first, RemoteProtocolError) and first.reply_code == 501
    pair.assert_sent(spec.ConnectionClose, reply_code=501)
    # The stream is out of sync now: whatever follows may be garbage.
    assert pair.broker_to_client(b"\xff" * 20) == []
    assert pair.client.state is CLOSING
    events = pair.broker_method(0, spec.ConnectionCloseOk())
    assert events == [ConnectionTerminated(first)]


def test_channel_frames_are_discarded_while_the_connection_is_closing() -> None:
    pair = opened()
    pair.open_channel()
    pair.client.close()
    pair.assert_sent(spec.ConnectionClose)
    assert pair.broker_to_client(deliver(1)) == []


def test_empty_data_is_harmless() -> None:
    pair = opened()
    assert pair.broker_to_client(b"") == []
    assert pair.client.state is OPEN


# --------------------------------------------------------------------------- channels


def test_open_channel_allocates_increasing_numbers() -> None:
    pair = opened()
    channels = [pair.open_channel() for _ in range(3)]
    assert [c.channel_id for c in channels] == [1, 2, 3]
    assert pair.client.channels == {1: channels[0], 2: channels[1], 3: channels[2]}
    assert all(c.state is ChannelState.OPEN for c in channels)


def test_open_channel_queues_channel_open_and_state_opening() -> None:
    pair = opened()
    channel = pair.client.open_channel()
    assert channel.state is ChannelState.OPENING
    pair.assert_sent(spec.ChannelOpen, channel=1)
    events = pair.broker_method(1, spec.ChannelOpenOk())
    assert events == [RpcReply(1, spec.ChannelOpenOk())]
    assert channel.state is ChannelState.OPEN


def test_freed_channel_numbers_are_reused() -> None:
    pair = Pair(channel_max=3)
    pair.handshake(channel_max=3)
    a, b, c = (pair.open_channel() for _ in range(3))
    with pytest.raises(LocalProtocolError, match="all 3 channels are in use"):
        pair.client.open_channel()
    pair.assert_nothing_sent()
    b.close()
    pair.assert_sent(spec.ChannelClose, channel=2)
    assert 2 in pair.client.channels  # still closing
    with pytest.raises(LocalProtocolError):
        pair.client.open_channel()
    pair.broker_method(2, spec.ChannelCloseOk())
    assert 2 not in pair.client.channels
    assert pair.open_channel().channel_id == 2
    # Freed by the broker this time.
    pair.broker_method(
        1, spec.ChannelClose(reply_code=404, reply_text="NOT_FOUND", class_id=50, method_id=10)
    )
    pair.assert_sent(spec.ChannelCloseOk, channel=1)
    assert pair.open_channel().channel_id == 1
    assert c.channel_id == 3 and a.channel_id == 1


def test_open_channel_with_an_explicit_id() -> None:
    pair = opened(channel_max=10)
    assert pair.open_channel(5).channel_id == 5
    assert pair.open_channel(10).channel_id == 10
    with pytest.raises(LocalProtocolError, match="already open"):
        pair.client.open_channel(5)
    with pytest.raises(LocalProtocolError, match=r"1\.\.10"):
        pair.client.open_channel(11)
    with pytest.raises(LocalProtocolError, match=r"1\.\.10"):
        pair.client.open_channel(0)
    pair.assert_nothing_sent()
    # Automatic allocation skips the taken numbers.
    ids = [pair.open_channel().channel_id for _ in range(8)]
    assert ids == [1, 2, 3, 4, 6, 7, 8, 9]
    with pytest.raises(LocalProtocolError, match="channel_max"):
        pair.client.open_channel()


def test_open_channel_before_open_is_invalid() -> None:
    conn = ConnectionProtocol()
    with pytest.raises(InvalidStateError, match="await-start"):
        conn.open_channel()
    pair, _ = started()
    with pytest.raises(InvalidStateError):
        pair.client.open_channel()


def test_open_channel_after_close_chains_the_reason() -> None:
    pair = opened()
    pair.broker_method(
        0, spec.ConnectionClose(reply_code=320, reply_text="bye", class_id=0, method_id=0)
    )
    with pytest.raises(InvalidStateError) as info:
        pair.client.open_channel()
    assert isinstance(info.value.__cause__, ConnectionForced)


# --------------------------------------------------------------------------- fuzz

_METHOD_PREFIXES = sorted({cls.PREFIX for cls in spec.METHODS.values()})

_frames = st.builds(
    lambda kind, channel, payload: B.frame(kind, channel, payload),
    st.sampled_from([FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT, 0, 9]),
    st.sampled_from([0, 1, 2, 3]),
    st.one_of(
        st.binary(max_size=40),
        st.builds(
            lambda p, rest: p + rest, st.sampled_from(_METHOD_PREFIXES), st.binary(max_size=40)
        ),
        st.builds(
            lambda size, rest: struct.pack(">HHQ", 60, 0, size) + rest,
            st.integers(0, 70),
            st.binary(max_size=20),
        ),
    ),
)

_streams = st.one_of(
    st.binary(max_size=400),
    st.lists(_frames, max_size=12).map(b"".join),
    st.builds(
        lambda frames, junk: b"".join(frames) + junk,
        st.lists(_frames, max_size=8),
        st.binary(max_size=30),
    ),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=_streams, cuts=st.lists(st.integers(0, 400), max_size=8))
def test_random_bytes_never_raise(stream: bytes, cuts: list[int]) -> None:
    pair = Pair(frame_max=4096)
    pair.handshake(frame_max=4096, heartbeat=10)
    pair.open_channel()
    pair.open_channel()
    client = pair.client
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    events = []
    for lo, hi in itertools.pairwise(bounds):
        client.receive_data(stream[lo:hi])
        client.data_to_send()
        events += client.events_received()
    client.tick(0.0)
    client.data_to_send()
    events += client.events_received()
    assert client.state in (OPEN, CLOSING, CLOSED)
    if client.state is not OPEN:
        assert isinstance(client.close_exc, AMQPError)
    terminated = [e for e in events if isinstance(e, ConnectionTerminated)]
    assert len(terminated) <= 1
    if terminated:
        assert events[-1] is terminated[0]
        assert client.state is CLOSED
    # And the connection can always be wound down without raising.
    client.receive_eof()
    assert client.state is CLOSED
    events = client.events_received()
    assert len(events) <= 3

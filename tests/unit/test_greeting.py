"""The sans-IO greeting check: which first bytes are (not) a connection.start frame."""

from __future__ import annotations

import pytest

from rabbitry.exceptions import NotAnAMQPServer
from rabbitry.protocol.connection import ConnectionProtocol
from rabbitry.protocol.events import ConnectionTerminated
from rabbitry.protocol.greeting import greeting_problem

START_HEAD = bytes([1, 0, 0, 0, 0, 1, 0, 0, 10, 0, 10])


@pytest.mark.parametrize("size", range(len(START_HEAD) + 1))
def test_every_prefix_of_a_connection_start_frame_is_accepted(size: int) -> None:
    assert greeting_problem(START_HEAD[:size]) is None


@pytest.mark.parametrize(
    ("head", "words"),
    [
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "answered HTTP ('HTTP/1.1 400 Bad Request')"),
        (b"AMQP\x00\x01\x00\x00", "protocol header for version 1.0.0"),
        (b"-ERR unknown command\r\n", "are not an AMQP 0-9-1 connection.start frame"),
        (bytes([1, 0, 5]), "not an AMQP 0-9-1 connection.start frame"),  # channel 5
    ],
)
def test_other_first_bytes_are_named(head: bytes, words: str) -> None:
    problem = greeting_problem(head)
    assert problem is not None and words in problem


def test_the_protocol_ends_the_connection_on_a_foreign_greeting_at_once() -> None:
    proto = ConnectionProtocol(username="guest", password="guest")
    proto.data_to_send()
    proto.receive_data(b"HTTP/1.1 400 Bad Request\r\n")
    (event,) = proto.events_received()
    assert isinstance(event, ConnectionTerminated)
    assert isinstance(event.exc, NotAnAMQPServer)
    assert event.exc.received.startswith(b"HTTP/1.1 400")


def test_a_greeting_split_across_reads_is_judged_as_a_whole() -> None:
    proto = ConnectionProtocol(username="guest", password="guest")
    proto.receive_data(START_HEAD[:3])
    proto.receive_data(START_HEAD[3:8])
    assert proto.events_received() == []
    proto.receive_data(b"\x14\x00")  # class 20 (channel) where connection (10) belongs
    (event,) = proto.events_received()
    assert isinstance(event, ConnectionTerminated)
    assert isinstance(event.exc, NotAnAMQPServer)

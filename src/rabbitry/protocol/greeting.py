"""Is the peer an AMQP 0-9-1 server? Judged from the first bytes it sends.

After our protocol header an AMQP 0-9-1 broker sends a connection.start method frame on
channel 0: frame type 1, channel 0, a 4-byte size, then class 10 / method 10. Anything
else in the frame type, channel or class means the address is not an AMQP 0-9-1 server, and waiting
for the handshake to time out would only hide that.
"""

from __future__ import annotations

__all__ = ["GREETING_SIZE", "describe_answer", "greeting_problem"]

#: Expected byte at each judged position of the first frame: a method frame on channel 0
#: of class 10 (connection). The size is not judged, nor the method: a connection method
#: other than start is an AMQP server breaking the protocol (RemoteProtocolError).
_EXPECTED = {0: 1, 1: 0, 2: 0, 7: 0, 8: 10}
#: How many first bytes are judged: frame type, channel, size, class id.
GREETING_SIZE = 9


def greeting_problem(head: bytes) -> str | None:
    """What is wrong with ``head`` as the start of a connection.start frame.

    Args:
        head: the first bytes received, any length; only the first :data:`GREETING_SIZE`
            are judged, the rest only helps to describe a wrong answer.

    Returns:
        Why the peer is not an AMQP 0-9-1 server (see :func:`describe_answer`), or
        ``None`` while ``head`` could still be the start of connection.start.
    """
    for position, expected in _EXPECTED.items():
        if position < len(head) and head[position] != expected:
            return describe_answer(head)
    return None


def describe_answer(head: bytes) -> str:
    """Say in words what a non-AMQP 0-9-1 peer answered.

    A server that does not support the version a client asks for answers with its own
    protocol header (``AMQP`` 0, then its version) and closes the socket (§4.2.2); an
    HTTP server answers a request line it cannot parse with an HTTP error.

    Args:
        head: the first bytes the peer sent (up to 64 are useful).

    Returns:
        A clause for an error message, e.g. ``"it answered HTTP ('HTTP/1.1 400 Bad
        Request'), not AMQP 0-9-1"``.
    """
    if head.startswith(b"HTTP/") or head[:1] == b"<":
        line = head.split(b"\r\n", 1)[0].decode("ascii", "replace")
        return f"it answered HTTP ({line!r}), not AMQP 0-9-1"
    if head.startswith(b"AMQP") and len(head) >= 8:
        version = ".".join(str(b) for b in head[5:8])
        return (
            f"it answered with the AMQP protocol header for version {version} (id {head[4]}): "
            "it does not speak AMQP 0-9-1"
        )
    return f"its first bytes {head[:32]!r} are not an AMQP 0-9-1 connection.start frame"

"""The client's half of the connection handshake: what it says in start-ok, secure-ok and tune-ok.

:class:`~rabbitry.protocol.connection.ConnectionProtocol` holds one :class:`Handshake`
and asks it for each answer; the connection's states and the frames stay there.
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any

from ..exceptions import AuthenticationError, LocalProtocolError, RemoteProtocolError
from . import spec
from ._tables import encode_table_body
from .frames import FRAME_MIN_SIZE

if TYPE_CHECKING:
    from collections.abc import Mapping

VERSION = "0.1.0"

#: Sent in client-properties so that RabbitMQ enables its extensions for us: a broker
#: sends basic.nack, basic.cancel, connection.blocked and an explicit close on a refused
#: login only to a client that announces the matching capability here.
CLIENT_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}

#: SASL mechanisms the client can answer connection.start with, in start-ok.
SUPPORTED_MECHANISMS = ("PLAIN", "AMQPLAIN", "EXTERNAL")


def _negotiate(client: int, server: int) -> int:
    """The lower of two values where 0 means "no limit" (or "no preference").

    connection.tune-ok: the client may lower what the server proposed in tune; 0 in
    channel-max or frame-max means no limit, and a heartbeat of 0 means none.
    """
    if client == 0 or server == 0:
        return max(client, server)
    return min(client, server)


class Handshake:
    """The client's credentials, properties and wishes, and the answers they make to the broker.

    Args:
        username: SASL user name (PLAIN, AMQPLAIN).
        password: SASL password; never put into a repr or an exception.
        heartbeat: the interval we ask for, in seconds.
        channel_max: highest channel number we want.
        frame_max: largest frame we want.
        auth_mechanism: PLAIN, AMQPLAIN or EXTERNAL (any case).
        connection_name: shown in the management UI (client property).
        locale: the locale we ask for.
        client_properties: extra client-properties entries.

    Raises:
        LocalProtocolError: ``auth_mechanism`` is not one of PLAIN, AMQPLAIN, EXTERNAL.
    """

    def __init__(
        self,
        *,
        username: str,
        password: str,
        heartbeat: int,
        channel_max: int,
        frame_max: int,
        auth_mechanism: str,
        connection_name: str | None,
        locale: str,
        client_properties: Mapping[str, Any] | None,
    ) -> None:
        mechanism = auth_mechanism.upper()
        if mechanism not in SUPPORTED_MECHANISMS:
            raise LocalProtocolError(
                f"auth_mechanism: must be one of {', '.join(SUPPORTED_MECHANISMS)}, "
                f"got {auth_mechanism!r}"
            )
        self.username = username
        self._password = password
        self._want_heartbeat = heartbeat
        self._want_channel_max = channel_max
        self._want_frame_max = frame_max
        self.auth_mechanism = mechanism
        self.locale = locale
        props: dict[str, Any] = {
            "product": "rabbitry",
            "version": VERSION,
            "platform": f"Python {platform.python_version()}",
            "copyright": "rabbitry contributors",
            "capabilities": dict(CLIENT_CAPABILITIES),
        }
        if connection_name:
            props["connection_name"] = connection_name
        if client_properties:
            props.update(client_properties)
        self.client_properties = props

    def refusal(self, start: spec.ConnectionStart) -> AuthenticationError | None:
        """Why the client cannot answer ``start``, if it cannot.

        Args:
            start: the broker's connection.start.

        Returns:
            An :class:`AuthenticationError` when the broker does not offer our mechanism
            (the connection ends with it), else ``None``.

        Raises:
            RemoteProtocolError: the broker speaks another AMQP version (503).
        """
        # connection.start carries major 0, minor 9 for 0-9-1 (the revision is not sent).
        if (start.version_major, start.version_minor) != (0, 9):
            raise RemoteProtocolError(
                f"the broker speaks AMQP {start.version_major}-{start.version_minor}, not 0-9-1",
                503,
            )
        offered = start.mechanisms.decode("utf-8", "replace").split()
        if self.auth_mechanism not in offered:
            return AuthenticationError(
                f"the broker does not offer the {self.auth_mechanism} mechanism "
                f"(it offers: {', '.join(offered) or 'none'})"
            )
        return None

    def start_ok(self) -> spec.ConnectionStartOk:
        """The answer to connection.start: our properties, mechanism, response and locale.

        Returns:
            The connection.start-ok method.
        """
        return spec.ConnectionStartOk(
            client_properties=self.client_properties,
            mechanism=self.auth_mechanism,
            response=self.sasl_response(),
            locale=self.locale,
        )

    def sasl_response(self) -> bytes:
        """The SASL response of our mechanism (start-ok, and secure-ok: the same again).

        Returns:
            The response bytes (empty for EXTERNAL).
        """
        if self.auth_mechanism == "PLAIN":  # RFC 4616: authzid NUL authcid NUL password
            return b"\x00" + self.username.encode() + b"\x00" + self._password.encode()
        if self.auth_mechanism == "AMQPLAIN":
            return encode_table_body({"LOGIN": self.username, "PASSWORD": self._password})
        return b""  # EXTERNAL: the identity comes from the TLS client certificate

    def tune_ok(self, tune: spec.ConnectionTune) -> spec.ConnectionTuneOk:
        """Negotiate the limits the broker proposed in connection.tune.

        Each is the lower non-zero of ours and the broker's (0 takes the other's).

        Args:
            tune: the broker's connection.tune.

        Returns:
            The connection.tune-ok carrying the negotiated channel_max, frame_max and
            heartbeat.

        Raises:
            RemoteProtocolError: the negotiated frame_max is below 4096 (530).
        """
        channel_max = _negotiate(self._want_channel_max, tune.channel_max) or 65535
        frame_max = _negotiate(self._want_frame_max, tune.frame_max)
        # connection.tune: frame-max may not be below frame-min-size (4096 bytes).
        if frame_max and frame_max < FRAME_MIN_SIZE:
            raise RemoteProtocolError(
                f"the broker proposed frame_max {frame_max}, below the minimum {FRAME_MIN_SIZE}",
                530,
            )
        heartbeat = _negotiate(self._want_heartbeat, tune.heartbeat)
        return spec.ConnectionTuneOk(
            channel_max=min(channel_max, 65535), frame_max=frame_max, heartbeat=heartbeat
        )

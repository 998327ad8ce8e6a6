"""The :class:`ConnectionParameters` value: one broker address and everything needed to
open an AMQP 0-9-1 connection to it, validated when built.

Errors are :class:`~rabbitry.exceptions.ConfigurationError` whose message starts with the
offending field and states the rule; the URL grammar that builds these values lives in
:mod:`rabbitry.config._urls`.
"""

from __future__ import annotations

import dataclasses
import math
import ssl
from collections.abc import Mapping
from typing import Any, Self, TypeGuard
from urllib.parse import quote, urlencode

from ..exceptions import ConfigurationError

__all__ = [
    "AMQPS_PORT",
    "AMQP_PORT",
    "AUTH_MECHANISMS",
    "DEFAULT_URL",
    "FRAME_MIN_SIZE",
    "ConnectionParameters",
    "type_name",
]

AMQP_PORT = 5672
"""IANA port of plain AMQP, the default of ``amqp://`` URLs."""

AMQPS_PORT = 5671
"""IANA port of AMQP over TLS, the default of ``amqps://`` URLs."""

FRAME_MIN_SIZE = 4096
"""AMQP 0-9-1 FRAME-MIN-SIZE: no peer may be asked to accept smaller frames."""

AUTH_MECHANISMS = frozenset({"PLAIN", "AMQPLAIN", "EXTERNAL"})
"""SASL mechanisms rabbitry can speak."""

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
"""The URL :func:`default_url` falls back to: a local broker with the stock account."""

_MAX_SHORTSTR = 255  # AMQP shortstr: a one-byte length prefix

# Seconds; the dataclass defaults below repeat these, and display_url() uses them to
# leave default values out of the URL it prints.
_DEFAULT_HEARTBEAT = 60
_DEFAULT_CONNECTION_TIMEOUT = 10.0
_DEFAULT_CHANNEL_MAX = 2047
_DEFAULT_FRAME_MAX = 131072
_DEFAULT_AUTH_MECHANISM = "PLAIN"


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass; True as a heartbeat is a bug in the caller, not "1".
    return isinstance(value, int) and not isinstance(value, bool)


def type_name(value: object) -> str:
    """The name of ``value``'s type, as error messages show it.

    Args:
        value: Any object.

    Returns:
        ``type(value).__name__``.
    """
    return type(value).__name__


def _check_int(name: str, value: object, low: int, high: int, why: str = "") -> None:
    if not _is_int(value) or not low <= value <= high:
        hint = f" ({why})" if why else ""
        raise ConfigurationError(
            f"{name}: must be an integer in {low}..{high}{hint}, got {value!r}"
        )


def _check_text(name: str, value: object, *, shortstr: bool = False) -> str:
    """Check that ``value`` is a non-empty str, optionally one that fits a shortstr."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{name}: must be a str, got {type_name(value)}")
    if not value:
        raise ConfigurationError(f"{name}: must not be empty")
    if shortstr and len(value.encode("utf-8")) > _MAX_SHORTSTR:
        raise ConfigurationError(
            f"{name}: must be at most {_MAX_SHORTSTR} bytes in UTF-8 (an AMQP shortstr)"
        )
    return value


def _check_hostname(name: str, value: object) -> str:
    host = _check_text(name, value)
    if any(ch.isspace() or not ch.isprintable() for ch in host):
        raise ConfigurationError(f"{name}: must not contain whitespace or control characters")
    if host.startswith("["):
        # Brackets belong to URL syntax, not to the address; a bracketed host here would
        # reach getaddrinfo() and fail there with a far less helpful message.
        raise ConfigurationError(f"{name}: give an IPv6 address without brackets, got {host!r}")
    return host


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionParameters:
    """Everything needed to open one AMQP 0-9-1 connection to one broker address.

    Instances are immutable and validated on construction; derive variants with
    :meth:`with_options`. The password never appears in ``repr()``/``str()`` or in
    :meth:`display_url`, so instances are safe to log.

    Attributes:
        host: Broker host name or IP address (IPv6 without brackets).
        port: TCP port, 1..65535.
        virtual_host: Virtual host to open; RabbitMQ's default is ``"/"``.
        username: User name sent during authentication.
        password: Password sent during authentication; excluded from repr.
        use_tls: Whether to wrap the socket in TLS.
        ssl_context: TLS settings; ``None`` with ``use_tls`` means the connection uses
            ``ssl.create_default_context()`` (verify the broker against the system CAs).
            Only allowed when ``use_tls`` is true, so that a context can never be
            silently ignored.
        server_hostname: Name used for TLS SNI and certificate verification. When
            ``use_tls`` is true and this is ``None``, it is set to ``host``; it must be
            ``None`` when ``use_tls`` is false.
        heartbeat: Heartbeat interval to propose, in seconds. The lower non-zero of ours
            and the broker's is used, so 0 accepts the broker's value; heartbeats are off only
            when both sides say 0 (RabbitMQ's rule).
        connection_timeout: Seconds allowed for the TCP connect, the TLS handshake and
            the AMQP handshake together.
        channel_max: Highest channel number to propose, 1..65535.
        frame_max: Largest frame size to propose, in bytes, 4096..4294967295.
        auth_mechanism: SASL mechanism: ``PLAIN``, ``AMQPLAIN`` or ``EXTERNAL``
            (case-insensitive; stored upper-case).
        connection_name: Shown by the broker's management UI for this connection.
        locale: Locale requested in connection.start-ok.
        client_properties: Extra entries merged into the client-properties table
            (a copy is kept, so later changes to the argument have no effect).
    """

    host: str = "127.0.0.1"
    port: int = AMQP_PORT
    virtual_host: str = "/"
    username: str = "guest"
    password: str = dataclasses.field(default="guest", repr=False)
    use_tls: bool = False
    ssl_context: ssl.SSLContext | None = dataclasses.field(default=None, repr=False, compare=False)
    server_hostname: str | None = None
    heartbeat: int = _DEFAULT_HEARTBEAT
    connection_timeout: float = _DEFAULT_CONNECTION_TIMEOUT
    channel_max: int = _DEFAULT_CHANNEL_MAX
    frame_max: int = _DEFAULT_FRAME_MAX
    auth_mechanism: str = _DEFAULT_AUTH_MECHANISM
    connection_name: str | None = None
    locale: str = "en_US"
    client_properties: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        """Validate every field and normalise a few.

        Raises:
            ConfigurationError: a field has the wrong type or an out-of-range value.
        """
        _check_hostname("host", self.host)
        _check_int("port", self.port, 1, 65535)
        _check_text("virtual_host", self.virtual_host, shortstr=True)
        if not isinstance(self.username, str):
            raise ConfigurationError(f"username: must be a str, got {type_name(self.username)}")
        if not isinstance(self.password, str):
            # Only the type is reported: the value is a secret.
            raise ConfigurationError(f"password: must be a str, got {type_name(self.password)}")

        if not isinstance(self.use_tls, bool):
            raise ConfigurationError(f"use_tls: must be a bool, got {type_name(self.use_tls)}")
        if self.ssl_context is not None:
            if not isinstance(self.ssl_context, ssl.SSLContext):
                raise ConfigurationError(
                    "ssl_context: must be an ssl.SSLContext or None, "
                    f"got {type_name(self.ssl_context)}"
                )
            if not self.use_tls:
                raise ConfigurationError(
                    "ssl_context: requires use_tls=True (a context would otherwise be "
                    "silently unused)"
                )
        if self.server_hostname is not None:
            _check_hostname("server_hostname", self.server_hostname)
            if not self.use_tls:
                raise ConfigurationError(
                    "server_hostname: requires use_tls=True (it is the TLS SNI and "
                    "verification name)"
                )
        elif self.use_tls:
            # Resolved here rather than at connect time so that both transports (asyncio
            # and threads) verify the same name; the sync ssl API refuses None when
            # check_hostname is on.
            object.__setattr__(self, "server_hostname", self.host)

        _check_int("heartbeat", self.heartbeat, 0, 65535)
        timeout = self.connection_timeout
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ConfigurationError(
                f"connection_timeout: must be a finite number of seconds > 0, got {timeout!r}"
            )
        object.__setattr__(self, "connection_timeout", float(timeout))
        _check_int("channel_max", self.channel_max, 1, 65535)
        _check_int(
            "frame_max",
            self.frame_max,
            FRAME_MIN_SIZE,
            0xFFFFFFFF,
            f"AMQP FRAME-MIN-SIZE is {FRAME_MIN_SIZE}",
        )

        if not isinstance(self.auth_mechanism, str):
            raise ConfigurationError(
                f"auth_mechanism: must be a str, got {type_name(self.auth_mechanism)}"
            )
        mechanism = self.auth_mechanism.upper()
        if mechanism not in AUTH_MECHANISMS:
            raise ConfigurationError(
                f"auth_mechanism: must be one of {', '.join(sorted(AUTH_MECHANISMS))}, "
                f"got {self.auth_mechanism!r}"
            )
        object.__setattr__(self, "auth_mechanism", mechanism)
        if mechanism == "PLAIN":
            # PLAIN sends "\0user\0password": an embedded NUL would shift the fields and
            # the broker would see a different user name, so refuse it up front.
            if "\0" in self.username:
                raise ConfigurationError("username: must not contain NUL with PLAIN")
            if "\0" in self.password:
                raise ConfigurationError("password: must not contain NUL with PLAIN")

        if self.connection_name is not None:
            _check_text("connection_name", self.connection_name)
        _check_text("locale", self.locale, shortstr=True)

        if self.client_properties is not None:
            if not isinstance(self.client_properties, Mapping):
                raise ConfigurationError(
                    "client_properties: must be a mapping or None, "
                    f"got {type_name(self.client_properties)}"
                )
            for key in self.client_properties:
                # Keys become AMQP field-table names, which are shortstrs.
                _check_text(f"client_properties key {key!r}", key, shortstr=True)
            # A private copy keeps the frozen instance from changing under the caller's
            # feet; a plain dict (not a MappingProxyType) keeps instances picklable.
            object.__setattr__(self, "client_properties", dict(self.client_properties))

    @property
    def address(self) -> str:
        """``host:port``, with an IPv6 host in brackets (``[::1]:5672``)."""
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"

    def display_url(self) -> str:
        """Return a URL describing these parameters, with the password shown as ``***``.

        Meant for logs and error messages. Query parameters are included only where they
        differ from the defaults. It is not a full serialisation: TLS files,
        ``locale`` and ``client_properties`` are not represented, and the password is
        masked, so parsing it back does not reproduce an equal instance. The virtual host
        ``/`` is written ``/%2F``, which every parser reads as ``/``.

        Returns:
            A string such as ``amqp://guest:***@127.0.0.1:5672/%2F``.
        """
        scheme = "amqps" if self.use_tls else "amqp"
        user = quote(self.username, safe="")
        if ":" in self.host:
            # RFC 6874: a zone index ("fe80::1%eth0") is written "%25eth0" in a URL.
            host = f"[{quote(self.host, safe=':')}]"
        else:
            host = quote(self.host, safe="")
        vhost = quote(self.virtual_host, safe="")

        query: list[tuple[str, str]] = []
        if self.heartbeat != _DEFAULT_HEARTBEAT:
            query.append(("heartbeat", str(self.heartbeat)))
        if self.connection_timeout != _DEFAULT_CONNECTION_TIMEOUT:
            query.append(("connection_timeout", repr(self.connection_timeout)))
        if self.channel_max != _DEFAULT_CHANNEL_MAX:
            query.append(("channel_max", str(self.channel_max)))
        if self.frame_max != _DEFAULT_FRAME_MAX:
            query.append(("frame_max", str(self.frame_max)))
        if self.auth_mechanism != _DEFAULT_AUTH_MECHANISM:
            query.append(("auth_mechanism", self.auth_mechanism.lower()))
        if self.connection_name is not None:
            query.append(("connection_name", self.connection_name))
        if self.use_tls and self.server_hostname != self.host:
            query.append(("server_name_indication", str(self.server_hostname)))

        url = f"{scheme}://{user}:***@{host}:{self.port}/{vhost}"
        if query:
            url += "?" + urlencode(query)
        return url

    def with_options(self, **changes: Any) -> Self:
        """Return a copy with some fields changed, validated like a new instance.

        A ``server_hostname`` that was defaulted from ``host`` follows a changed ``host``
        (and is dropped when ``use_tls`` is turned off) unless ``server_hostname`` is
        passed explicitly.

        Args:
            **changes: Field names and their new values.

        Returns:
            A new :class:`ConnectionParameters`.

        Raises:
            ConfigurationError: an unknown field name, or an invalid value.
        """
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise ConfigurationError(
                f"with_options: unknown field(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(fields))}"
            )
        if (
            "server_hostname" not in changes
            and self.server_hostname == self.host
            and ("host" in changes or "use_tls" in changes)
        ):
            # Let __post_init__ derive it again from the new host / TLS setting; keeping
            # the old value would verify the certificate against the previous host.
            changes["server_hostname"] = None
        return dataclasses.replace(self, **changes)

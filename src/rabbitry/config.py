"""Connection settings: the :class:`ConnectionParameters` value and AMQP URL parsing.

A connection is described by one immutable, fully validated
:class:`ConnectionParameters`. Build it directly, or from a URL with :func:`parse_url`
(one broker) or :func:`parse_urls` (several brokers, tried in order)::

    params = parse_url("amqps://app:s3cret@rabbit.example.com/orders?heartbeat=30")
    params = parse_url(default_url(), connection_name="billing-worker")

URLs follow the RabbitMQ URI specification (https://www.rabbitmq.com/docs/uri-spec) and
the query parameters of https://www.rabbitmq.com/docs/uri-query-parameters, with these
deliberate differences, each chosen so that a URL means what a Python user expects:

* **Virtual host of a bare "/" path.** The URI spec reads ``amqp://host/`` as the *empty*
  virtual host and only ``amqp://host/%2F`` as ``/``. In practice nobody has an empty
  vhost, and every Python client (pika, aio-pika, kombu) reads ``amqp://host/`` as
  RabbitMQ's default vhost ``/``; so do we. The empty vhost is therefore not reachable
  from a URL, and :class:`ConnectionParameters` refuses it too.
* **connection_timeout is in seconds** (a float) here, like every other duration in
  rabbitry. The RabbitMQ (Erlang client) page documents it in *milliseconds*; a URL
  copied from there with ``connection_timeout=10000`` would mean 10000 s here.
* **auth_mechanism takes one value.** The Erlang client accepts it repeatedly as a list
  of candidates; we negotiate exactly one mechanism, so a repeat is an error like any
  other duplicated parameter.
* **Everything unknown is an error**: unknown query parameters, fragments, TLS options
  on a plain ``amqp://`` URL. A silently ignored typo (``hearbeat=5``) costs more than a
  loud failure at start-up.

Errors are :class:`~rabbitry.exceptions.ConfigurationError` (a ``ValueError``) whose
message starts with the offending field or URL part and states the rule. Messages never
contain the password.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, Self, TypeGuard
from urllib.parse import quote, unquote, urlencode

from .exceptions import ConfigurationError

__all__ = [
    "AMQPS_PORT",
    "AMQP_PORT",
    "AUTH_MECHANISMS",
    "DEFAULT_URL",
    "FRAME_MIN_SIZE",
    "ConnectionParameters",
    "default_url",
    "parse_url",
    "parse_urls",
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


def _type_name(value: object) -> str:
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
        raise ConfigurationError(f"{name}: must be a str, got {_type_name(value)}")
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
            raise ConfigurationError(f"username: must be a str, got {_type_name(self.username)}")
        if not isinstance(self.password, str):
            # Only the type is reported: the value is a secret.
            raise ConfigurationError(f"password: must be a str, got {_type_name(self.password)}")

        if not isinstance(self.use_tls, bool):
            raise ConfigurationError(f"use_tls: must be a bool, got {_type_name(self.use_tls)}")
        if self.ssl_context is not None:
            if not isinstance(self.ssl_context, ssl.SSLContext):
                raise ConfigurationError(
                    "ssl_context: must be an ssl.SSLContext or None, "
                    f"got {_type_name(self.ssl_context)}"
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
                f"auth_mechanism: must be a str, got {_type_name(self.auth_mechanism)}"
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
                    f"got {_type_name(self.client_properties)}"
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


# --------------------------------------------------------------------------- URLs

_SCHEME_PORTS = {"amqp": AMQP_PORT, "amqps": AMQPS_PORT}
_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_BAD_PERCENT_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

_INT_PARAMS = frozenset({"heartbeat", "channel_max", "frame_max"})
_TEXT_PARAMS = frozenset({"auth_mechanism", "connection_name"})
_TLS_PARAMS = frozenset({"server_name_indication", "verify", "cacertfile", "certfile", "keyfile"})
_QUERY_PARAMS = _INT_PARAMS | _TEXT_PARAMS | _TLS_PARAMS | {"connection_timeout"}
_VERIFY_VALUES = ("verify_none", "verify_peer")

_OVERRIDES = frozenset(
    {
        "heartbeat",
        "connection_timeout",
        "channel_max",
        "frame_max",
        "auth_mechanism",
        "connection_name",
        "ssl_context",
        "client_properties",
        "locale",
        "username",
        "password",
        "virtual_host",
    }
)


def _decode(part: str, raw: str, *, plus: bool = False) -> str:
    """Percent-decode one URL component strictly (UTF-8, no stray ``%``)."""
    if _BAD_PERCENT_RE.search(raw):
        # unquote() would keep "%zz" literally; a malformed escape is almost always a
        # half-encoded secret, better reported than sent to the broker.
        raise ConfigurationError(
            f"{part}: malformed percent-encoding ('%' must be followed by two hex digits)"
        )
    if plus:
        # Query strings use "+" for space (HTML forms); userinfo and paths do not.
        raw = raw.replace("+", " ")
    try:
        return unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise ConfigurationError(f"{part}: percent-encoded bytes are not valid UTF-8") from None


def _split_host_port(hostport: str, default_port: int) -> tuple[str | None, int]:
    """Split the authority's ``host[:port]``; ``None`` host means "use the default"."""
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise ConfigurationError("host: '[' without a matching ']'")
        literal = _decode("host", hostport[1:end])
        try:
            # Also accepts an RFC 6874 zone ("fe80::1%25eth0", decoded above).
            ipaddress.IPv6Address(literal)
        except ValueError:
            raise ConfigurationError(
                f"host: {literal!r} in brackets is not an IPv6 address"
            ) from None
        host: str | None = literal
        rest = hostport[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ConfigurationError("host: unexpected text after the ']' of an IPv6 address")
        port_raw = rest[1:] if rest else ""
    else:
        if hostport.count(":") > 1:
            raise ConfigurationError(
                "host: an IPv6 address must be enclosed in brackets, e.g. amqp://[::1]:5672/"
            )
        host_raw, _, port_raw = hostport.partition(":")
        # RabbitMQ URI spec: a zero-length host means the client's default host.
        host = _decode("host", host_raw) if host_raw else None

    if not port_raw:  # absent, or an empty ":" (RFC 3986 treats both alike)
        return host, default_port
    # str.isdigit() alone would accept non-ASCII digits (fullwidth, Arabic-Indic, ...).
    if not (port_raw.isascii() and port_raw.isdigit()) or not 1 <= int(port_raw) <= 65535:
        raise ConfigurationError(f"port: must be an integer in 1..65535, got {port_raw!r}")
    return host, int(port_raw)


def _parse_query(query: str) -> dict[str, str]:
    """Decode ``name=value&...`` into a dict, refusing duplicates and unknown names."""
    params: dict[str, str] = {}
    if not query:
        return params
    for item in query.split("&"):
        if not item:
            continue  # "a=1&&b=2" or a trailing "&": harmless, as in most URL parsers
        raw_name, eq, raw_value = item.partition("=")
        name = _decode("query parameter name", raw_name, plus=True)
        if name not in _QUERY_PARAMS:
            raise ConfigurationError(
                f"query parameter {name!r}: not supported; known parameters: "
                f"{', '.join(sorted(_QUERY_PARAMS))}"
            )
        if not eq:
            raise ConfigurationError(f"{name}: query parameter needs a value ({name}=...)")
        if name in params:
            raise ConfigurationError(f"{name}: query parameter given more than once")
        params[name] = _decode(name, raw_value, plus=True)
    return params


def _query_int(name: str, text: str) -> int:
    if _INT_RE.fullmatch(text):
        try:
            return int(text)
        except ValueError:  # more digits than int() accepts by default
            pass
    raise ConfigurationError(f"{name}: must be an integer, got {text!r}")


def _query_seconds(name: str, text: str) -> float:
    # A strict pattern, because float() alone also accepts "nan", "inf" and "1_0".
    if not _FLOAT_RE.fullmatch(text):
        raise ConfigurationError(f"{name}: must be a number of seconds, got {text!r}")
    return float(text)


def _tls_context(query: Mapping[str, str]) -> ssl.SSLContext | None:
    """Build an SSLContext from the TLS query parameters, or None if none were given."""
    verify = query.get("verify")
    cafile = query.get("cacertfile")
    certfile = query.get("certfile")
    keyfile = query.get("keyfile")
    if verify is not None and verify not in _VERIFY_VALUES:
        raise ConfigurationError(
            f"verify: must be one of {', '.join(_VERIFY_VALUES)}, got {verify!r}"
        )
    if keyfile is not None and certfile is None:
        raise ConfigurationError("keyfile: requires certfile")
    if verify is None and cafile is None and certfile is None:
        return None

    # Check existence first so the message names the right parameter; the ssl module
    # reports a missing key file and a missing certificate file alike.
    for name, path in (("cacertfile", cafile), ("certfile", certfile), ("keyfile", keyfile)):
        if path is not None and not os.path.isfile(path):
            raise ConfigurationError(f"{name}: no such file: {path!r}")
    try:
        context = ssl.create_default_context(cafile=cafile)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise ConfigurationError(
            f"cacertfile: cannot load CA certificates from {cafile!r}: {exc}"
        ) from exc
    if certfile is not None:
        try:
            context.load_cert_chain(certfile, keyfile)
        except (OSError, ValueError) as exc:
            raise ConfigurationError(
                f"certfile: cannot load the client certificate {certfile!r} "
                f"(keyfile={keyfile!r}): {exc}"
            ) from exc
    if verify == "verify_none":
        # Order matters: the ssl module refuses CERT_NONE while check_hostname is on.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def parse_url(url: str, **overrides: Any) -> ConnectionParameters:
    """Parse an ``amqp://`` or ``amqps://`` URL into :class:`ConnectionParameters`.

    The form is ``amqp[s]://[user[:password]@][host][:port][/vhost][?name=value&...]``.
    Absent parts take the defaults of :class:`ConnectionParameters` (the port defaults to
    5672 for ``amqp`` and 5671 for ``amqps``); an empty user name or password is kept
    as empty. User name, password, host and vhost are percent-decoded as UTF-8
    (``%2F`` is ``/``, ``%C3%A9`` is ``é``); IPv6 hosts go in brackets.

    The path holds the virtual host: no path or a bare ``/`` means ``/`` (see the module
    docstring for why this differs from the URI spec), ``/name`` means ``name``, and a
    second unescaped ``/`` is an error, since vhost names containing ``/`` must be
    written ``%2F``.

    Query parameters: ``heartbeat`` (seconds), ``connection_timeout`` (seconds, may be
    fractional), ``channel_max``, ``frame_max``, ``auth_mechanism`` (``plain``,
    ``amqplain``, ``external``) and ``connection_name``; with TLS also
    ``server_name_indication`` (the name to verify and send as SNI), ``verify``
    (``verify_peer`` or ``verify_none``), ``cacertfile``, ``certfile`` and ``keyfile``.
    The last four build an ``ssl.SSLContext`` from ``ssl.create_default_context()``.

    Args:
        url: The URL. Surrounding whitespace (e.g. a newline from an env file) is
            ignored; whitespace inside it is an error.
        **overrides: Values that take precedence over the URL: ``heartbeat``,
            ``connection_timeout``, ``channel_max``, ``frame_max``, ``auth_mechanism``,
            ``connection_name``, ``ssl_context``, ``client_properties``, ``locale``,
            ``username``, ``password``, ``virtual_host``. An ``ssl_context`` that is not
            None replaces any context built from the URL (its TLS files are then not
            read) and turns TLS on even for an ``amqp://`` URL, which keeps its default
            port 5672 unless the URL names one.

    Returns:
        The validated parameters.

    Raises:
        ConfigurationError: the URL is malformed, uses another scheme, has an invalid
            or duplicated or unknown query parameter, names an unreadable TLS file, or an
            override is unknown or invalid. The message names the part at fault and
            never contains the password.
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"url: must be a str, got {_type_name(url)}")
    unknown = sorted(set(overrides) - _OVERRIDES)
    if unknown:
        raise ConfigurationError(
            f"overrides: unknown option(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(_OVERRIDES))}"
        )

    url = url.strip()
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise ConfigurationError(
            "url: contains whitespace or control characters; percent-encode them"
        )
    match = _SCHEME_RE.match(url)
    if match is None:
        raise ConfigurationError("scheme: the URL must start with amqp:// or amqps://")
    scheme = match.group(1).lower()  # RFC 3986: schemes are case-insensitive
    if scheme not in _SCHEME_PORTS:
        raise ConfigurationError(f"scheme: must be amqp or amqps, got {match.group(1)!r}")
    rest = url[match.end() :]

    rest, hash_sign, _ = rest.partition("#")
    if hash_sign:
        raise ConfigurationError(
            "fragment: AMQP URLs have no '#fragment'; percent-encode '#' as %23"
        )
    rest, _, query = rest.partition("?")
    authority, slash, path = rest.partition("/")

    fields: dict[str, Any] = {}
    userinfo, at_sign, hostport = authority.rpartition("@")
    if at_sign:
        user_raw, colon, password_raw = userinfo.partition(":")
        fields["username"] = _decode("username", user_raw)
        if colon:  # "user@host" has no password part: keep the default
            fields["password"] = _decode("password", password_raw)
    host, port = _split_host_port(hostport, _SCHEME_PORTS[scheme])
    if host is not None:
        fields["host"] = host
    fields["port"] = port

    if slash and path:
        if "/" in path:
            raise ConfigurationError(
                "virtual_host: the URL path has more than one segment; write a '/' "
                "inside the vhost name as %2F"
            )
        fields["virtual_host"] = _decode("virtual_host", path)
    # else: no path, or a bare "/": RabbitMQ's default vhost, the dataclass default.

    params = _parse_query(query)
    context_override = overrides.get("ssl_context")
    use_tls = scheme == "amqps" or context_override is not None
    tls_only = sorted(_TLS_PARAMS & params.keys())
    if tls_only and not use_tls:
        raise ConfigurationError(
            f"{tls_only[0]}: only allowed with amqps:// URLs (or an ssl_context override)"
        )
    fields["use_tls"] = use_tls

    for name in _INT_PARAMS & params.keys():
        fields[name] = _query_int(name, params[name])
    if "connection_timeout" in params:
        fields["connection_timeout"] = _query_seconds(
            "connection_timeout", params["connection_timeout"]
        )
    for name in _TEXT_PARAMS & params.keys():
        fields[name] = params[name]
    if "server_name_indication" in params:
        fields["server_hostname"] = params["server_name_indication"]
    if context_override is None:
        fields["ssl_context"] = _tls_context(params)
    else:
        # The caller's context wins, but a typo in the URL's TLS options is still a typo.
        verify = params.get("verify")
        if verify is not None and verify not in _VERIFY_VALUES:
            raise ConfigurationError(
                f"verify: must be one of {', '.join(_VERIFY_VALUES)}, got {verify!r}"
            )

    fields.update((key, value) for key, value in overrides.items() if key != "ssl_context")
    if context_override is not None:
        fields["ssl_context"] = context_override
    return ConnectionParameters(**fields)


def parse_urls(urls: str | Sequence[str], **overrides: Any) -> list[ConnectionParameters]:
    """Parse one URL or a list of URLs (e.g. the nodes of a cluster, tried in order).

    Args:
        urls: A single URL, or a non-empty sequence of URLs.
        **overrides: Applied to every URL; see :func:`parse_url`.

    Returns:
        One :class:`ConnectionParameters` per URL, in the given order.

    Raises:
        ConfigurationError: ``urls`` is empty or not strings, or a URL is invalid; for
            a sequence, the message starts with the index (``urls[2]: ...``).
    """
    if isinstance(urls, str):
        return [parse_url(urls, **overrides)]
    # bytes is a Sequence too (of ints); refuse it explicitly rather than per element.
    if isinstance(urls, bytes | bytearray) or not isinstance(urls, Sequence):
        raise ConfigurationError(
            f"urls: must be a str or a sequence of str, got {_type_name(urls)}"
        )
    if not urls:
        raise ConfigurationError("urls: at least one URL is required")
    result: list[ConnectionParameters] = []
    for index, url in enumerate(urls):
        try:
            result.append(parse_url(url, **overrides))
        except ConfigurationError as exc:
            raise ConfigurationError(f"urls[{index}]: {exc}") from exc
    return result


def default_url() -> str:
    """Return ``$RABBITMQ_URL``, or :data:`DEFAULT_URL` when it is unset or empty.

    An empty variable counts as unset because ``RABBITMQ_URL=`` in an env file or CI
    configuration usually means "not configured", not "connect to nowhere".
    """
    return os.environ.get("RABBITMQ_URL") or DEFAULT_URL

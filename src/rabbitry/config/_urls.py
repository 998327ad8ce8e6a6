"""AMQP URLs: :func:`parse_url`, :func:`parse_urls` and :func:`default_url`.

The grammar is RabbitMQ's URI specification with its query parameters; the differences,
each chosen so that a URL means what a Python user expects, are listed in
:mod:`rabbitry.config`. Every error is a
:class:`~rabbitry.exceptions.ConfigurationError` that names the URL part and never
contains the password.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from ..exceptions import ConfigurationError
from ._parameters import AMQP_PORT, AMQPS_PORT, DEFAULT_URL, ConnectionParameters, type_name

__all__ = ["default_url", "parse_url", "parse_urls"]

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
        raise ConfigurationError(f"url: must be a str, got {type_name(url)}")
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
        raise ConfigurationError(f"urls: must be a str or a sequence of str, got {type_name(urls)}")
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

"""The endpoints of a shovel as the command line writes them: a broker URL (with its
vhost) and a queue, or an exchange and a routing key."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import SplitResult, quote, unquote, urlsplit, urlunsplit

from ..exceptions import ConfigurationError

__all__ = ["Endpoint", "parse_destination", "parse_source"]


@dataclass(frozen=True)
class Endpoint:
    """A shovel end: the broker URL (with its vhost) and the queue or exchange.

    Attributes:
        url: an ``amqp://`` URL whose path is the vhost (credentials included).
        name: the queue (source) or exchange (destination; ``""`` is the default one).
        routing_key: the destination routing key (``None``: each message's own).
    """

    url: str
    name: str
    routing_key: str | None = None


def _split_url(text: str, field: str) -> tuple[SplitResult, list[str]]:
    parts = urlsplit(text)
    if parts.scheme not in ("amqp", "amqps"):
        raise ConfigurationError(f"{field}: must start with amqp:// or amqps://, got {text!r}")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    segments = [unquote(s) for s in path.split("/")] if path else []
    return parts, segments


def _join_url(parts: SplitResult, vhost: str) -> str:
    return urlunsplit((parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), parts.query, ""))


def _with_vhost(base: str, field: str) -> tuple[SplitResult, str]:
    parts, segments = _split_url(base, field)
    if len(segments) > 1:
        raise ConfigurationError(f"{field}: the URL may name a vhost only, got {base!r}")
    return parts, segments[0] if segments and segments[0] else "/"


def parse_source(text: str, default_url: str) -> Endpoint:
    """``amqp://host/[VHOST/]QUEUE`` (the vhost percent-encoded: ``%2F`` is ``/``), or a
    bare ``QUEUE`` on ``default_url``.

    Raises:
        ConfigurationError: not of that form, or no queue named.
    """
    field = "--from"
    if "://" not in text:
        parts, vhost = _with_vhost(default_url, "--url")
        name = text
    else:
        parts, segments = _split_url(text, field)
        if len(segments) not in (1, 2):
            raise ConfigurationError(
                f"{field}: expected amqp://HOST/[VHOST/]QUEUE (vhost '/' is %2F), got {text!r}"
            )
        name = segments[-1]
        vhost = segments[0] if len(segments) == 2 and segments[0] else "/"
    if not name:
        raise ConfigurationError(f"{field}: no queue named in {text!r}")
    return Endpoint(_join_url(parts, vhost), name)


def parse_destination(text: str, default_url: str) -> Endpoint:
    """``amqp://host/EXCHANGE``, ``amqp://host/VHOST/EXCHANGE`` or
    ``amqp://host/VHOST/EXCHANGE/ROUTING_KEY`` (``%2F`` is the vhost ``/``; an empty
    EXCHANGE is the default exchange, e.g. ``amqp://host/%2F//QUEUE``), or a bare
    ``EXCHANGE[/ROUTING_KEY]`` on ``default_url``. Without a routing key each message
    keeps its own.

    Raises:
        ConfigurationError: not of that form.
    """
    field = "--to"
    key: str | None
    if "://" not in text:
        parts, vhost = _with_vhost(default_url, "--url")
        exchange, sep, rest = text.partition("/")
        key = rest if sep else None
    else:
        parts, segments = _split_url(text, field)
        if not 1 <= len(segments) <= 3:
            raise ConfigurationError(
                f"{field}: expected amqp://HOST/[VHOST/]EXCHANGE[/ROUTING_KEY] "
                f"(vhost '/' is %2F), got {text!r}"
            )
        if len(segments) == 1:
            vhost, exchange, key = "/", segments[0], None
        else:
            vhost = segments[0] or "/"
            exchange = segments[1]
            key = segments[2] if len(segments) == 3 else None
    if not exchange and key is None:
        raise ConfigurationError(
            f"{field}: the default exchange needs a routing key (the target queue), "
            f"e.g. amqp://host/%2F//QUEUE; got {text!r}"
        )
    return Endpoint(_join_url(parts, vhost), exchange, key)

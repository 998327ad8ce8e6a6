"""Tests for rabbitry.config: ConnectionParameters validation and AMQP URL parsing."""

from __future__ import annotations

import dataclasses
import pickle
import ssl
from typing import TYPE_CHECKING, Any

import pytest

from rabbitry.config import (
    AMQP_PORT,
    AMQPS_PORT,
    DEFAULT_URL,
    ConnectionParameters,
    default_url,
    parse_url,
    parse_urls,
)
from rabbitry.exceptions import AMQPError, ConfigurationError

if TYPE_CHECKING:
    from pathlib import Path

SECRET = "s3cr3t-Pa55"


def tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


# --------------------------------------------------------------------------- defaults


def test_defaults() -> None:
    params = ConnectionParameters()
    assert params.host == "127.0.0.1"
    assert params.port == 5672
    assert params.virtual_host == "/"
    assert params.username == "guest"
    assert params.password == "guest"
    assert params.use_tls is False
    assert params.ssl_context is None
    assert params.server_hostname is None
    assert params.heartbeat == 60
    assert params.connection_timeout == 10.0
    assert params.channel_max == 2047
    assert params.frame_max == 131072
    assert params.auth_mechanism == "PLAIN"
    assert params.connection_name is None
    assert params.locale == "en_US"
    assert params.client_properties is None


def test_default_url_parses_to_defaults() -> None:
    assert parse_url(DEFAULT_URL) == ConnectionParameters()


@pytest.mark.parametrize(
    "url", ["amqp://", "amqp:///", "AMQP://", "Amqp://127.0.0.1", "amqp://127.0.0.1:5672"]
)
def test_minimal_urls_give_defaults(url: str) -> None:
    assert parse_url(url) == ConnectionParameters()


@pytest.mark.parametrize(
    ("url", "port", "use_tls"),
    [
        ("amqp://rabbit", AMQP_PORT, False),
        ("amqps://rabbit", AMQPS_PORT, True),
        ("AMQPS://rabbit", AMQPS_PORT, True),
        ("amqp://rabbit:1234", 1234, False),
        ("amqps://rabbit:5672", 5672, True),
        ("amqp://rabbit:", AMQP_PORT, False),
        ("amqps://rabbit:", AMQPS_PORT, True),
        ("amqp://rabbit:65535", 65535, False),
        ("amqp://rabbit:1", 1, False),
    ],
)
def test_scheme_and_port(url: str, port: int, use_tls: bool) -> None:
    params = parse_url(url)
    assert params.host == "rabbit"
    assert params.port == port
    assert params.use_tls is use_tls


def test_amqps_defaults() -> None:
    params = parse_url("amqps://rabbit.example.com")
    assert params.use_tls is True
    assert params.port == 5671
    assert params.server_hostname == "rabbit.example.com"
    # No TLS options: the transport uses ssl.create_default_context() itself.
    assert params.ssl_context is None


def test_configuration_error_is_value_error_and_amqp_error() -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_url("http://x")
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, AMQPError)


# --------------------------------------------------------------------------- userinfo


@pytest.mark.parametrize(
    ("userinfo", "username", "password"),
    [
        ("", "guest", "guest"),  # no userinfo at all: both defaults
        ("alice@", "alice", "guest"),  # no password part: default password
        ("alice:@", "alice", ""),  # empty password is not absent
        (":@", "", ""),
        (":pw@", "", "pw"),
        ("alice:pw@", "alice", "pw"),
        ("al%69ce:p%77@", "alice", "pw"),
        ("us%40er:p%40ss@", "us@er", "p@ss"),
        ("user:pa%3Ass%3Aword@", "user", "pa:ss:word"),
        ("user:pa:ss@", "user", "pa:ss"),  # lenient: extra ':' belongs to the password
        ("user:p%2Fw%3Fx%23y@", "user", "p/w?x#y"),
        ("user:a+b@", "user", "a+b"),  # '+' is literal outside query strings
        ("user:a%20b@", "user", "a b"),
        ("j%C3%BCrgen:p%C3%A4ss%E2%82%AC@", "jürgen", "päss€"),
        ("jürgen:päss@", "jürgen", "päss"),  # raw non-ASCII is accepted too
        ("%E7%94%A8%E6%88%B7:%F0%9F%90%87@", "用户", "🐇"),
        ("user:p%25w@", "user", "p%w"),
    ],
)
def test_userinfo_decoding(userinfo: str, username: str, password: str) -> None:
    params = parse_url(f"amqp://{userinfo}rabbit/")
    assert params.username == username
    assert params.password == password
    assert params.host == "rabbit"


# --------------------------------------------------------------------------- vhost


@pytest.mark.parametrize(
    ("path", "vhost"),
    [
        ("", "/"),  # no path
        ("/", "/"),  # bare "/": RabbitMQ's default (not the URI spec's empty vhost)
        ("/%2f", "/"),
        ("/%2F", "/"),
        ("/vhost", "vhost"),
        ("/%2Fvhost", "/vhost"),
        ("/%2fvhost", "/vhost"),
        ("/a%2Fb%2Fc", "a/b/c"),
        ("/my%20vhost", "my vhost"),
        ("/my+vhost", "my+vhost"),
        ("/v%C3%A9", "vé"),
        ("/vé", "vé"),
        ("/%E6%97%A5%E6%9C%AC", "日本"),
    ],
)
def test_vhost_decoding(path: str, vhost: str) -> None:
    assert parse_url(f"amqp://rabbit{path}").virtual_host == vhost
    assert parse_url(f"amqp://rabbit{path}?heartbeat=1").virtual_host == vhost


@pytest.mark.parametrize("path", ["/a/b", "/a/", "//", "/%2F/x"])
def test_vhost_with_unescaped_slash_is_rejected(path: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^virtual_host: .*%2F"):
        parse_url(f"amqp://rabbit{path}")


# --------------------------------------------------------------------------- hosts


@pytest.mark.parametrize(
    ("url", "host", "port", "address"),
    [
        ("amqp://[::1]", "::1", 5672, "[::1]:5672"),
        ("amqp://[::1]/", "::1", 5672, "[::1]:5672"),
        ("amqp://[::1]:5673/v", "::1", 5673, "[::1]:5673"),
        ("amqps://[2001:db8::10]", "2001:db8::10", 5671, "[2001:db8::10]:5671"),
        ("amqp://u:p@[::ffff:10.0.0.1]:1", "::ffff:10.0.0.1", 1, "[::ffff:10.0.0.1]:1"),
        ("amqp://[fe80::1%25eth0]", "fe80::1%eth0", 5672, "[fe80::1%eth0]:5672"),
        ("amqp://[::1]?heartbeat=1", "::1", 5672, "[::1]:5672"),
        ("amqp://10.1.2.3:99", "10.1.2.3", 99, "10.1.2.3:99"),
        ("amqp://Rabbit.Example.COM", "Rabbit.Example.COM", 5672, "Rabbit.Example.COM:5672"),
        ("amqp://r%61bbit", "rabbit", 5672, "rabbit:5672"),
        ("amqp://u:p@:1234", "127.0.0.1", 1234, "127.0.0.1:1234"),
    ],
)
def test_hosts(url: str, host: str, port: int, address: str) -> None:
    params = parse_url(url)
    assert params.host == host
    assert params.port == port
    assert params.address == address


@pytest.mark.parametrize(
    ("url", "part"),
    [
        ("amqp://::1", "host"),
        ("amqp://::1:5672/", "host"),
        ("amqp://[::1", "host"),
        ("amqp://[::1]x", "host"),
        ("amqp://[::1]5672", "host"),
        ("amqp://[not-ipv6]", "host"),
        ("amqp://[127.0.0.1]", "host"),
        ("amqp://rabbit:abc", "port"),
        ("amqp://rabbit:0", "port"),
        ("amqp://rabbit:65536", "port"),
        ("amqp://rabbit:-1", "port"),
        ("amqp://rabbit:+5", "port"),
        ("amqp://rabbit:５６７２", "port"),
        ("amqp://rabbit:56 72", "url"),
        ("amqp://[::1]:abc", "port"),
        ("amqp://[::1]:99999", "port"),
    ],
)
def test_bad_host_or_port(url: str, part: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{part}: "):
        parse_url(url)


# --------------------------------------------------------------------------- query


@pytest.mark.parametrize(
    ("query", "field", "value"),
    [
        ("heartbeat=0", "heartbeat", 0),
        ("heartbeat=5", "heartbeat", 5),
        ("heartbeat=65535", "heartbeat", 65535),
        ("connection_timeout=3", "connection_timeout", 3.0),
        ("connection_timeout=2.5", "connection_timeout", 2.5),
        ("connection_timeout=.5", "connection_timeout", 0.5),
        ("connection_timeout=1e1", "connection_timeout", 10.0),
        ("channel_max=1", "channel_max", 1),
        ("channel_max=65535", "channel_max", 65535),
        ("frame_max=4096", "frame_max", 4096),
        ("frame_max=4294967295", "frame_max", 4294967295),
        ("auth_mechanism=external", "auth_mechanism", "EXTERNAL"),
        ("auth_mechanism=AMQPLAIN", "auth_mechanism", "AMQPLAIN"),
        ("auth_mechanism=Plain", "auth_mechanism", "PLAIN"),
        ("connection_name=billing", "connection_name", "billing"),
        ("connection_name=billing+worker", "connection_name", "billing worker"),
        ("connection_name=a%26b%3Dc", "connection_name", "a&b=c"),
        ("connection_name=%C3%A9t%C3%A9", "connection_name", "été"),
    ],
)
def test_query_parameters(query: str, field: str, value: Any) -> None:
    params = parse_url(f"amqp://rabbit/?{query}")
    assert getattr(params, field) == value
    assert type(getattr(params, field)) is type(value)


def test_all_query_parameters_together() -> None:
    params = parse_url(
        "amqp://rabbit/v?heartbeat=7&connection_timeout=1.5&channel_max=10"
        "&frame_max=8192&auth_mechanism=amqplain&connection_name=x"
    )
    assert (params.heartbeat, params.connection_timeout, params.channel_max) == (7, 1.5, 10)
    assert (params.frame_max, params.auth_mechanism, params.connection_name) == (
        8192,
        "AMQPLAIN",
        "x",
    )


@pytest.mark.parametrize("query", ["", "&", "heartbeat=5&", "&heartbeat=5", "heartbeat=5&&"])
def test_empty_query_items_are_ignored(query: str) -> None:
    params = parse_url(f"amqp://rabbit/?{query}")
    assert params.heartbeat == (5 if "heartbeat" in query else 60)


@pytest.mark.parametrize(
    ("query", "part"),
    [
        ("heartbeat=abc", "heartbeat"),
        ("heartbeat=", "heartbeat"),
        ("heartbeat=1.5", "heartbeat"),
        ("heartbeat=-1", "heartbeat"),
        ("heartbeat=65536", "heartbeat"),
        ("heartbeat=0x10", "heartbeat"),
        ("heartbeat=1_0", "heartbeat"),
        ("heartbeat=" + "9" * 5000, "heartbeat"),  # beyond int()'s digit limit
        ("heartbeat=%EF%BC%95", "heartbeat"),  # fullwidth 5
        ("heartbeat", "heartbeat"),
        ("channel_max=0", "channel_max"),
        ("channel_max=65536", "channel_max"),
        ("channel_max=x", "channel_max"),
        ("frame_max=4095", "frame_max"),
        ("frame_max=0", "frame_max"),
        ("frame_max=4294967296", "frame_max"),
        ("frame_max=big", "frame_max"),
        ("connection_timeout=abc", "connection_timeout"),
        ("connection_timeout=", "connection_timeout"),
        ("connection_timeout=0", "connection_timeout"),
        ("connection_timeout=-1", "connection_timeout"),
        ("connection_timeout=nan", "connection_timeout"),
        ("connection_timeout=inf", "connection_timeout"),
        ("connection_timeout=1e999", "connection_timeout"),
        ("connection_timeout=1_0", "connection_timeout"),
        ("auth_mechanism=cram-md5", "auth_mechanism"),
        ("auth_mechanism=", "auth_mechanism"),
        ("connection_name=", "connection_name"),
        ("heartbeat=5&heartbeat=5", "heartbeat"),
        ("heartbeat=5&channel_max=3&heartbeat=6", "heartbeat"),
        ("auth_mechanism=plain&auth_mechanism=amqplain", "auth_mechanism"),
        ("connection_name=a&connection_name=b", "connection_name"),
        ("heartbeat=%zz", "heartbeat"),
        ("connection_name=%FF", "connection_name"),
    ],
)
def test_bad_query_values_name_the_parameter(query: str, part: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{part}: "):
        parse_url(f"amqp://rabbit/?{query}")


def test_duplicate_query_parameter_message() -> None:
    with pytest.raises(ConfigurationError, match=r"^heartbeat: .*more than once"):
        parse_url("amqp://rabbit/?heartbeat=5&heartbeat=6")


@pytest.mark.parametrize(
    "name", ["hearbeat", "connection_attempts", "socket_timeout", "password", "depth", "Heartbeat"]
)
def test_unknown_query_parameter_is_named_and_known_ones_listed(name: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_url(f"amqp://rabbit/?{name}=1")
    message = str(info.value)
    assert message.startswith(f"query parameter {name!r}: ")
    for known in (
        "heartbeat",
        "connection_timeout",
        "channel_max",
        "frame_max",
        "auth_mechanism",
        "connection_name",
        "server_name_indication",
        "verify",
        "cacertfile",
        "certfile",
        "keyfile",
    ):
        assert known in message


# --------------------------------------------------------------------------- URL syntax


@pytest.mark.parametrize(
    ("url", "part"),
    [
        ("http://rabbit", "scheme"),
        ("amqpx://rabbit", "scheme"),
        ("amqp:/rabbit", "scheme"),
        ("amqp:rabbit", "scheme"),
        ("rabbit:5672", "scheme"),
        ("//rabbit", "scheme"),
        ("", "scheme"),
        ("amqp://rabbit/#frag", "fragment"),
        ("amqp://rabbit/v?heartbeat=1#x", "fragment"),
        ("amqp://rab bit", "url"),
        ("amqp://rabbit/\tv", "url"),
        ("amqp://rabbit/v\n?heartbeat=1", "url"),
        ("amqp://us%zzer@rabbit", "username"),
        ("amqp://user:pw%@rabbit", "password"),
        ("amqp://user:pw%FF@rabbit", "password"),
        ("amqp://rabbit/v%2", "virtual_host"),
        ("amqp://rabbit/%C3", "virtual_host"),
        ("amqp://ra%zzbbit", "host"),
    ],
)
def test_malformed_urls_name_the_part(url: str, part: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{part}: "):
        parse_url(url)


@pytest.mark.parametrize("url", ["  amqp://rabbit/v  ", "amqp://rabbit/v\n", "\tamqp://rabbit/v"])
def test_surrounding_whitespace_is_ignored(url: str) -> None:
    assert parse_url(url).virtual_host == "v"


@pytest.mark.parametrize("value", [b"amqp://rabbit", None, 5])
def test_non_string_url(value: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"^url: must be a str"):
        parse_url(value)


# --------------------------------------------------------------------------- TLS


def test_verify_none_builds_an_unverified_context() -> None:
    params = parse_url("amqps://rabbit?verify=verify_none")
    assert isinstance(params.ssl_context, ssl.SSLContext)
    assert params.ssl_context.check_hostname is False
    assert params.ssl_context.verify_mode == ssl.CERT_NONE
    assert params.use_tls is True


def test_verify_peer_builds_a_verifying_context() -> None:
    params = parse_url("amqps://rabbit?verify=verify_peer")
    assert isinstance(params.ssl_context, ssl.SSLContext)
    assert params.ssl_context.check_hostname is True
    assert params.ssl_context.verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", "rabbit"),
        ("server_name_indication=broker.example.com", "broker.example.com"),
        ("server_name_indication=broker.example.com&verify=verify_peer", "broker.example.com"),
    ],
)
def test_server_name_indication(query: str, expected: str) -> None:
    assert parse_url(f"amqps://rabbit/?{query}").server_hostname == expected


def test_missing_cacertfile_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(ConfigurationError, match=r"^cacertfile: no such file"):
        parse_url(f"amqps://rabbit?cacertfile={missing}")


def test_unparsable_cacertfile_is_named(tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigurationError, match=r"^cacertfile: cannot load"):
        parse_url(f"amqps://rabbit?cacertfile={garbage}")


def test_missing_certfile_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"^certfile: no such file"):
        parse_url(f"amqps://rabbit?certfile={tmp_path / 'client.pem'}")


def test_missing_keyfile_is_named(tmp_path: Path) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("x")
    with pytest.raises(ConfigurationError, match=r"^keyfile: no such file"):
        parse_url(f"amqps://rabbit?certfile={cert}&keyfile={tmp_path / 'key.pem'}")


def test_unparsable_certfile_is_named(tmp_path: Path) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("not a certificate\n")
    with pytest.raises(ConfigurationError, match=r"^certfile: cannot load"):
        parse_url(f"amqps://rabbit?certfile={cert}")


def test_keyfile_requires_certfile(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"^keyfile: requires certfile"):
        parse_url(f"amqps://rabbit?keyfile={tmp_path / 'key.pem'}")


@pytest.mark.parametrize("value", ["", "none", "VERIFY_NONE", "true"])
def test_bad_verify_value(value: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^verify: must be one of"):
        parse_url(f"amqps://rabbit?verify={value}")


@pytest.mark.parametrize(
    "query",
    [
        "verify=verify_none",
        "verify=verify_peer",
        "server_name_indication=x",
        "cacertfile=/ca.pem",
        "certfile=/c.pem",
        "keyfile=/k.pem",
    ],
)
def test_tls_parameters_need_amqps(query: str) -> None:
    name = query.partition("=")[0]
    with pytest.raises(ConfigurationError, match=rf"^{name}: only allowed with amqps://"):
        parse_url(f"amqp://rabbit/?{query}")


def test_ssl_context_override_wins_over_url_tls_options() -> None:
    context = tls_context()
    # The missing file is never read: the caller's context replaces the URL's.
    params = parse_url(
        "amqps://rabbit?cacertfile=/does/not/exist.pem&verify=verify_none", ssl_context=context
    )
    assert params.ssl_context is context
    assert params.use_tls is True


def test_ssl_context_override_still_checks_verify_spelling() -> None:
    with pytest.raises(ConfigurationError, match=r"^verify: "):
        parse_url("amqps://rabbit?verify=nope", ssl_context=tls_context())


def test_ssl_context_override_turns_tls_on_for_amqp() -> None:
    context = tls_context()
    params = parse_url("amqp://rabbit/?server_name_indication=sni.example", ssl_context=context)
    assert params.use_tls is True
    assert params.ssl_context is context
    assert params.port == 5672  # the scheme's port is kept
    assert params.server_hostname == "sni.example"


def test_ssl_context_none_override_does_not_turn_tls_on() -> None:
    params = parse_url("amqp://rabbit", ssl_context=None)
    assert params.use_tls is False
    assert params.ssl_context is None


def test_ssl_context_override_must_be_a_context() -> None:
    with pytest.raises(ConfigurationError, match=r"^ssl_context: must be an ssl.SSLContext"):
        parse_url("amqp://rabbit", ssl_context=True)


# --------------------------------------------------------------------------- overrides


@pytest.mark.parametrize(
    ("override", "value"),
    [
        ("heartbeat", 0),
        ("connection_timeout", 0.25),
        ("channel_max", 5),
        ("frame_max", 65536),
        ("auth_mechanism", "EXTERNAL"),
        ("connection_name", "from-code"),
        ("locale", "de_DE"),
        ("username", "bob"),
        ("password", "other"),
        ("virtual_host", "override-vhost"),
        ("client_properties", {"product": "x"}),
    ],
)
def test_overrides_win_over_url(override: str, value: Any) -> None:
    url = (
        "amqp://alice:pw@rabbit/url-vhost?heartbeat=9&connection_timeout=9&channel_max=9"
        "&frame_max=9999&auth_mechanism=amqplain&connection_name=from-url"
    )
    params = parse_url(url, **{override: value})
    assert getattr(params, override) == value


def test_override_with_no_url_counterpart() -> None:
    assert parse_url("amqp://rabbit", heartbeat=5).heartbeat == 5


@pytest.mark.parametrize("key", ["host", "port", "use_tls", "server_hostname", "bogus"])
def test_unknown_override_is_rejected(key: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^overrides: unknown option\(s\) {key};"):
        parse_url("amqp://rabbit", **{key: 1})


@pytest.mark.parametrize(
    ("override", "value"),
    [("heartbeat", "5"), ("heartbeat", -1), ("frame_max", 4095), ("auth_mechanism", "x")],
)
def test_invalid_override_names_the_field(override: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{override}: "):
        parse_url("amqp://rabbit", **{override: value})


# --------------------------------------------------------------------------- parse_urls


def test_parse_urls_single_string() -> None:
    assert parse_urls("amqp://a") == [parse_url("amqp://a")]


@pytest.mark.parametrize("container", [list, tuple])
def test_parse_urls_sequence_keeps_order(container: type) -> None:
    urls = container(["amqp://a:1", "amqps://b", "amqp://[::1]:3/v"])
    result = parse_urls(urls)
    assert [p.address for p in result] == ["a:1", "b:5671", "[::1]:3"]
    assert [p.use_tls for p in result] == [False, True, False]


def test_parse_urls_applies_overrides_to_each() -> None:
    result = parse_urls(["amqp://a", "amqp://b?heartbeat=3"], heartbeat=11, connection_name="n")
    assert [(p.heartbeat, p.connection_name) for p in result] == [(11, "n"), (11, "n")]


@pytest.mark.parametrize("urls", [[], ()])
def test_parse_urls_empty_sequence(urls: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"^urls: at least one"):
        parse_urls(urls)


@pytest.mark.parametrize("urls", [b"amqp://a", 5, None, {"amqp://a"}])
def test_parse_urls_wrong_type(urls: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"^urls: must be a str or a sequence"):
        parse_urls(urls)


def test_parse_urls_names_the_failing_index() -> None:
    with pytest.raises(ConfigurationError, match=r"^urls\[1\]: port: "):
        parse_urls(["amqp://a", "amqp://b:x"])
    with pytest.raises(ConfigurationError, match=r"^urls\[0\]: url: must be a str"):
        parse_urls([b"amqp://a"])  # type: ignore[list-item]


def test_parse_urls_unknown_override() -> None:
    with pytest.raises(ConfigurationError, match=r"overrides: unknown"):
        parse_urls("amqp://a", nope=1)


# --------------------------------------------------------------------------- default_url


def test_default_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RABBITMQ_URL", "amqp://env-host/")
    assert default_url() == "amqp://env-host/"


@pytest.mark.parametrize("value", [None, ""])
def test_default_url_fallback(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("RABBITMQ_URL", raising=False)
    else:
        monkeypatch.setenv("RABBITMQ_URL", value)
    assert default_url() == DEFAULT_URL == "amqp://guest:guest@127.0.0.1:5672/"


# --------------------------------------------------------------------------- validation


def test_heartbeat_error_message_is_exact() -> None:
    with pytest.raises(ConfigurationError) as info:
        ConnectionParameters(heartbeat=-1)
    assert str(info.value) == "heartbeat: must be an integer in 0..65535, got -1"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"host": ""}, "host"),
        ({"host": 1}, "host"),
        ({"host": "[::1]"}, "host"),
        ({"host": "a b"}, "host"),
        ({"host": "a\x00b"}, "host"),
        ({"port": 0}, "port"),
        ({"port": 65536}, "port"),
        ({"port": "5672"}, "port"),
        ({"port": True}, "port"),
        ({"port": 5672.0}, "port"),
        ({"virtual_host": ""}, "virtual_host"),
        ({"virtual_host": None}, "virtual_host"),
        ({"virtual_host": "v" * 256}, "virtual_host"),
        ({"virtual_host": "é" * 128}, "virtual_host"),  # 256 bytes in UTF-8
        ({"username": None}, "username"),
        ({"username": b"guest"}, "username"),
        ({"password": None}, "password"),
        ({"password": 1234}, "password"),
        ({"username": "a\x00b"}, "username"),
        ({"password": "a\x00b"}, "password"),
        ({"use_tls": 1}, "use_tls"),
        ({"use_tls": "yes"}, "use_tls"),
        ({"use_tls": True, "ssl_context": "ctx"}, "ssl_context"),
        ({"ssl_context": ssl.create_default_context()}, "ssl_context"),
        ({"server_hostname": "sni"}, "server_hostname"),
        ({"use_tls": True, "server_hostname": ""}, "server_hostname"),
        ({"use_tls": True, "server_hostname": 5}, "server_hostname"),
        ({"heartbeat": -1}, "heartbeat"),
        ({"heartbeat": 65536}, "heartbeat"),
        ({"heartbeat": True}, "heartbeat"),
        ({"heartbeat": False}, "heartbeat"),
        ({"heartbeat": 1.0}, "heartbeat"),
        ({"heartbeat": None}, "heartbeat"),
        ({"connection_timeout": 0}, "connection_timeout"),
        ({"connection_timeout": -1.0}, "connection_timeout"),
        ({"connection_timeout": float("nan")}, "connection_timeout"),
        ({"connection_timeout": float("inf")}, "connection_timeout"),
        ({"connection_timeout": True}, "connection_timeout"),
        ({"connection_timeout": "10"}, "connection_timeout"),
        ({"connection_timeout": None}, "connection_timeout"),
        ({"channel_max": 0}, "channel_max"),
        ({"channel_max": 65536}, "channel_max"),
        ({"channel_max": True}, "channel_max"),
        ({"frame_max": 4095}, "frame_max"),
        ({"frame_max": 0}, "frame_max"),
        ({"frame_max": 2**32}, "frame_max"),
        ({"frame_max": True}, "frame_max"),
        ({"auth_mechanism": "CRAM-MD5"}, "auth_mechanism"),
        ({"auth_mechanism": ""}, "auth_mechanism"),
        ({"auth_mechanism": None}, "auth_mechanism"),
        ({"connection_name": ""}, "connection_name"),
        ({"connection_name": 5}, "connection_name"),
        ({"locale": ""}, "locale"),
        ({"locale": None}, "locale"),
        ({"client_properties": [("a", 1)]}, "client_properties"),
        ({"client_properties": "x"}, "client_properties"),
        ({"client_properties": {1: "x"}}, "client_properties key"),
        ({"client_properties": {"": "x"}}, "client_properties key"),
        ({"client_properties": {"k" * 256: "x"}}, "client_properties key"),
    ],
)
def test_every_validation_error_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{field}[ :]"):
        ConnectionParameters(**kwargs)


def test_frame_max_4095_is_rejected_with_the_spec_rule() -> None:
    with pytest.raises(ConfigurationError) as info:
        ConnectionParameters(frame_max=4095)
    assert "FRAME-MIN-SIZE" in str(info.value)
    assert "4095" in str(info.value)
    with pytest.raises(ConfigurationError, match=r"^frame_max: "):
        parse_url("amqp://rabbit?frame_max=4095")


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"frame_max": 4096}, "frame_max", 4096),
        ({"frame_max": 2**32 - 1}, "frame_max", 2**32 - 1),
        ({"heartbeat": 0}, "heartbeat", 0),
        ({"channel_max": 65535}, "channel_max", 65535),
        ({"port": 65535}, "port", 65535),
        ({"auth_mechanism": "external"}, "auth_mechanism", "EXTERNAL"),
        ({"auth_mechanism": "AmqPlain"}, "auth_mechanism", "AMQPLAIN"),
        ({"virtual_host": "v" * 255}, "virtual_host", "v" * 255),
        ({"username": "", "password": ""}, "password", ""),
        ({"host": "::1"}, "host", "::1"),
        ({"auth_mechanism": "AMQPLAIN", "password": "a\x00b"}, "password", "a\x00b"),
    ],
)
def test_boundary_values_are_accepted(kwargs: dict[str, Any], field: str, value: Any) -> None:
    assert getattr(ConnectionParameters(**kwargs), field) == value


@pytest.mark.parametrize("timeout", [5, 5.0, 0.001])
def test_connection_timeout_is_stored_as_float(timeout: float) -> None:
    params = ConnectionParameters(connection_timeout=timeout)
    assert type(params.connection_timeout) is float
    assert params.connection_timeout == timeout


def test_tls_server_hostname_defaults_to_host() -> None:
    assert ConnectionParameters(host="h", use_tls=True).server_hostname == "h"
    explicit = ConnectionParameters(host="h", use_tls=True, server_hostname="sni")
    assert explicit.server_hostname == "sni"


def test_password_error_does_not_echo_a_secret() -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_url(f"amqp://user:{SECRET}%zz@rabbit")
    assert SECRET not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        parse_url(f"amqp://user:{SECRET}@rabbit?heartbeat=x")
    assert SECRET not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        ConnectionParameters(password=f"{SECRET}\x00")
    assert SECRET not in str(info.value)


# --------------------------------------------------------------------------- secrets


@pytest.mark.parametrize(
    "params",
    [
        ConnectionParameters(password=SECRET),
        parse_url(f"amqp://user:{SECRET}@rabbit/v"),
        parse_url(f"amqps://user:{SECRET}@[::1]/v?verify=verify_none&heartbeat=3"),
    ],
)
def test_password_never_shown(params: ConnectionParameters) -> None:
    assert params.password == SECRET
    assert SECRET not in repr(params)
    assert SECRET not in str(params)
    assert SECRET not in params.display_url()
    assert ":***@" in params.display_url()
    assert "password" not in repr(params)


def test_ssl_context_not_in_repr() -> None:
    params = parse_url("amqps://rabbit?verify=verify_none")
    assert "SSLContext" not in repr(params)
    assert "ssl_context" not in repr(params)


@pytest.mark.parametrize(
    ("params", "url"),
    [
        (ConnectionParameters(), "amqp://guest:***@127.0.0.1:5672/%2F"),
        (
            ConnectionParameters(host="::1", port=1, virtual_host="a/b", username="u@x"),
            "amqp://u%40x:***@[::1]:1/a%2Fb",
        ),
        (
            ConnectionParameters(host="fe80::1%eth0"),
            "amqp://guest:***@[fe80::1%25eth0]:5672/%2F",
        ),
        (ConnectionParameters(host="h", use_tls=True), "amqps://guest:***@h:5672/%2F"),
        (
            ConnectionParameters(host="h", use_tls=True, server_hostname="sni"),
            "amqps://guest:***@h:5672/%2F?server_name_indication=sni",
        ),
        (
            ConnectionParameters(
                heartbeat=5,
                connection_timeout=2.5,
                channel_max=7,
                frame_max=8192,
                auth_mechanism="external",
                connection_name="my app",
            ),
            "amqp://guest:***@127.0.0.1:5672/%2F?heartbeat=5&connection_timeout=2.5"
            "&channel_max=7&frame_max=8192&auth_mechanism=external&connection_name=my+app",
        ),
    ],
)
def test_display_url(params: ConnectionParameters, url: str) -> None:
    assert params.display_url() == url


@pytest.mark.parametrize(
    "url",
    [
        "amqp://u:p@rabbit/v",
        "amqps://j%C3%BCrgen:p@[2001:db8::1]:1234/%2Fv%20x?heartbeat=0&connection_name=a+b",
        "amqps://u:p@rabbit/?server_name_indication=other&channel_max=3&frame_max=4096",
        "amqp://u:p@rabbit/?connection_timeout=0.1&auth_mechanism=external",
    ],
)
def test_display_url_round_trips_except_password(url: str) -> None:
    params = parse_url(url)
    again = parse_url(params.display_url(), password=params.password)
    assert again == params


# --------------------------------------------------------------------------- value object


def test_frozen() -> None:
    params = ConnectionParameters()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.heartbeat = 5  # type: ignore[misc]


def test_equality_and_hash_ignore_ssl_context_and_client_properties() -> None:
    a = ConnectionParameters(use_tls=True, ssl_context=tls_context(), client_properties={"a": 1})
    b = ConnectionParameters(use_tls=True)
    assert a == b
    assert hash(a) == hash(b)
    assert ConnectionParameters(heartbeat=1) != ConnectionParameters(heartbeat=2)


def test_client_properties_are_copied() -> None:
    props: dict[str, Any] = {"product": "app"}
    params = ConnectionParameters(client_properties=props)
    props["product"] = "changed"
    assert params.client_properties == {"product": "app"}
    assert params.client_properties is not props


def test_pickle_round_trip() -> None:
    params = parse_url(
        "amqp://u:p@rabbit/v?heartbeat=3&connection_name=n", client_properties={"k": "v"}
    )
    clone = pickle.loads(pickle.dumps(params))
    assert clone == params
    assert clone.password == "p"
    assert clone.client_properties == {"k": "v"}


def test_with_options_returns_new_validated_instance() -> None:
    params = ConnectionParameters()
    changed = params.with_options(heartbeat=5, host="other")
    assert (changed.heartbeat, changed.host) == (5, "other")
    assert params.heartbeat == 60
    assert isinstance(changed, ConnectionParameters)
    assert changed.with_options(auth_mechanism="external").auth_mechanism == "EXTERNAL"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"heartbeat": -1}, "heartbeat"),
        ({"frame_max": 4095}, "frame_max"),
        ({"port": True}, "port"),
        ({"server_hostname": "x"}, "server_hostname"),
    ],
)
def test_with_options_validates(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^{field}: "):
        ConnectionParameters().with_options(**changes)


def test_with_options_unknown_field() -> None:
    with pytest.raises(ConfigurationError, match=r"^with_options: unknown field\(s\) nope"):
        ConnectionParameters().with_options(nope=1)


def test_with_options_defaulted_server_hostname_follows_host() -> None:
    params = ConnectionParameters(host="a", use_tls=True)
    assert params.with_options(host="b").server_hostname == "b"
    assert params.with_options(host="b", server_hostname="sni").server_hostname == "sni"
    assert params.with_options(use_tls=False).server_hostname is None
    assert params.with_options(heartbeat=1).server_hostname == "a"


def test_with_options_explicit_server_hostname_is_kept() -> None:
    params = ConnectionParameters(host="a", use_tls=True, server_hostname="sni")
    assert params.with_options(host="b").server_hostname == "sni"
    with pytest.raises(ConfigurationError, match=r"^server_hostname: requires use_tls"):
        params.with_options(use_tls=False)


def test_with_options_turning_tls_off_needs_the_context_dropped() -> None:
    params = ConnectionParameters(use_tls=True, ssl_context=tls_context())
    with pytest.raises(ConfigurationError, match=r"^ssl_context: requires use_tls"):
        params.with_options(use_tls=False)
    assert params.with_options(use_tls=False, ssl_context=None).use_tls is False

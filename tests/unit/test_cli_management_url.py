"""Which management API the CLI uses when no --management-url is given."""

from __future__ import annotations

import pytest
from tests.support.fake_management import FakeManagementApi

from rabbitry import parse_url
from rabbitry.cli._common import CliError
from rabbitry.cli._exit import ExitCode
from rabbitry.cli._mgmt import resolve_management_url


def _never() -> str | None:
    raise AssertionError("the default port needs no AMQP connection")


def test_the_default_amqp_port_means_the_default_management_port() -> None:
    params = parse_url("amqp://guest:guest@broker.example:5672/")
    assert resolve_management_url(None, params, _never) == "http://broker.example:15672"


def test_amqps_on_its_default_port_means_https_on_15671() -> None:
    params = parse_url("amqps://guest:guest@broker.example:5671/")
    assert resolve_management_url(None, params, _never) == "https://broker.example:15671"


def test_an_explicit_url_is_used_as_given() -> None:
    params = parse_url("amqp://guest:guest@127.0.0.1:5682/")
    assert resolve_management_url("http://h:1/", params, _never) == "http://h:1/"


def test_another_port_uses_the_api_that_reports_the_same_cluster() -> None:
    params = parse_url("amqp://guest:guest@127.0.0.1:5682/")
    with (
        FakeManagementApi("rabbit@other-node") as other,
        FakeManagementApi("rabbitry4-5682@localhost") as own,
    ):
        url = resolve_management_url(
            None, params, lambda: "rabbitry4-5682@localhost", candidates=[other.url, own.url]
        )
        assert url == own.url
        assert other.paths == ["/api/overview"]


def test_another_port_refuses_the_api_of_another_cluster() -> None:
    params = parse_url("amqp://guest:guest@127.0.0.1:5682/")
    with FakeManagementApi("rabbit@other-node") as other:
        with pytest.raises(CliError) as caught:
            resolve_management_url(
                None, params, lambda: "rabbitry4-5682@localhost", candidates=[other.url]
            )
    assert caught.value.code == ExitCode.USAGE
    message = str(caught.value)
    assert "--management-url" in message
    assert "port 5682" in message and "'rabbit@other-node'" in message


def test_another_port_with_no_api_answering_asks_for_the_option() -> None:
    params = parse_url("amqp://guest:guest@127.0.0.1:5682/")
    with FakeManagementApi("x") as api:
        dead = api.url
    with pytest.raises(CliError, match="--management-url") as caught:
        resolve_management_url(None, params, lambda: "rabbit@a", candidates=[dead])
    assert "no answer" in str(caught.value)


def test_a_broker_without_a_cluster_name_asks_for_the_option() -> None:
    params = parse_url("amqp://guest:guest@127.0.0.1:5682/")
    with FakeManagementApi("rabbit@a") as api:
        with pytest.raises(CliError, match="no cluster_name"):
            resolve_management_url(None, params, lambda: None, candidates=[api.url])
        assert api.paths == []


def test_the_candidates_are_15672_and_the_amqp_port_plus_10000() -> None:
    params = parse_url("amqp://guest:guest@127.0.0.1:1/")
    with pytest.raises(CliError) as caught:
        resolve_management_url(None, params, lambda: "rabbit@nowhere", timeout=0.5)
    assert "http://127.0.0.1:15672: " in str(caught.value)
    assert "http://127.0.0.1:10001: " in str(caught.value)

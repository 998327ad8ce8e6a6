"""The shovel takes a list of URLs per side (cluster nodes, tried in order)."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest

import rabbitry
from rabbitry.config import parse_urls
from rabbitry.shovel import Shovel

if TYPE_CHECKING:
    from tests.integration.conftest import Names

pytestmark = pytest.mark.timeout(120)


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_shovel_with_a_list_of_urls_per_side_moves_and_its_repr_hides_passwords(
    url: str, names: Names
) -> None:
    source, target = names.queue("from"), names.queue("to")
    params = parse_urls(url)[0]
    dead = f"amqp://{params.username}:{params.password}@127.0.0.1:{unused_port()}/"
    with rabbitry.Connection(url) as conn:
        ch = conn.channel()
        ch.queue_declare(source)
        ch.queue_declare(target)
        ch.confirm_select()
        for i in range(10):
            future = ch.basic_publish("", source, b"%d" % i)
            assert future is not None
            future.result(30)
        # The first node of each list does not answer; the second one does.
        shovel = Shovel([dead, url], source, [dead, url], "", target, idle_timeout=0.5)
        shown = repr(shovel)
        assert shown.startswith("<Shovel [amqp://")
        assert f":{params.password}@" not in shown
        assert shown.count(":***@") == 4
        stats = shovel.run()
        assert stats.moved == 10
        assert ch.queue_declare(target, passive=True).message_count == 10


def test_shovel_refuses_bad_urls_naming_the_side(url: str) -> None:
    with pytest.raises(rabbitry.ConfigurationError, match=r"^destination: "):
        Shovel(url, "q", [url, "http://nope"], "", "k")
    with pytest.raises(rabbitry.ConfigurationError, match=r"^source: "):
        Shovel([], "q", url, "", "k")
    with pytest.raises(rabbitry.ConfigurationError, match=r"^source: must be an amqp"):
        Shovel(42, "q", url, "", "k")  # type: ignore[arg-type]

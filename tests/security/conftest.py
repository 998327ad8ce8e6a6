"""Shared fixtures of the security tests: test certificates and a TLS-enabled node.

``tls_node`` is one throw-away :class:`~tests.support.node.BrokerNode` per session (about
6 s to start) with a TLS listener on the last port of its block, ``verify_peer`` and
``fail_if_no_peer_cert = true`` (mutual TLS), PLAIN/AMQPLAIN/EXTERNAL offered and the
EXTERNAL user name taken from the client certificate's CN. Tests that use it are marked
``faults`` (they start a node). The certificates are made by ``trustme`` per session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import trustme
from tests.support.node import BrokerNode, find_scripts_dir

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

CLIENT_CN = "rabbitry-tls-client"


class TLSNode(BrokerNode):
    """A BrokerNode with a TLS listener on the last port of its block."""

    def __init__(self, tls: dict[str, str], **kwargs: object) -> None:
        super().__init__(plugins=["rabbitmq_auth_mechanism_ssl"], **kwargs)  # type: ignore[arg-type]
        self._tls = tls

    @property
    def tls_port(self) -> int:
        return self.ports.extra[-1]

    def _write_config(self) -> None:
        self._config.update(self._tls)
        self._config["listeners.ssl.1"] = f"127.0.0.1:{self.tls_port}"
        super()._write_config()


class Certs:
    def __init__(self, directory: Path) -> None:
        self.ca = trustme.CA()
        self.other_ca = trustme.CA()
        self.server = self.ca.issue_cert("localhost", "127.0.0.1")
        self.client = self.ca.issue_cert(CLIENT_CN, common_name=CLIENT_CN)
        self.ca_file = directory / "ca.pem"
        self.other_ca_file = directory / "other-ca.pem"
        self.server_cert = directory / "server.pem"
        self.server_key = directory / "server.key"
        self.client_cert = directory / "client.pem"
        self.client_key = directory / "client.key"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.other_ca.cert_pem.write_to_path(str(self.other_ca_file))
        self.server.cert_chain_pems[0].write_to_path(str(self.server_cert))
        self.server.private_key_pem.write_to_path(str(self.server_key))
        self.client.cert_chain_pems[0].write_to_path(str(self.client_cert))
        self.client.private_key_pem.write_to_path(str(self.client_key))
        for path in directory.iterdir():
            path.chmod(0o644)  # the node reads them


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def tls_node(certs: Certs) -> Iterator[TLSNode]:
    if find_scripts_dir() is None:
        pytest.fail("the TLS tests start their own RabbitMQ node: install rabbitmq-server")
    node = TLSNode(
        {
            "ssl_options.cacertfile": str(certs.ca_file),
            "ssl_options.certfile": str(certs.server_cert),
            "ssl_options.keyfile": str(certs.server_key),
            "ssl_options.verify": "verify_peer",
            "ssl_options.fail_if_no_peer_cert": "true",
            "auth_mechanisms.1": "PLAIN",
            "auth_mechanisms.2": "AMQPLAIN",
            "auth_mechanisms.3": "EXTERNAL",
            "ssl_cert_login_from": "common_name",
        }
    )
    try:
        node.start()
        node.ctl("add_user", CLIENT_CN, "unused-password-for-external")
        node.ctl("set_permissions", "-p", "/", CLIENT_CN, ".*", ".*", ".*")
        yield node
    finally:
        node.stop()

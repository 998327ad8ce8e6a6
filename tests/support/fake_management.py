"""A stand-in for the management HTTP API: ``/api/overview`` and ``/api/definitions``.

It answers for the cluster it is given, so a test can put "another broker's" API where a
command might look for it, with no plugin on any real node.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import TracebackType


class FakeManagementApi:
    """Serves ``cluster_name`` and ``definitions`` on 127.0.0.1 (a free port)."""

    def __init__(self, cluster_name: str, definitions: dict[str, Any] | None = None) -> None:
        self.cluster_name = cluster_name
        self.definitions = definitions or {"exchanges": [], "queues": [], "bindings": []}
        self.paths: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api.paths.append(self.path)
                if self.path == "/api/overview":
                    body: Any = {"cluster_name": api.cluster_name, "node": api.cluster_name}
                elif self.path.startswith("/api/definitions/"):
                    body = api.definitions
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> FakeManagementApi:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

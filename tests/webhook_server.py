"""A local HTTP server standing in for the services a call's tools POST to (webhook tools, the transfer
notice): each path answers as scripted, and every request is kept."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Route:
    body: str = "{}"
    status: int = 200
    delay_s: float = 0.0
    content_type: str = "application/json"


@dataclass
class Webhooks:
    base: str
    routes: dict[str, Route]
    requests: list[tuple[str, dict]] = field(default_factory=list)  # (path, JSON body) in arrival order
    headers: list[dict[str, str]] = field(default_factory=list)  # each request's headers (names lowercased)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def bodies(self, path: str) -> list[dict]:
        return [body for p, body in self.requests if p == path]


@contextmanager
def webhook_server(routes: dict[str, Route]) -> Iterator[Webhooks]:
    hooks = Webhooks("", routes)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            hooks.requests.append((self.path, json.loads(raw or b"{}")))
            hooks.headers.append({k.lower(): v for k, v in self.headers.items()})
            route = hooks.routes.get(self.path, Route("not found", 404, content_type="text/plain"))
            time.sleep(route.delay_s)
            data = route.body.encode()
            try:
                self.send_response(route.status)
                self.send_header("content-type", route.content_type)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the caller gave up (a timeout)
                pass

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    hooks.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="webhooks", daemon=True)
    thread.start()
    try:
        yield hooks
    finally:
        server.shutdown()
        server.server_close()

"""A real HTTP endpoint for webhook tests: a threaded http.server on 127.0.0.1.

Each path answers from a script of statuses (the last one repeats); ``hold`` makes a path wait
on an event before answering (a slow or hanging endpoint, with no sleeps in the tests). Every
request is recorded with its headers and raw body.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Endpoint:
    statuses: list[int] = field(default_factory=lambda: [200])
    hold: threading.Event | None = None  # answer only once this is set
    hold_timeout_s: float = 30.0
    location: str | None = None  # a Location header (redirect tests)
    headers: dict[str, str] = field(default_factory=dict)  # more answer headers
    body: bytes = b"ok"  # the answer's body


class WebhookServer:
    def __init__(self) -> None:
        self.endpoints: dict[str, Endpoint] = {}
        self.received: list[Received] = []
        self.arrived = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                with server.arrived:
                    server.received.append(
                        Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                    server.arrived.notify_all()
                endpoint = server.endpoints.get(self.path, Endpoint())
                if endpoint.hold is not None:
                    endpoint.hold.wait(endpoint.hold_timeout_s)
                status = endpoint.statuses.pop(0) if len(endpoint.statuses) > 1 else None
                status = status if status is not None else endpoint.statuses[0]
                try:
                    self.send_response(status)
                    if endpoint.location:
                        self.send_header("Location", endpoint.location)
                    for name, value in endpoint.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(endpoint.body)))
                    self.end_headers()
                    self.wfile.write(endpoint.body)
                except OSError:  # the client gave up (a timeout test)
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def on(
        self, path: str, *statuses: int, hold: threading.Event | None = None, body: bytes = b"ok"
    ) -> str:
        self.endpoints[path] = Endpoint(list(statuses) or [200], hold, body=body)
        return self.url(path)

    def at(self, path: str) -> list[Received]:
        return [r for r in self.received if r.path == path]

    def wait_for(self, path: str, count: int = 1, timeout_s: float = 30.0) -> bool:
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.at(path)) >= count, timeout_s)


@contextmanager
def webhook_server() -> Iterator[WebhookServer]:
    server = WebhookServer()
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        for endpoint in server.endpoints.values():
            if endpoint.hold is not None:
                endpoint.hold.set()
        server.httpd.shutdown()
        server.httpd.server_close()

"""Test support: a recording hop in front of the demo model.

Every request chatsite sends upstream is recorded (its JSON body: model, messages, max_tokens)
and forwarded to the demo model, whose answer is relayed byte for byte. Tests read what went
upstream: the model picked, the system message, the continuation's messages, title requests.
Plain threads, `http.server` and httpx: nothing of the product is used.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


@dataclass
class Recorded:
    """The bodies of the chat completion requests seen, in order."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.requests)

    def models(self) -> list[str]:
        return [r.get("model", "") for r in self.snapshot()]


@dataclass
class Gate:
    """Holds the requests `matches` picks (after recording them) until `open()`: such a
    request is then in flight for as long as the test needs, however fast the machine is."""

    matches: Callable[[dict[str, Any]], bool]
    hold_seconds: float = 30.0  # the longest a request is held before it goes on anyway
    opened: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Event = field(default_factory=threading.Event)  # one is held (or was)

    def open(self) -> None:
        self.opened.set()


def _handler(
    upstream: str, recorded: Recorded, gate: Gate | None = None
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection closes

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_GET(self) -> None:
            response = httpx.get(upstream + self.path.removeprefix("/v1"), timeout=10)
            self.send_response(response.status_code)
            self.send_header("Content-Type", response.headers.get("content-type", ""))
            self.end_headers()
            self.wfile.write(response.content)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with recorded.lock:
                recorded.requests.append(json.loads(body))
            if gate is not None and gate.matches(json.loads(body)):
                gate.arrived.set()
                gate.opened.wait(gate.hold_seconds)
            url = upstream + self.path.removeprefix("/v1")
            headers = {"content-type": "application/json"}
            try:
                with httpx.stream("POST", url, content=body, headers=headers, timeout=60) as r:
                    self.send_response(r.status_code)
                    self.send_header("Content-Type", r.headers.get("content-type", ""))
                    self.end_headers()
                    for piece in r.iter_raw():
                        self.wfile.write(piece)
                        self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError, httpx.HTTPError):
                return

    return Handler


@contextlib.contextmanager
def recording_upstream(upstream: str, gate: Gate | None = None) -> Iterator[tuple[str, Recorded]]:
    """Serve on a free port in front of `upstream` (a base URL ending in /v1); yield (our base
    URL, what was recorded); stop afterwards (opening `gate`, so nothing stays held)."""
    recorded = Recorded()
    handler = _handler(upstream.rstrip("/"), recorded, gate)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", recorded
    finally:
        if gate is not None:
            gate.open()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

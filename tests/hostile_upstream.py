"""Test support: a tiny OpenAI-style model server that ignores `max_tokens`.

The demo model honours `max_tokens` (chat/demo_upstream/app.py cuts its answer there), so it
cannot show what the turn does when a model server does not. This one streams `tokens` deltas
whatever it is asked, records each request's `max_tokens` and how many deltas it got out
before the client hung up. Plain threads and `http.server`: nothing of the product is used.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    """What the server saw: each request's `max_tokens`, and deltas sent per request."""

    max_tokens: list[int | None] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    hung_up: list[bool] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _delta(text: str) -> bytes:
    return _event({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})


def hostile_handler(seen: Seen, tokens: int, delta_text: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: the body ends when the connection closes, so no chunked framing to write.
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_GET(self) -> None:
            body = json.dumps({"object": "list", "data": [{"id": "demo-full"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.max_tokens.append(request.get("max_tokens"))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            sent, hung_up = 0, False
            try:
                for _ in range(tokens):
                    self.wfile.write(_delta(delta_text))
                    self.wfile.flush()
                    sent += 1
                stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                self.wfile.write(_event(stop))
                usage = {"prompt_tokens": 5, "completion_tokens": tokens}
                self.wfile.write(_event({"choices": [], "usage": usage}))
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                hung_up = True
            seen.sent.append(sent)
            seen.hung_up.append(hung_up)
            seen.done.set()

    return Handler


@contextlib.contextmanager
def hostile_upstream(tokens: int = 20_000, delta_text: str = "word ") -> Iterator[tuple[str, Seen]]:
    """Serve on a free port; yield (base URL ending in /v1, what it saw); stop afterwards."""
    seen = Seen()
    server = ThreadingHTTPServer(("127.0.0.1", 0), hostile_handler(seen, tokens, delta_text))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

"""Standalone demo model: `python -m chat.demo_upstream --port N` (daphne, no Django)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from chat.demo_upstream.app import DemoModel


def serve(
    application: Callable[..., Awaitable[None]], host: str, port: int, base_path: str
) -> None:
    """Serve an ASGI app with daphne until SIGINT/SIGTERM; print one line once listening."""
    # Importing daphne.server installs Twisted's asyncio reactor, so only do it when serving.
    from daphne.server import Server

    interface = host.replace(":", r"\:")
    server: Any = None

    def announce() -> None:
        bound = server.listening_addresses[0][1] if server.listening_addresses else port
        shown = f"[{host}]" if ":" in host else host
        print(f"demo model listening on http://{shown}:{bound}{base_path}", flush=True)

    server = Server(
        application,
        endpoints=[f"tcp:port={port}:interface={interface}"],
        verbosity=0,
        ready_callable=announce,
        server_name="chatsite-demo",
    )
    server.run()
    if not server.listening_addresses:
        sys.exit(1)  # daphne logged why (usually: the port is taken)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m chat.demo_upstream",
        description="The built-in OpenAI-compatible demo model.",
    )
    parser.add_argument("--port", type=int, required=True, help="TCP port (0 picks a free one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--ttfb-ms", type=int, default=None, help="default: $DEMO_TTFB_MS or 150")
    parser.add_argument("--tps", type=float, default=None, help="tokens/s, 0 = as fast as possible")
    parser.add_argument("--prefix", default="/v1")
    args = parser.parse_args(argv)
    model = DemoModel(prefix=args.prefix, ttfb_ms=args.ttfb_ms, tokens_per_second=args.tps)
    serve(model, args.host, args.port, model.prefix)

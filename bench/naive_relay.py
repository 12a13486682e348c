"""The naive relay baseline: a new HTTP client per turn and a socket frame per token.

This is what a first version of a chat relay usually looks like, kept out of the product and
used only by the benchmarks to show what chatsite's choices buy. It speaks the same frames
as chatsite (`ready`, `chunk`, `done`) so the same load client drives both, but it has none
of chatsite's work either: no authentication, no database, no limiter, no stream log.

    NAIVE_UPSTREAM=http://127.0.0.1:PORT/v1 daphne -p 9000 bench.naive_relay:application
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import httpx

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

PAGE = Path(__file__).resolve().parent / "naive_renderer.html"
UPSTREAM = os.environ.get("NAIVE_UPSTREAM", "http://127.0.0.1:8000/demo/v1").rstrip("/")
MODEL = os.environ.get("NAIVE_MODEL", "demo-full")


async def relay_turn(send: Send, mid: str, text: str) -> None:
    """One answer: a fresh client (a new TCP connection), one frame per upstream delta."""
    payload = {"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": True}
    seq = 0
    async with (
        httpx.AsyncClient(timeout=60, trust_env=False) as client,
        client.stream("POST", f"{UPSTREAM}/chat/completions", json=payload) as response,
    ):
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            for choice in json.loads(data).get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    frame = {"type": "chunk", "mid": mid, "seq": seq, "text": content}
                    await send({"type": "websocket.send", "text": json.dumps(frame)})
                    seq += 1
    done = {"type": "done", "mid": mid, "seq": seq, "status": "complete"}
    await send({"type": "websocket.send", "text": json.dumps(done)})


async def application(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] == "http":
        # The browser benchmark's naive renderer page is served from here (a page injected
        # with Playwright's route has no address, and Chromium then blocks its socket to
        # 127.0.0.1); anything else is a liveness answer.
        body, kind = b"naive relay", b"text/plain"
        if scope["path"] == "/__bench/naive/":
            body, kind = PAGE.read_bytes(), b"text/html; charset=utf-8"
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]}
        )
        await send({"type": "http.response.body", "body": body})
        return
    if scope["type"] != "websocket":
        return
    turns = 0
    while True:
        message = await receive()
        if message["type"] == "websocket.connect":
            await send({"type": "websocket.accept"})
            ready = {"type": "ready", "tier": "full", "model": MODEL, "instance": "naive"}
            await send({"type": "websocket.send", "text": json.dumps(ready)})
        elif message["type"] == "websocket.receive":
            frame = json.loads(message.get("text") or "{}")
            if frame.get("type") == "prompt":
                turns += 1
                # Inline, as naive relays do: the socket reads nothing else while it streams.
                await relay_turn(send, f"naive-{id(scope)}-{turns}", str(frame.get("text", "")))
        elif message["type"] == "websocket.disconnect":
            return

"""The benchmarks' load clients: lean SSE clients (for a model or a proxy) and a chat socket client.

All three time one answer the same way — from sending the request (or prompt frame) to each
token's arrival, to the end — so "direct from the model" and "through a relay" compare like for
like.
They run in the benchmark's own process on the same 2-core machine as the servers, so their CPU
competes with what they measure; the runner records how much they used.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import time
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect

from chat.demo_upstream import long_tokens

# The demo model sends each token as its own SSE event with exactly this prefix; the role-only
# first event ("delta":{"role":...}) does not match, so counting it counts tokens.
TOKEN_MARK = b'"delta":{"content":'
# A desktop browser, so the socket gets the tier a desktop gets (the UA parse is cached).
DESKTOP_UA = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36"
)


@dataclass
class TurnRecord:
    """One answer as a client saw it; times in seconds from the moment it asked."""

    tokens_expected: int
    token_times: list[float] = field(default_factory=list)
    frames: int = 0  # socket chunk frames, or HTTP body chunks that carried tokens
    done: float | None = None
    error: str = ""
    started_at: float = 0.0  # perf_counter when it asked (to place turns in a time window)

    @property
    def ok(self) -> bool:
        return not self.error and len(self.token_times) == self.tokens_expected

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def last_token(self) -> float | None:
        return self.token_times[-1] if self.token_times else None

    def token_delays(self, tokens_per_second: float) -> list[float]:
        """How late each token after the first arrived against the model's pace, in seconds.

        The demo model sends token k at (first due) + k / tps. The schedule is anchored where
        this answer was earliest (min over k of arrival - k / tps), so a delay is what the
        path added to that token beyond its best case: coalescing waits, queueing, jitter.
        """
        if len(self.token_times) < 2 or tokens_per_second <= 0:
            return []
        shifted = [t - k / tokens_per_second for k, t in enumerate(self.token_times)]
        anchor = min(shifted)
        return [s - anchor for s in shifted[1:]]


def answer_offsets(tokens: int) -> list[int]:
    """Cumulative character counts of the demo model's `/long <tokens>` answer, per token."""
    return list(accumulate(len(t) for t in long_tokens(tokens)))


def long_prompt(tokens: int) -> str:
    return f"/long {tokens}"


class DirectClient:
    """Streams chat completions straight from the demo model over one keep-alive connection.

    A hand-written HTTP/1.1 client rather than httpx: it does the least work per byte, so the
    direct side's numbers are the model's, not a client library's.
    """

    def __init__(self, base_url: str, model: str = "demo-full") -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = parts.path.rstrip("/") + "/chat/completions"
        self.model = model
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()

    def request(self, prompt: str, headers: str = "") -> bytes:
        """The HTTP request of one streamed chat completion (usage included, as chatsite asks)."""
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "user", "content": prompt}],
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{headers}"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        return head + body

    async def turn(
        self, prompt: str, tokens: int, timeout: float, offsets: list[int] | None = None
    ) -> TurnRecord:
        """One answer; `offsets` is unused here (each SSE event is one token)."""
        record = TurnRecord(tokens)
        if self.reader is None or self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        request = self.request(prompt)
        reader, clock = self.reader, time.perf_counter
        start = record.started_at = clock()
        try:
            async with asyncio.timeout(timeout):
                self.writer.write(request)
                await read_stream_head(reader)
                times = record.token_times
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                    if size == 0:
                        await reader.readuntil(b"\r\n")
                        break
                    data = await reader.readexactly(size + 2)
                    count = data.count(TOKEN_MARK)
                    if count:
                        now = clock() - start
                        times.extend([now] * count)
                        record.frames += 1
                record.done = clock() - start
        except Exception as exc:  # a benchmark records failures instead of stopping
            record.error = f"{type(exc).__name__}: {exc}"[:200]
            await self.close()
            self.reader = self.writer = None
        return record


class ProxyClient(DirectClient):
    """Streams chat completions through an OpenAI-compatible proxy (the peer, LiteLLM).

    The same request and the same keep-alive connection as `DirectClient`, but a proxy
    re-encodes the events (LiteLLM sends a role-only first delta with `"content":""`) and may
    regroup them, so tokens are not counted by a byte pattern: each event's JSON is parsed
    and its content's characters are mapped back to token arrivals with `offsets`, as
    `SocketClient` does with chunk frames. The time is taken when the bytes arrive, before
    parsing them.
    """

    def __init__(self, base_url: str, api_key: str, model: str = "demo-full") -> None:
        super().__init__(base_url, model)
        self.auth = f"Authorization: Bearer {api_key}\r\n"

    async def turn(
        self, prompt: str, tokens: int, timeout: float, offsets: list[int] | None = None
    ) -> TurnRecord:
        record = TurnRecord(tokens)
        if self.reader is None or self.writer is None or self.reader.at_eof():
            # A keep-alive connection the proxy closed while it was idle: open a new one.
            await self.close()
            await self.open()
        assert self.reader is not None and self.writer is not None
        offsets = offsets if offsets is not None else answer_offsets(tokens)
        request = self.request(prompt, self.auth)
        reader, clock = self.reader, time.perf_counter
        chars, pending = 0, b""
        start = record.started_at = clock()
        try:
            async with asyncio.timeout(timeout):
                self.writer.write(request)
                await read_stream_head(reader)
                times = record.token_times
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                    if size == 0:
                        await reader.readuntil(b"\r\n")
                        break
                    data = await reader.readexactly(size + 2)
                    now = clock() - start
                    # An event may span HTTP chunks: parse complete events only.
                    events, _, pending = (pending + data[:-2]).rpartition(b"\n\n")
                    added = sum(_content_chars(line) for line in events.split(b"\n"))
                    if added:
                        chars += added
                        reached = bisect.bisect_right(offsets, chars)
                        times.extend([now] * (reached - len(times)))
                        record.frames += 1
                record.done = clock() - start
                if chars != (offsets[-1] if offsets else 0):
                    record.error = f"answer has {chars} chars, expected {offsets[-1]}"
        except Exception as exc:  # a benchmark records failures instead of stopping
            record.error = f"{type(exc).__name__}: {exc}"[:200]
            await self.close()
            self.reader = self.writer = None
        return record


async def read_stream_head(reader: asyncio.StreamReader) -> None:
    """Read a streamed response's status line and headers; anything but a chunked 200 fails."""
    headers = await reader.readuntil(b"\r\n\r\n")
    if not headers.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(headers.split(b"\r\n", 1)[0].decode())
    if b"chunked" not in headers.lower():
        raise RuntimeError("expected a chunked streaming response")


def _content_chars(line: bytes) -> int:
    """Characters of answer text in one SSE line (`data: {...}`); 0 for anything else."""
    if not line.startswith(b"data: {"):
        return 0  # blank lines, comments, `data: [DONE]`
    choices = json.loads(line[6:]).get("choices") or ()
    return sum(len((c.get("delta") or {}).get("content") or "") for c in choices)


class SocketClient:
    """One chat socket (one tab): asks, then times the chunk frames until `done`."""

    def __init__(self, base: str, cookies: dict[str, str], path: str = "/ws/chat/") -> None:
        self.url = base.replace("http://", "ws://", 1) + path
        self.headers = {
            "Origin": base,
            "User-Agent": DESKTOP_UA,
            "Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items()),
        }
        self.ws: ClientConnection | None = None
        self.ready: dict[str, Any] = {}
        # After a failed turn its late frames would be counted in the next one: reconnect.
        self.broken = False

    async def open(self, timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            # No compression: browsers would offer it, but daphne does not take it anyway.
            self.ws = await connect(
                self.url,
                additional_headers=self.headers,
                compression=None,
                max_size=None,
                open_timeout=timeout,
                ping_interval=None,
            )
            while True:
                frame = await self.ws.recv()
                if isinstance(frame, str) and frame.startswith("{"):
                    payload = json.loads(frame)
                    if payload.get("type") == "ready":
                        self.ready = payload
                        return

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
            self.ws = None

    async def turn(
        self, prompt: str, tokens: int, timeout: float, offsets: list[int] | None = None
    ) -> TurnRecord:
        """One turn; `offsets` (answer_offsets) maps the chunk texts back to token arrivals."""
        record = TurnRecord(tokens)
        if self.broken:
            self.broken = False
            await self.close()
            try:
                await self.open()
            except Exception as exc:
                record.error = f"reconnect failed: {type(exc).__name__}: {exc}"[:200]
                self.broken = True
                return record
        ws = self.ws
        if ws is None:
            record.error = "socket not open"
            return record
        offsets = offsets if offsets is not None else answer_offsets(tokens)
        clock = time.perf_counter
        chars = 0
        start = record.started_at = clock()
        try:
            async with asyncio.timeout(timeout):
                await ws.send(json.dumps({"type": "prompt", "conversation": "", "text": prompt}))
                times = record.token_times
                while True:
                    frame = await ws.recv()
                    if not isinstance(frame, str) or not frame.startswith("{"):
                        continue  # the htmx HTML frames: bubbles and the final answer
                    now = clock() - start
                    payload = json.loads(frame)
                    kind = payload.get("type")
                    if kind == "chunk":
                        record.frames += 1
                        chars += len(payload["text"])
                        reached = bisect.bisect_right(offsets, chars)
                        times.extend([now] * (reached - len(times)))
                    elif kind == "done":
                        record.done = now
                        if payload.get("status") != "complete":
                            record.error = f"done with status {payload.get('status')}"
                        elif chars != (offsets[-1] if offsets else 0):
                            record.error = f"answer has {chars} chars, expected {offsets[-1]}"
                        return record
                    elif kind == "error":
                        record.error = f"error frame: {payload.get('code')}"
                        self.broken = True
                        return record
        except Exception as exc:
            record.error = f"{type(exc).__name__}: {exc}"[:200]
            self.broken = True
        return record


async def open_all(clients: list[Any], concurrency: int = 50) -> list[str]:
    """Open every client, at most `concurrency` handshakes at a time; returns the failures."""
    gate = asyncio.Semaphore(concurrency)
    failures: list[str] = []

    async def one(client: Any) -> None:
        async with gate:
            try:
                await client.open()
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}"[:200])

    await asyncio.gather(*(one(c) for c in clients))
    return failures


async def close_all(clients: list[Any]) -> None:
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

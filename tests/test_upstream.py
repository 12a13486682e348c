"""The upstream client against real servers: the demo model, and tiny servers that misbehave."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import socket
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from chat.demo_upstream import default_reply, long_tokens
from chat.turns.history import trim_history
from chat.turns.model_client import build_client, get_client, model_clients
from chat.upstream.aiohttp_transport import AiohttpTransport
from chat.upstream.client import MAX_CONNECTIONS_PER_SHARD, UpstreamClient, shard_count
from chat.upstream.errors import (
    BUSY_MESSAGE,
    EMPTY_ANSWER_MESSAGE,
    SERVER_TROUBLE_MESSAGE,
    UNREACHABLE_MESSAGE,
    UpstreamError,
    http_status_message,
)
from chat.upstream.items import Delta, Finish, StreamItem, Usage
from tests.demo_server import demo_stats, running_demo_server

_backend = ["aiohttp"]


@pytest.fixture(autouse=True, params=["aiohttp", "httpx"])
def http_backend(request: pytest.FixtureRequest, settings: Any) -> str:
    """Every test here runs on both readers of the model's stream (LLM_HTTP_BACKEND)."""
    settings.LLM_HTTP_BACKEND = request.param
    _backend[0] = str(request.param)
    return str(request.param)


def upstream_client(*args: Any, **kwargs: Any) -> UpstreamClient:
    """An UpstreamClient on the backend this run of the test is about (the fixture's)."""
    kwargs.setdefault("backend", _backend[0])
    return UpstreamClient(*args, **kwargs)


@pytest.fixture(scope="module")
def demo_url() -> Iterator[str]:
    with running_demo_server(ttfb_ms=0, tps=0) as url:
        yield url


@pytest.fixture
def paced_demo_url() -> Iterator[str]:
    """A fresh demo server at 100 tokens/s that reports its counters (tests.demo_server)."""
    with running_demo_server(ttfb_ms=0, tps=100, stats=True) as url:
        yield url


@pytest.fixture
async def client(demo_url: str) -> AsyncIterator[UpstreamClient]:
    client = upstream_client(demo_url, connect_timeout=2, read_timeout=10, total_timeout=30)
    yield client
    await client.aclose()


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def collect(
    client: UpstreamClient, text: str, **kwargs: Any
) -> tuple[list[StreamItem], UpstreamError | None]:
    items: list[StreamItem] = []
    try:
        async for item in client.stream_chat(model="demo-full", messages=user(text), **kwargs):
            items.append(item)
    except UpstreamError as exc:
        return items, exc
    return items, None


def joined(items: list[StreamItem]) -> str:
    return "".join(item.text for item in items if isinstance(item, Delta))


# --- against the demo model -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, answer",
    [
        ("/echo Grüße 世界 🎉\n\n```py\nx = 1\n```\n", "Grüße 世界 🎉\n\n```py\nx = 1\n```\n"),
        ("/long 500", "".join(long_tokens(500))),
        ("What is SSE?", default_reply("What is SSE?")),
    ],
)
async def test_deltas_join_to_the_exact_answer(
    client: UpstreamClient, text: str, answer: str
) -> None:
    items, error = await collect(client, text)
    assert error is None
    assert joined(items) == answer
    assert all(item.text for item in items if isinstance(item, Delta))  # no empty deltas


async def test_a_stream_ends_with_one_finish_then_one_usage_from_the_server(
    client: UpstreamClient,
) -> None:
    items, _ = await collect(client, "/echo one two three")
    assert items[-2:] == [
        Finish("stop"),
        Usage(prompt_tokens=4, completion_tokens=3, estimated=False),
    ]
    assert sum(isinstance(item, Usage) for item in items) == 1
    assert sum(isinstance(item, Finish) for item in items) == 1


async def test_max_tokens_is_sent_and_the_finish_says_length(client: UpstreamClient) -> None:
    items, _ = await collect(client, "/long 50", max_tokens=5)
    assert joined(items) == "".join(long_tokens(5))
    assert Finish("length") in items


async def test_a_500_becomes_a_readable_http_status_error(client: UpstreamClient) -> None:
    items, error = await collect(client, "/fail 500")
    assert items == [] and error is not None
    assert (error.kind, error.status) == ("http_status", 500)
    assert error.message == SERVER_TROUBLE_MESSAGE
    # The server's own words go to the log (the detail), never to the user.
    assert error.detail.startswith("The model server answered 500: ")
    assert "/fail 500" in error.detail and "/fail 500" not in error.message


async def test_a_429_carries_its_retry_after(client: UpstreamClient) -> None:
    _, error = await collect(client, "/fail 429")
    assert error is not None and (error.kind, error.status) == ("http_status", 429)
    assert error.retry_after == 1.0
    assert error.message == BUSY_MESSAGE
    assert "Too Many Requests" in error.detail


async def test_a_stall_past_the_read_timeout_is_a_timeout(demo_url: str) -> None:
    client = upstream_client(demo_url, read_timeout=0.2)
    _, error = await collect(client, "/stall 30 /echo too late")
    await client.aclose()
    assert error is not None and error.kind == "timeout"
    assert error.message == "The model took longer than 0.2 s to answer"


async def test_the_total_timeout_ends_a_slow_answer(paced_demo_url: str) -> None:
    # Tokens keep coming (no read timeout), but the whole answer would take 100 s.
    client = upstream_client(paced_demo_url, read_timeout=10, total_timeout=0.3)
    items, error = await collect(client, "/long 10000")
    await client.aclose()
    assert error is not None and error.kind == "timeout"
    assert error.message == "The model took longer than 0.3 s to answer"
    assert not any(isinstance(item, Usage) for item in items)


async def test_the_total_timeout_ends_an_answer_whose_reads_each_end_in_time(
    paced_demo_url: str,
) -> None:
    """Every read ends within the read timeout, and the deadline (one timer for the stream,
    not one per read) still ends the answer, with the tokens before it kept."""
    client = upstream_client(paced_demo_url, read_timeout=0.3, total_timeout=1.0)
    items, error = await collect(client, "/long 10000")
    await client.aclose()
    assert error is not None and error.kind == "timeout"
    assert error.message == "The model took longer than 1 s to answer"
    deltas = [item for item in items if isinstance(item, Delta)]
    assert 0 < len(deltas) < 10000  # tokens came before the deadline, not all of them
    assert not any(isinstance(item, Usage) for item in items)


async def read_request(reader: asyncio.StreamReader) -> None:
    """Read one HTTP request (its head, and its body by Content-Length) off a test server."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(v)
            for n, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
            if n.strip().lower() == b"content-length"
        ),
        0,
    )
    await reader.readexactly(length)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


@contextlib.asynccontextmanager
async def dripping_server(gzip: bool) -> AsyncIterator[str]:
    """A model server that sends three words, then bytes that never make text, forever: with
    `gzip` (unasked) a gzip header whose comment never ends; without, a chunk-size line
    whose extension never ends. Each byte restarts the transport's read timeout."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        encoding = b"content-encoding: gzip\r\n" if gzip else b""
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            + encoding
            + b"transfer-encoding: chunked\r\n\r\n"
        )
        words = sse(delta("one "), delta("two "), delta("three "), done=False).encode()
        if gzip:
            import zlib

            packer = zlib.compressobj(6, zlib.DEFLATED, 31)
            writer.write(_chunk(packer.compress(words) + packer.flush(zlib.Z_SYNC_FLUSH)))
        else:
            writer.write(_chunk(words))
        await writer.drain()
        await asyncio.sleep(0.1)
        if gzip:  # a second gzip member, its comment dripped (FCOMMENT set, never ended)
            writer.write(_chunk(packer.flush() + b"\x1f\x8b\x08\x10\x00\x00\x00\x00\x00\xff"))
        else:
            writer.write(b"10;x=")
        with contextlib.suppress(ConnectionError):
            while True:
                await writer.drain()
                writer.write(_chunk(b"a") if gzip else b"a")
                await asyncio.sleep(0.1)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        server.close()


@pytest.mark.parametrize("gzip", [False, True], ids=["chunk-extension", "gzip-comment"])
async def test_bytes_that_never_make_text_still_end_at_the_total_timeout(gzip: bool) -> None:
    """The hostile review's model server: each byte restarts the read timeout, none makes
    text. The total deadline still ends the answer, and the words before it are kept."""
    async with dripping_server(gzip) as url:
        client = upstream_client(url, read_timeout=0.5, total_timeout=1.5)
        items, error = await asyncio.wait_for(collect(client, "hi"), 30)
        await client.aclose()
    assert error is not None and error.kind == "timeout", error
    assert error.message == "The model took longer than 1.5 s to answer"
    assert joined(items) == "one two three "


@pytest.mark.parametrize("after", ["silence", "pings"])
async def test_an_answer_whose_server_keeps_the_stream_open_after_done_is_complete(
    after: str,
) -> None:
    """The whole answer, its finish, usage and [DONE] came; the server then keeps the
    connection open (silent, or with `: ping` lines). The answer is complete at once (its
    connection closed), not failed by a read or total timeout (hostile review)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        writer.write(_chunk(sse(delta("all "), delta("here", finish="stop"), usage).encode()))
        with contextlib.suppress(ConnectionError):
            while True:
                await writer.drain()
                if after == "pings":
                    writer.write(_chunk(b": ping\n\n"))
                await asyncio.sleep(0.1)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    try:
        client = upstream_client(url, read_timeout=3, total_timeout=6)
        items, error = await asyncio.wait_for(collect(client, "hi"), 30)
        await client.aclose()
    finally:
        server.close()
    assert error is None, error
    assert joined(items) == "all here"
    assert Finish("stop") in items and items[-1] == Usage(3, 2, estimated=False)


async def test_a_stop_during_a_read_is_a_cancel_not_a_timeout(paced_demo_url: str) -> None:
    """The deadline's timer cancels only the read it finds waiting once it has fired; a cancel
    from elsewhere (a Stop) stays a cancel."""
    client = upstream_client(paced_demo_url, read_timeout=10, total_timeout=30)
    task = asyncio.create_task(collect(client, "/long 10000"))
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.aclose()


async def test_a_cut_is_a_protocol_error_after_the_partial_deltas(client: UpstreamClient) -> None:
    items, error = await collect(client, "/cut 6")
    assert joined(items) == "".join(long_tokens(6))
    assert error is not None and error.kind == "protocol"
    assert error.message == "The model's connection dropped before the answer finished"


async def test_connection_refused_is_a_connect_error() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = upstream_client(f"http://127.0.0.1:{port}/v1")
    _, error = await collect(client, "hi")
    await client.aclose()
    assert error is not None and error.kind == "connect"
    assert error.message == UNREACHABLE_MESSAGE
    assert error.detail.startswith(f"could not connect to http://127.0.0.1:{port}/v1")


async def test_cancelling_the_consumer_closes_the_upstream_response(paced_demo_url: str) -> None:
    client = upstream_client(paced_demo_url)
    three_deltas = asyncio.Event()

    async def consume() -> None:
        count = 0
        async for item in client.stream_chat(model="demo-full", messages=user("/long 100000")):
            count += isinstance(item, Delta)
            if count == 3:
                three_deltas.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(three_deltas.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The server saw the connection close and stopped generating. Wait for that (bounded),
    # as it happens in another process.
    stats = await _wait_for_stats(paced_demo_url, lambda s: s["active"] == 0)
    assert (stats["started"], stats["cancelled"], stats["completed"]) == (1, 1, 0)
    assert stats["tokens_sent"] < 100000
    assert client.connections_in_use() == 0
    # And the pool is healthy: the next turn works.
    items, error = await collect(client, "/echo still fine")
    assert error is None and joined(items) == "still fine"
    await client.aclose()


async def test_a_full_pool_is_a_clear_timeout_and_frees_up_after(paced_demo_url: str) -> None:
    client = upstream_client(paced_demo_url, pool_size=1, connect_timeout=0.3)
    holder = client.stream_chat(model="demo-full", messages=user("/long 1000"))
    await anext(holder)  # the one connection is busy
    _, error = await collect(client, "/echo second")
    assert error is not None and error.kind == "timeout"
    assert error.message.startswith("Too many answers in progress")
    await holder.aclose()
    items, error = await collect(client, "/echo third")  # the connection came free
    assert error is None and joined(items) == "third"
    await client.aclose()


def test_the_backend_setting_picks_who_reads_the_stream(http_backend: str, settings: Any) -> None:
    settings.LLM_BASE_URL = "http://127.0.0.1:9/v1"
    settings.LLM_POOL_SIZE = 100
    client = build_client()  # what the app builds from the settings
    assert client.backend == http_backend
    on_aiohttp = isinstance(client.http_client._transport, AiohttpTransport)  # type: ignore[attr-defined]
    assert on_aiohttp == (http_backend == "aiohttp")
    assert client.shards == (1 if on_aiohttp else 4)
    with pytest.raises(ValueError, match=r"HTTP/1\.1 only"):
        upstream_client("http://127.0.0.1:9/v1", http2=True, backend="aiohttp")


async def test_fifty_sequential_turns_reuse_one_connection(paced_demo_url: str) -> None:
    client = upstream_client(paced_demo_url)
    for turn in range(50):
        items, error = await collect(client, f"/echo turn {turn}")
        assert error is None and joined(items) == f"turn {turn}"
    await client.aclose()
    ports = {
        port
        for path, port in demo_stats(paced_demo_url)["requests"]
        if path.endswith("/completions")
    }
    assert len(ports) == 1


async def test_warm_opens_the_connection_the_first_turn_then_uses(paced_demo_url: str) -> None:
    client = upstream_client(paced_demo_url, pool_size=20)  # one shard
    assert client.shards == 1
    await client.warm()
    await collect(client, "/echo warm")
    await client.aclose()
    requests = demo_stats(paced_demo_url)["requests"]
    assert [path for path, _ in requests] == ["/v1/models", "/v1/models", "/v1/chat/completions"]
    # (The first /v1/models is the fixture's readiness probe, from another client.)
    assert requests[1][1] == requests[2][1]


async def test_warm_opens_a_connection_per_shard_and_turns_use_them(paced_demo_url: str) -> None:
    client = upstream_client(
        paced_demo_url, pool_size=3 * MAX_CONNECTIONS_PER_SHARD, backend="httpx"
    )
    assert client.shards == 3
    await client.warm()
    await asyncio.gather(*(collect(client, f"/echo {i}") for i in range(3)))
    await client.aclose()
    requests = demo_stats(paced_demo_url)["requests"][1:]  # after the readiness probe
    warmed = {port for path, port in requests if path == "/v1/models"}
    answered = [port for path, port in requests if path == "/v1/chat/completions"]
    assert len(warmed) == 3, "one connection per shard"
    assert len(answered) == 3 and set(answered) == warmed, "three streams, one on each shard"


@pytest.mark.parametrize(("pool", "shards"), [(1, 1), (32, 1), (33, 2), (100, 4), (500, 16)])
def test_the_pool_is_split_into_shards_of_at_most_32(pool: int, shards: int) -> None:
    assert shard_count(pool) == shards
    client = upstream_client("http://127.0.0.1:9/v1", pool_size=pool, backend="httpx")
    assert len(client.http_clients) == shards
    limits = [c._transport._pool._max_connections for c in client.http_clients]  # type: ignore[attr-defined]
    assert max(limits) <= MAX_CONNECTIONS_PER_SHARD and sum(limits) >= pool


async def test_streams_go_to_the_least_busy_shard_and_free_it_after(paced_demo_url: str) -> None:
    client = upstream_client(
        paced_demo_url, pool_size=2 * MAX_CONNECTIONS_PER_SHARD, backend="httpx"
    )
    streams = [
        client.stream_chat(model="demo-full", messages=[{"role": "user", "content": "/long 50"}])
        for _ in range(3)
    ]
    for stream in streams:
        await anext(stream)  # each has sent its request and holds a shard
    assert sorted(client._busy) == [1, 2]
    for stream in streams:
        await stream.aclose()
    assert client._busy == [0, 0]
    await client.aclose()


async def test_warm_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = upstream_client(f"http://127.0.0.1:{port}/v1")
    await client.warm()
    await client.aclose()
    assert "could not warm" in caplog.text


async def _wait_for_stats(base_url: str, condition: Any) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            stats = await asyncio.to_thread(demo_stats, base_url)
            if condition(stats):
                return stats
            await asyncio.sleep(0.02)


# --- against servers that answer exactly what a test wants ----------------------------------
# A real TCP server on 127.0.0.1 speaking raw HTTP/1.1: it lets a test send byte-exact bodies
# other model servers send (llama.cpp's, FastAPI's, a proxy's) without any mock of httpx.


class CannedServer:
    """Answers every request with the same raw HTTP response bytes and records the requests."""

    def __init__(
        self, response: bytes, *, close: bool = True, tls: ssl.SSLContext | None = None
    ) -> None:
        self.tls = tls
        self.response = response
        self.close = close
        self.requests: list[tuple[bytes, bytes]] = []
        self.connections = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        if self.tls is not None:
            return f"https://localhost:{port}/v1"
        return f"http://127.0.0.1:{port}/v1"

    async def __aenter__(self) -> CannedServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    break
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                self.requests.append((head, await reader.readexactly(length)))
                writer.write(self.response)
                await writer.drain()
                if self.close:
                    break
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def request_json(self, index: int = -1) -> Any:
        return json.loads(self.requests[index][1])

    def request_head(self, index: int = -1) -> str:
        return self.requests[index][0].decode().lower()


def http_response(status: int, body: bytes | str, content_type: str = "application/json") -> bytes:
    data = body.encode() if isinstance(body, str) else body
    head = (
        f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(data)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + data


def sse(*chunks: Any, done: bool = True, newline: str = "\n") -> str:
    lines = [f"data: {json.dumps(c)}{newline}{newline}" for c in chunks]
    if done:
        lines.append(f"data: [DONE]{newline}{newline}")
    return "".join(lines)


def delta(
    content: str | None = None, finish: str | None = None, role: str | None = None
) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if role:
        d["role"] = role
    if content is not None:
        d["content"] = content
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


async def canned(
    response: bytes, text: str = "hi", **client_kwargs: Any
) -> tuple[list[StreamItem], UpstreamError | None, CannedServer]:
    async with CannedServer(response) as server:
        client = upstream_client(server.url, **client_kwargs)
        items, error = await collect(client, text)
        await client.aclose()
    return items, error, server


@pytest.fixture(scope="module")
def tls_certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for localhost (openssl, as on any Debian machine)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_an_https_model_server_is_verified_then_streams(
    tls_certificate: tuple[Path, Path],
) -> None:
    cert, key = tls_certificate
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    body = sse(delta("Hello", role="assistant"), delta(" over TLS", finish="stop"))
    async with CannedServer(http_response(200, body, "text/event-stream"), tls=tls) as server:
        trusting = upstream_client(server.url, verify=ssl.create_default_context(cafile=cert))
        items, error = await collect(trusting, "hi")
        await trusting.aclose()
        assert error is None and joined(items) == "Hello over TLS"
        # The default trust store does not know a self-signed certificate: refused, clearly.
        default = upstream_client(server.url)
        _, error = await collect(default, "hi")
        await default.aclose()
    assert error is not None and error.kind == "connect"
    assert error.message == UNREACHABLE_MESSAGE
    assert "certificate" in error.detail.lower()


@pytest.mark.parametrize(
    "status, body, content_type, message",
    [
        (
            503,
            '{"detail": "Model is loading"}',
            "application/json",
            "The model server answered 503: Model is loading",
        ),
        (
            422,
            '{"detail": [{"loc": ["body", "messages"], "msg": "field required", '
            '"type": "missing"}]}',
            "application/json",
            "The model server answered 422: field required",
        ),
        (502, "Bad Gateway\n", "text/plain", "The model server answered 502: Bad Gateway"),
        (
            502,
            "<html><head><title>502 Bad Gateway</title></head>"
            "<body><h1>502 Bad Gateway</h1></body></html>",
            "text/html",
            "The model server answered 502: 502 Bad Gateway 502 Bad Gateway",
        ),
        (
            400,
            '{"error": "context length exceeded"}',
            "application/json",
            "The model server answered 400: context length exceeded",
        ),
        (500, "", "text/plain", "The model server answered 500: X"),
    ],
)
async def test_non_openai_error_bodies_become_readable_details(
    status: int, body: str, content_type: str, message: str
) -> None:
    _, error, _ = await canned(http_response(status, body, content_type))
    assert error is not None
    # Readable for the log; the user reads plain words for the status.
    assert (error.kind, error.status, error.detail) == ("http_status", status, message)
    assert error.message == http_status_message(status)


async def test_a_huge_error_body_is_cut_short() -> None:
    _, error, _ = await canned(http_response(500, "x" * 1_000_000, "text/plain"))
    assert error is not None and len(error.detail) < 400


async def test_a_200_with_an_empty_body_is_an_empty_answer() -> None:
    # llama.cpp's server does this when the prompt is over its context window.
    _, error, _ = await canned(http_response(200, "", "text/event-stream"))
    assert error is not None
    assert (error.kind, error.message) == ("empty", EMPTY_ANSWER_MESSAGE)


async def test_a_stream_with_no_deltas_and_no_done_is_an_empty_answer() -> None:
    body = ": ping\n\n" + sse(delta(role="assistant", content=""), done=False)
    _, error, _ = await canned(http_response(200, body, "text/event-stream"))
    assert error is not None and error.kind == "empty"


async def test_a_stream_that_ends_without_done_after_deltas_is_a_protocol_error() -> None:
    body = sse(delta(role="assistant"), delta("Hel"), delta("lo"), done=False)
    items, error, _ = await canned(http_response(200, body, "text/event-stream"))
    assert joined(items) == "Hello"
    assert error is not None and error.kind == "protocol"


async def test_a_finished_stream_without_done_is_still_a_whole_answer() -> None:
    body = sse(delta("Hello"), delta(finish="stop"), done=False)
    items, error, _ = await canned(http_response(200, body, "text/event-stream"))
    assert error is None
    assert items[:2] == [Delta("Hello"), Finish("stop")]


async def test_keep_alives_crlf_and_no_usage_give_an_estimated_usage() -> None:
    # llama.cpp-style: role-only first delta, empty last delta with finish_reason, no usage.
    chunks = [
        delta(role="assistant", content=""),
        delta("Bonjour "),
        delta("à tous"),
        delta("", finish="stop"),
    ]
    body = ": keep-alive\r\n\r\n" + sse(*chunks, newline="\r\n")
    prompt = "a question of 29 characters!!"
    items, error, _ = await canned(http_response(200, body, "text/event-stream"), prompt)
    assert error is None
    assert items == [
        Delta("Bonjour "),
        Delta("à tous"),
        Finish("stop"),
        Usage(prompt_tokens=math.ceil(29 / 4), completion_tokens=math.ceil(14 / 4), estimated=True),
    ]


async def test_an_error_object_inside_the_stream_is_a_stream_error_after_its_deltas() -> None:
    body = sse(
        delta("partial"),
        {"error": {"message": "CUDA out of memory", "type": "server_error"}},
        done=False,
    )
    items, error, _ = await canned(http_response(200, body, "text/event-stream"))
    assert items == [Delta("partial")]
    assert error is not None and error.kind == "stream_error"
    assert "CUDA out of memory" in error.detail and "CUDA" not in error.message


async def test_an_error_event_inside_the_stream_is_a_stream_error() -> None:
    body = 'event: error\ndata: {"message": "overloaded"}\n\n'
    _, error, _ = await canned(http_response(200, body, "text/event-stream"))
    assert error is not None and error.kind == "stream_error" and "overloaded" in error.detail


async def test_a_chunk_that_is_not_json_is_a_protocol_error() -> None:
    _, error, _ = await canned(http_response(200, "data: {oops\n\n", "text/event-stream"))
    assert error is not None and error.kind == "protocol"


async def test_a_server_that_ignores_stream_true_still_gives_the_answer() -> None:
    completion = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "whole"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    items, error, _ = await canned(http_response(200, json.dumps(completion)))
    assert error is None
    assert items == [Delta("whole"), Finish("stop"), Usage(3, 1, estimated=False)]


async def test_a_server_that_closes_without_answering_is_a_protocol_error() -> None:
    _, error, _ = await canned(b"")
    assert error is not None and error.kind == "protocol"
    assert error.message == "The model server closed the connection without answering"


async def test_the_request_asks_for_a_stream_with_usage_and_sends_the_key() -> None:
    async with CannedServer(
        http_response(200, sse(delta("ok", finish="stop")), "text/event-stream")
    ) as server:
        keyed = upstream_client(server.url, "sk-test")
        await collect(keyed, "q", max_tokens=9, temperature=0.5)
        await keyed.aclose()
        anonymous = upstream_client(server.url)
        await collect(anonymous, "q")
        await anonymous.aclose()
    assert server.request_head(0).startswith("post /v1/chat/completions http/1.1")
    assert "authorization: bearer sk-test" in server.request_head(0)
    assert "accept-encoding: identity\r\n" in server.request_head(0)
    assert "authorization" not in server.request_head(1)
    assert server.request_json(0) == {
        "model": "demo-full",
        "messages": [{"role": "user", "content": "q"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 9,
        "temperature": 0.5,
    }
    assert "max_tokens" not in server.request_json(1) and "temperature" not in server.request_json(
        1
    )


async def test_a_server_that_accepts_but_never_answers_is_a_timeout() -> None:
    async with CannedServer(b"", close=False) as server:
        # Hold the connection open without answering: a hung model server.
        server.response = b""
        client = upstream_client(server.url, read_timeout=0.2)
        _, error = await collect(client, "hi")
        await client.aclose()
    assert error is not None and error.kind == "timeout"


# --- history trimming -----------------------------------------------------------------------


def msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def test_trim_keeps_the_system_message_and_the_newest_messages_that_fit() -> None:
    history = [
        msg("system", "S" * 10),
        msg("user", "a" * 30),
        msg("assistant", "b" * 30),
        msg("user", "c" * 30),
        msg("assistant", "d" * 30),
        msg("user", "e" * 30),
    ]
    assert trim_history(history, 1000) == history
    assert trim_history(history, 10 + 30 * 3) == [history[0], *history[3:]]
    # 99 chars leave room for two whole messages, but a history must start with the user.
    assert trim_history(history, 10 + 30 * 3 - 1) == [history[0], history[5]]


def test_trim_cuts_a_lone_last_user_message_from_the_front() -> None:
    history = [msg("user", "old"), msg("assistant", "reply"), msg("user", "0123456789")]
    assert trim_history(history, 4) == [msg("user", "6789")]
    assert history[2]["content"] == "0123456789"  # the caller's list is left alone


def test_trim_always_leaves_the_last_user_message_half_the_budget() -> None:
    history = [msg("system", "S" * 100), msg("user", "x" * 100)]
    assert trim_history(history, 40) == [history[0], msg("user", "x" * 20)]


def test_trim_without_a_system_message_or_users() -> None:
    assert trim_history([], 10) == []
    assert trim_history([msg("assistant", "hello")], 10) == [msg("assistant", "hello")]


# --- the process-wide client ----------------------------------------------------------------


async def test_get_client_is_one_client_per_loop_built_from_settings(settings: Any) -> None:
    settings.LLM_BASE_URL = "http://127.0.0.1:9/v1"
    settings.LLM_API_KEY = "sk-x"
    first = get_client()
    assert get_client() is first
    assert first.base_url == "http://127.0.0.1:9/v1"
    assert first.http_client.headers["authorization"] == "Bearer sk-x"

    other: list[UpstreamClient] = []

    def in_another_loop() -> None:
        async def build() -> None:
            other.append(get_client())
            await model_clients.close()

        asyncio.run(build())

    thread = threading.Thread(target=in_another_loop)
    thread.start()
    thread.join()
    assert other and other[0] is not first

    settings.LLM_BASE_URL = "http://127.0.0.1:10/v1"  # tests override settings: follow them
    changed = get_client()
    assert changed is not first and changed.base_url == "http://127.0.0.1:10/v1"
    await model_clients.close()
    assert changed.http_client.is_closed
    assert get_client() is not changed
    await model_clients.close()
    assert model_clients.peek() is None


def test_the_backend_settings_are_checked_at_start() -> None:
    from tests.test_security_socket_auth import PRODUCTION, run_settings

    loaded = run_settings(**PRODUCTION, LLM_HTTP2="1")  # HTTP/2 picks the httpx backend
    assert loaded.returncode == 0, loaded.stderr
    clash = run_settings(**PRODUCTION, LLM_HTTP2="1", LLM_HTTP_BACKEND="aiohttp")
    assert clash.returncode != 0 and "LLM_HTTP_BACKEND=httpx" in clash.stderr
    unknown = run_settings(**PRODUCTION, LLM_HTTP_BACKEND="curl")
    assert unknown.returncode != 0 and "LLM_HTTP_BACKEND" in unknown.stderr

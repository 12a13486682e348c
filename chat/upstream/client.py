"""The upstream client: pooled `httpx.AsyncClient`s speaking OpenAI's streaming chat API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx

from chat import metrics
from chat.upstream.aiohttp_transport import AiohttpTransport
from chat.upstream.errors import (
    DROPPED_MESSAGE,
    EMPTY_ANSWER_MESSAGE,
    UNREACHABLE_MESSAGE,
    UNREADABLE_MESSAGE,
    UpstreamError,
    failure,
    status_error,
)
from chat.upstream.items import (
    Delta,
    Finish,
    Progress,
    StreamItem,
    StreamTiming,
    items_from_completion,
    items_from_events,
)
from chat.upstream.sse import SSEParser

logger = logging.getLogger("chat.upstream")

__all__ = ["UpstreamClient", "UpstreamError", "shard_count"]

# httpcore's pool walks all its connections, and for each idle one all of them again, on every
# request start and response close (httpcore 1.0.9 `_assign_requests_to_connections`): its cost
# grows with the square of the connections. Shards of at most this many keep it small
# (docs/decisions/performance.md).
MAX_CONNECTIONS_PER_SHARD = 32


def _aiohttp_transport(
    limits: httpx.Limits, verify: ssl.SSLContext | bool
) -> httpx.AsyncBaseTransport:
    # The same certificate check as httpx's own stack (certifi's CAs unless told otherwise).
    context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify)
    return AiohttpTransport(limits=limits, ssl_context=context)


def shard_count(pool_size: int) -> int:
    """How many httpx clients share `pool_size` connections, none over the shard size."""
    return max(1, math.ceil(pool_size / MAX_CONNECTIONS_PER_SHARD))


# How long a finished answer's stream may take to end after [DONE] before its connection is
# closed instead of returned to the pool.
REST_SECONDS = 0.5


class _Deadline:
    """A stream's total deadline over its body's reads, with one timer for the whole stream.

    `asyncio.timeout_at` around each read scheduled and cancelled a timer per chunk (5.7 % of
    a turn's CPU, docs/decisions/performance.md). This timer, when it fires during a read,
    cancels that read as `asyncio.timeout` would and the read raises TimeoutError; fired
    between two reads, the next read raises at once. It never cancels the caller's code
    between reads: a scope must not span the generator's `yield`. (Bounding a read by the
    transport's read timeout instead was not enough: a server that keeps sending bytes that
    make no text, such as a chunk extension a byte at a time, held one read forever; the
    hostile review, 2026-12-04.)
    """

    __slots__ = ("_cancelling", "_fired", "_handle", "_reading", "_task")

    def __init__(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        task = asyncio.current_task()
        assert task is not None, "a stream is read in a task"
        self._task = task
        self._cancelling = task.cancelling()
        self._reading = False
        self._fired = False
        self._handle = loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._fired = True
        if self._reading:
            self._task.cancel()

    async def read(self, chunks: AsyncIterator[bytes]) -> bytes | None:
        """The next chunk, or None at the end; TimeoutError once the deadline has passed."""
        if self._fired:
            raise TimeoutError
        self._reading = True
        try:
            return await anext(chunks, None)
        except asyncio.CancelledError:
            if self._fired and self._task.uncancel() <= self._cancelling:
                raise TimeoutError from None
            raise
        finally:
            self._reading = False

    def cancel(self) -> None:
        self._handle.cancel()


class UpstreamClient:
    """An OpenAI-compatible chat API behind long-lived, pooled `httpx.AsyncClient`s.

    The pool (`pool_size` connections) is split into shards of at most
    `MAX_CONNECTIONS_PER_SHARD`, each its own client; a stream goes to the least busy one.

    Keeping one client for the life of the process keeps connections warm: no DNS lookup,
    TCP or TLS handshake on the path of a turn once `warm()` (or the first turn) opened one.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str = "",
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        total_timeout: float = 600.0,
        pool_size: int = 100,
        http2: bool = False,
        keepalive_expiry: float = 30.0,
        trust_env: bool = False,
        backend: str = "aiohttp",
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.total_timeout = total_timeout
        headers = {"user-agent": "chatsite"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        if backend not in ("httpx", "aiohttp"):
            raise ValueError(f"unknown HTTP backend {backend!r}")
        if backend == "aiohttp" and http2:
            raise ValueError("the aiohttp backend speaks HTTP/1.1 only")
        self.backend = backend
        # aiohttp's pool has no quadratic bookkeeping: one client holds it all.
        self.shards = shard_count(pool_size) if backend == "httpx" else 1
        per_shard = math.ceil(pool_size / self.shards)
        limits = httpx.Limits(
            max_connections=per_shard,
            max_keepalive_connections=per_shard,
            keepalive_expiry=keepalive_expiry,
        )
        self._clients = [
            httpx.AsyncClient(
                # The trailing slash makes relative paths ("chat/completions") land under /v1/.
                base_url=self.base_url + "/",
                headers=headers,
                timeout=httpx.Timeout(
                    connect=connect_timeout,
                    read=read_timeout,
                    write=read_timeout,
                    pool=connect_timeout,
                ),
                limits=limits,
                http2=http2,
                verify=verify,
                transport=_aiohttp_transport(limits, verify) if backend == "aiohttp" else None,
                # The upstream URL is configured explicitly; proxy variables meant for package
                # downloads must not silently add a hop to every token.
                trust_env=trust_env,
            )
            for _ in range(self.shards)
        ]
        self._busy = [0] * self.shards  # streams open on each shard

    @property
    def http_client(self) -> httpx.AsyncClient:
        """The first pooled httpx client (for event hooks and diagnostics; do not close it)."""
        return self._clients[0]

    @property
    def http_clients(self) -> tuple[httpx.AsyncClient, ...]:
        """Every shard's pooled httpx client (diagnostics; do not close them)."""
        return tuple(self._clients)

    def connections_in_use(self) -> int:
        """Upstream connections busy with a response that is not closed yet (diagnostics)."""
        busy = 0
        for client in self._clients:
            transport = client._transport  # httpx keeps no public handle on it
            if isinstance(transport, AiohttpTransport):
                busy += transport.in_flight
            else:
                pool = transport._pool  # type: ignore[attr-defined]
                busy += sum(not (c.is_idle() or c.is_closed()) for c in pool.connections)
        return busy

    def _pick(self) -> int:
        """The shard with the fewest streams open, so no shard waits while another has room."""
        busy = self._busy
        return busy.index(min(busy)) if len(busy) > 1 else 0

    async def warm(self) -> None:
        """Open a pooled connection per shard ahead of the first turns. Never raises."""

        async def one(client: httpx.AsyncClient) -> int:
            return (await client.get("models")).status_code

        try:
            statuses = await asyncio.gather(*(one(client) for client in self._clients))
            logger.info(
                "upstream %s answered GET /models with %s (%d connections warmed)",
                self.base_url,
                statuses[0],
                len(statuses),
            )
        except Exception as exc:
            logger.warning("could not warm the upstream connection to %s: %r", self.base_url, exc)

    async def list_models(self) -> list[str]:
        """The model ids the server lists (`GET /models`, OpenAI's `{"data": [{"id": ...}]}`).

        Raises `UpstreamError` (plain words, the detail logged) when it cannot say.
        """
        try:
            response = await self._clients[0].get("models")
        except httpx.HTTPError as exc:
            raise failure(
                "connect",
                UNREACHABLE_MESSAGE,
                detail=f"GET {self.base_url}/models: {type(exc).__name__}: {exc}",
            ) from exc
        if not response.is_success:
            raise await status_error(response)
        try:
            cards = response.json()["data"]
            return [str(card["id"]) for card in cards if isinstance(card, dict) and "id" in card]
        except (ValueError, KeyError, TypeError) as exc:
            raise failure(
                "protocol",
                UNREADABLE_MESSAGE,
                detail=f"GET {self.base_url}/models answered no model list: {exc!r}",
            ) from exc

    def _release(self, shard: int) -> None:
        self._busy[shard] -= 1

    async def aclose(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self._clients))

    async def stream_chat(
        self,
        *,
        model: str,
        messages: list[dict[str, str]],
        max_tokens: int | None = None,
        temperature: float | None = None,
        timing: StreamTiming | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """Stream one answer: `Delta`s in order, one `Finish`, then exactly one `Usage`.

        `timing`, when given, gets the moments the request was sent and the first delta came.

        Raises `UpstreamError` for anything that keeps the answer from finishing. Use it as
        `async with contextlib.aclosing(client.stream_chat(...)) as items:` or run it in a
        task you cancel: either way the HTTP response is closed at once, so the model server
        stops generating and no pooled connection leaks.
        """
        payload: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if max_tokens is not None:
            payload["max_tokens"] = max_tokens
        if temperature is not None:
            payload["temperature"] = temperature
        progress = Progress(prompt_chars=sum(len(m.get("content") or "") for m in messages))
        # The total timeout is a deadline applied to each await, not an `asyncio.timeout`
        # block around the loop: a timeout scope must never span a `yield` of an async
        # generator, or it would fire in (and cancel) the consumer's code instead.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.total_timeout
        if timing is None:
            timing = StreamTiming()
        shard = self._pick()
        self._busy[shard] += 1
        try:
            async with contextlib.AsyncExitStack() as stack:
                stack.callback(self._release, shard)
                async with asyncio.timeout_at(deadline):
                    timing.sent = loop.time()
                    response = await stack.enter_async_context(
                        self._clients[shard].stream(
                            "POST",
                            "chat/completions",
                            json=payload,
                            # Uncompressed: a compressed stream is held back by its
                            # compressor, and its reads could make no text for a while.
                            headers={"accept": "text/event-stream", "accept-encoding": "identity"},
                        )
                    )
                    progress.responded = True
                    metrics.upstream_responded(loop.time() - timing.sent)
                    if not response.is_success:
                        raise await status_error(response)
                content_type = response.headers.get("content-type", "")
                if "json" in content_type and "event-stream" not in content_type:
                    # A server that ignored "stream": true sends one whole completion.
                    async with asyncio.timeout_at(deadline):
                        body = await response.aread()
                    for item in items_from_completion(body, progress):
                        if timing.first_delta is None and isinstance(item, Delta):
                            timing.first_delta = loop.time()
                        yield item
                    return
                chunks = response.aiter_bytes()
                parser = SSEParser()
                deadline_watch = _Deadline(loop, deadline)
                stack.callback(deadline_watch.cancel)
                while not progress.done:
                    chunk = await deadline_watch.read(chunks)
                    events = parser.close() if chunk is None else parser.feed(chunk)
                    for item in items_from_events(events, progress):
                        if timing.first_delta is None and isinstance(item, Delta):
                            timing.first_delta = loop.time()
                        yield item
                    if chunk is None:
                        break
                if progress.done:
                    # Read the (tiny) rest of the body so the connection goes back to the
                    # pool. The answer is whole: a server that keeps the connection open
                    # after [DONE] (silent, or sending pings) has it closed after a moment
                    # instead of failing the answer (hostile review, 2026-12-04).
                    with contextlib.suppress(TimeoutError, httpx.TransportError):
                        async with asyncio.timeout_at(min(deadline, loop.time() + REST_SECONDS)):
                            async for _ in chunks:
                                pass
            if not progress.done:
                if not progress.text_chars:
                    raise failure("empty", EMPTY_ANSWER_MESSAGE)
                if progress.finish is None:
                    raise failure("protocol", DROPPED_MESSAGE)
                # Finished but no [DONE]: the answer is whole, so do not throw it away.
                logger.info("upstream %s ended its stream without [DONE]", self.base_url)
            if progress.finish is None:
                yield Finish("stop")
            yield progress.usage()
        except httpx.ConnectTimeout as exc:
            raise failure(
                "connect",
                UNREACHABLE_MESSAGE,
                detail=f"no connection to {self.base_url} within {self.connect_timeout:g} s",
            ) from exc
        except (httpx.ConnectError, httpx.UnsupportedProtocol) as exc:
            raise failure(
                "connect",
                UNREACHABLE_MESSAGE,
                detail=f"could not connect to {self.base_url}: {type(exc).__name__}: {exc}",
            ) from exc
        except httpx.PoolTimeout as exc:
            raise failure(
                "timeout",
                "Too many answers in progress: no connection to the model server came free",
            ) from exc
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            if progress.text_chars:
                message = f"The model stopped sending for more than {self.read_timeout:g} s"
            else:
                message = f"The model took longer than {self.read_timeout:g} s to answer"
            raise failure("timeout", message) from exc
        except TimeoutError as exc:  # our own deadline
            raise failure(
                "timeout", f"The model took longer than {self.total_timeout:g} s to answer"
            ) from exc
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            if progress.responded:
                raise failure("protocol", DROPPED_MESSAGE) from exc
            raise failure(
                "protocol", "The model server closed the connection without answering"
            ) from exc
        except httpx.HTTPError as exc:
            raise failure(
                "protocol", UNREADABLE_MESSAGE, detail=f"{type(exc).__name__}: {exc}"
            ) from exc

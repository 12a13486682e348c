"""The upstream client: one pooled httpx client per process and loop; OpenAI-style SSE → deltas."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import ssl
import weakref
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from chat import metrics
from chat.sse import SSEEvent, SSEParser

logger = logging.getLogger(__name__)

ErrorKind = Literal["http_status", "timeout", "connect", "protocol", "stream_error", "empty"]

# How much of an error response we read to explain it: enough for any JSON error, and a
# misbehaving server cannot make us buffer a huge page.
MAX_ERROR_BODY_BYTES = 64 * 1024
MAX_ERROR_MESSAGE_CHARS = 300
CHARS_PER_TOKEN = 4  # the usual rule of thumb when a server reports no usage
EMPTY_ANSWER_MESSAGE = (
    "The model returned an empty answer (the prompt may be over its context window)"
)
DROPPED_MESSAGE = "The model's connection dropped before the answer finished"


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of the answer's text, in order."""

    text: str


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one answer; `estimated` when the server sent none and we counted chars."""

    prompt_tokens: int
    completion_tokens: int
    estimated: bool


@dataclass(frozen=True, slots=True)
class Finish:
    """Why the model stopped: "stop", "length", "content_filter", …"""

    reason: str


StreamItem = Delta | Usage | Finish


class UpstreamError(Exception):
    """The model server could not give an answer; `message` is fit to show the user."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return (
            f"UpstreamError(kind={self.kind!r}, status={self.status!r}, message={self.message!r})"
        )


def _failure(kind: ErrorKind, message: str, **extra: Any) -> UpstreamError:
    logger.warning("upstream %s: %s", kind, message)
    return UpstreamError(kind, message, **extra)


# httpcore's pool walks all its connections, and for each idle one all of them again, on every
# request start and response close (httpcore 1.0.9 `_assign_requests_to_connections`): its cost
# grows with the square of the connections. Shards of at most this many keep it small
# (docs/decisions/performance.md).
MAX_CONNECTIONS_PER_SHARD = 32


def _aiohttp_transport(
    limits: httpx.Limits, verify: ssl.SSLContext | bool
) -> httpx.AsyncBaseTransport:
    from chat.aiohttp_transport import AiohttpTransport

    # The same certificate check as httpx's own stack (certifi's CAs unless told otherwise).
    context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify)
    return AiohttpTransport(limits=limits, ssl_context=context)


def shard_count(pool_size: int) -> int:
    """How many httpx clients share `pool_size` connections, none over the shard size."""
    return max(1, math.ceil(pool_size / MAX_CONNECTIONS_PER_SHARD))


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
        backend: str | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.total_timeout = total_timeout
        headers = {"user-agent": "chatsite"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        if backend is None:
            from django.conf import settings

            backend = settings.LLM_HTTP_BACKEND
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
        from chat.aiohttp_transport import AiohttpTransport

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
    ) -> AsyncGenerator[StreamItem, None]:
        """Stream one answer: `Delta`s in order, one `Finish`, then exactly one `Usage`.

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
        progress = _Progress(prompt_chars=sum(len(m.get("content") or "") for m in messages))
        # The total timeout is a deadline applied to each await, not an `asyncio.timeout`
        # block around the loop: a timeout scope must never span a `yield` of an async
        # generator, or it would fire in (and cancel) the consumer's code instead.
        deadline = asyncio.get_running_loop().time() + self.total_timeout
        shard = self._pick()
        self._busy[shard] += 1
        try:
            async with contextlib.AsyncExitStack() as stack:
                stack.callback(self._release, shard)
                async with asyncio.timeout_at(deadline):
                    response = await stack.enter_async_context(
                        self._clients[shard].stream(
                            "POST",
                            "chat/completions",
                            json=payload,
                            headers={"accept": "text/event-stream"},
                        )
                    )
                    progress.responded = True
                    metrics.upstream_responded(
                        asyncio.get_running_loop().time() - deadline + self.total_timeout
                    )
                    if not response.is_success:
                        raise await _status_error(response)
                content_type = response.headers.get("content-type", "")
                if "json" in content_type and "event-stream" not in content_type:
                    # A server that ignored "stream": true sends one whole completion.
                    async with asyncio.timeout_at(deadline):
                        body = await response.aread()
                    for item in _items_from_completion(body, progress):
                        yield item
                    return
                chunks = response.aiter_bytes()
                parser = SSEParser()
                while not progress.done:
                    async with asyncio.timeout_at(deadline):
                        chunk = await anext(chunks, None)
                    if chunk is None:
                        for item in _items_from_events(parser.close(), progress):
                            yield item
                        break
                    for item in _items_from_events(parser.feed(chunk), progress):
                        yield item
                if progress.done:
                    # Read the (tiny) rest of the body so the connection goes back to the
                    # pool; leaving it unread would make httpx close it.
                    async with asyncio.timeout_at(deadline):
                        async for _ in chunks:
                            pass
            if not progress.done:
                if not progress.text_chars:
                    raise _failure("empty", EMPTY_ANSWER_MESSAGE)
                if progress.finish is None:
                    raise _failure("protocol", DROPPED_MESSAGE)
                # Finished but no [DONE]: the answer is whole, so do not throw it away.
                logger.info("upstream %s ended its stream without [DONE]", self.base_url)
            if progress.finish is None:
                yield Finish("stop")
            yield progress.usage()
        except httpx.ConnectTimeout as exc:
            raise _failure(
                "connect", f"Could not reach the model server within {self.connect_timeout:g} s"
            ) from exc
        except (httpx.ConnectError, httpx.UnsupportedProtocol) as exc:
            raise _failure("connect", f"Could not reach the model server ({exc})") from exc
        except httpx.PoolTimeout as exc:
            raise _failure(
                "timeout",
                "Too many answers in progress: no connection to the model server came free",
            ) from exc
        except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
            if progress.text_chars:
                message = f"The model stopped sending for more than {self.read_timeout:g} s"
            else:
                message = f"The model took longer than {self.read_timeout:g} s to answer"
            raise _failure("timeout", message) from exc
        except TimeoutError as exc:  # our own deadline
            raise _failure(
                "timeout", f"The model took longer than {self.total_timeout:g} s to answer"
            ) from exc
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            if progress.responded:
                raise _failure("protocol", DROPPED_MESSAGE) from exc
            raise _failure(
                "protocol", "The model server closed the connection without answering"
            ) from exc
        except httpx.HTTPError as exc:
            raise _failure(
                "protocol", f"The model server's answer could not be read ({exc})"
            ) from exc


@dataclass
class _Progress:
    """What one stream has delivered so far."""

    prompt_chars: int
    responded: bool = False
    done: bool = False
    text_chars: int = 0
    finish: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def usage(self) -> Usage:
        estimated = self.prompt_tokens is None or self.completion_tokens is None
        prompt = self.prompt_tokens
        if prompt is None:
            prompt = math.ceil(self.prompt_chars / CHARS_PER_TOKEN)
        completion = self.completion_tokens
        if completion is None:
            completion = math.ceil(self.text_chars / CHARS_PER_TOKEN)
        return Usage(prompt, completion, estimated)

    def take_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and not isinstance(prompt, bool):
            self.prompt_tokens = prompt
        if isinstance(completion, int) and not isinstance(completion, bool):
            self.completion_tokens = completion


def _items_from_events(events: list[SSEEvent], progress: _Progress) -> Iterator[StreamItem]:
    """The items in a batch of events, yielded one by one so an error event after some deltas
    still lets those deltas through first."""
    for event in events:
        if progress.done:
            break
        data: str = event.data
        if data == "[DONE]":
            progress.done = True
            break
        if event.event == "error":
            raise _failure("stream_error", _stream_error_message(_loads_or_text(data)))
        try:
            chunk = json.loads(data)
        except ValueError:
            raise _failure(
                "protocol", "The model server sent a malformed chunk (not JSON)"
            ) from None
        if not isinstance(chunk, dict):
            raise _failure("protocol", "The model server sent a malformed chunk (not an object)")
        if chunk.get("error"):
            raise _failure("stream_error", _stream_error_message(chunk))
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                content = delta.get("content")
                # A role-only first delta and an empty last one carry no text: skip them.
                if isinstance(content, str) and content:
                    progress.text_chars += len(content)
                    yield Delta(content)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason and progress.finish is None:
                progress.finish = reason
                yield Finish(reason)
        progress.take_usage(chunk.get("usage"))


def _items_from_completion(body: bytes, progress: _Progress) -> list[StreamItem]:
    """Items of a non-streamed completion (a server that ignored "stream": true)."""
    try:
        completion = json.loads(body)
    except ValueError:
        raise _failure("protocol", "The model server sent a malformed answer (not JSON)") from None
    if not isinstance(completion, dict):
        raise _failure("protocol", "The model server sent a malformed answer (not an object)")
    if completion.get("error"):
        raise _failure("stream_error", _stream_error_message(completion))
    items: list[StreamItem] = []
    for choice in completion.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str) and content:
            progress.text_chars += len(content)
            items.append(Delta(content))
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            progress.finish = reason
            items.append(Finish(reason))
    if not progress.text_chars:
        raise _failure("empty", EMPTY_ANSWER_MESSAGE)
    if progress.finish is None:
        items.append(Finish("stop"))
    progress.take_usage(completion.get("usage"))
    progress.done = True
    items.append(progress.usage())
    return items


# --- readable error messages --------------------------------------------------------------------

_TAG_RE = re.compile(r"<[^>]*>")


def _loads_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > MAX_ERROR_MESSAGE_CHARS:
        text = text[: MAX_ERROR_MESSAGE_CHARS - 1] + "…"
    return text


def error_body_message(body: Any) -> str:
    """The human part of an error body: OpenAI's {"error": {...}}, {"detail": ...}, or text."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            message = error.get("message")
            if isinstance(message, str) and message.strip():
                return _shorten(message)
            return _shorten(json.dumps(error))
        if isinstance(error, str) and error.strip():
            return _shorten(error)
        detail = body.get("detail")
        if isinstance(detail, str) and detail.strip():
            return _shorten(detail)
        if isinstance(detail, list):
            # FastAPI's validation errors: a list of {"loc": [...], "msg": "..."}.
            parts = [
                d["msg"] for d in detail if isinstance(d, dict) and isinstance(d.get("msg"), str)
            ]
            if parts:
                return _shorten("; ".join(parts))
        message = body.get("message")
        if isinstance(message, str) and message.strip():
            return _shorten(message)
        return _shorten(json.dumps(body))
    if isinstance(body, str):
        # Plain text, or an HTML error page from a proxy: keep only its words.
        return _shorten(_TAG_RE.sub(" ", body))
    return _shorten(json.dumps(body))


def _stream_error_message(body: Any) -> str:
    text = error_body_message(body)
    return f"The model server reported an error mid-answer: {text or 'no details'}"


async def _status_error(response: httpx.Response) -> UpstreamError:
    body = b""
    with contextlib.suppress(httpx.HTTPError):
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) >= MAX_ERROR_BODY_BYTES:
                break
    text = body[:MAX_ERROR_BODY_BYTES].decode("utf-8", "replace").strip()
    detail = error_body_message(_loads_or_text(text)) if text else ""
    if not detail:
        detail = response.reason_phrase or "no details"
    retry_after = None
    with contextlib.suppress(ValueError):
        retry_after = float(response.headers.get("retry-after", ""))
    return _failure(
        "http_status",
        f"The model server answered {response.status_code}: {detail}",
        status=response.status_code,
        retry_after=retry_after,
    )


# --- history --------------------------------------------------------------------------------------


def trim_history(messages: list[dict[str, str]], budget_chars: int) -> list[dict[str, str]]:
    """The messages to send: the system message, then the newest turns that fit the budget.

    The last user message is always kept; alone over the budget it is cut from the front
    (its end is what the user just asked), though never below half the budget however long
    the system message is. Older messages go oldest-first, and whole: a message that does not
    fit ends the history there. The kept history starts with a user message, because some
    chat templates (Gemma's, for one) refuse a conversation that opens with the assistant.
    """
    system = next((m for m in messages if m.get("role") == "system"), None)
    rest = [m for m in messages if m.get("role") != "system"]
    last_user = max((i for i, m in enumerate(rest) if m.get("role") == "user"), default=None)
    remaining = budget_chars - (len(system.get("content") or "") if system else 0)
    kept: list[dict[str, str]] = []
    fitting = True
    for index in range(len(rest) - 1, -1, -1):
        message = rest[index]
        size = len(message.get("content") or "")
        if index == last_user:
            room = max(remaining, budget_chars // 2)
            if size > room:
                message = {**message, "content": (message.get("content") or "")[size - room :]}
                size = room
            kept.append(message)
            remaining -= size
        elif fitting and size <= remaining:
            kept.append(message)
            remaining -= size
        else:
            fitting = False
            if last_user is None or index < last_user:
                break
    kept.reverse()
    while kept and kept[0].get("role") != "user" and last_user is not None:
        kept.pop(0)
    return ([system] if system else []) + kept


# --- the process-wide client ------------------------------------------------------------------


@dataclass
class _LoopClient:
    loop: weakref.ref[asyncio.AbstractEventLoop]
    config: tuple[Any, ...]
    client: UpstreamClient


_clients: dict[int, _LoopClient] = {}
_closing: set[asyncio.Task[None]] = set()


def _settings_config() -> tuple[Any, ...]:
    from django.conf import settings  # lazily: this module must import without Django set up

    return (
        settings.LLM_BASE_URL,
        settings.LLM_API_KEY,
        settings.LLM_CONNECT_TIMEOUT,
        settings.LLM_READ_TIMEOUT,
        settings.LLM_TOTAL_TIMEOUT,
        settings.LLM_POOL_SIZE,
        settings.LLM_HTTP2,
        settings.LLM_HTTP_BACKEND,
    )


def get_client() -> UpstreamClient:
    """The upstream client of this process for the running event loop, built from settings.

    One per loop because an httpx client's connections belong to the loop that opened them
    (tests run many loops). A change of the LLM_* settings (tests override them) builds a new
    client and closes the old one.
    """
    loop = asyncio.get_running_loop()
    for key, old in list(_clients.items()):
        old_loop = old.loop()
        if old_loop is None or old_loop.is_closed():
            # Its connections died with their loop; there is nothing left to close cleanly.
            del _clients[key]
    config = _settings_config()
    entry = _clients.get(id(loop))
    if entry is not None and entry.loop() is loop and entry.config == config:
        return entry.client
    if entry is not None and entry.loop() is loop:
        task = loop.create_task(entry.client.aclose())
        _closing.add(task)
        task.add_done_callback(_closing.discard)
    base_url, api_key, connect, read, total, pool, http2, backend = config
    client = UpstreamClient(
        base_url,
        api_key,
        connect_timeout=connect,
        read_timeout=read,
        total_timeout=total,
        pool_size=pool,
        http2=http2,
        backend=backend,
    )
    _clients[id(loop)] = _LoopClient(weakref.ref(loop), config, client)
    return client


async def close_client() -> None:
    """Close this loop's upstream client (on shutdown; the next get_client() builds anew)."""
    entry = _clients.pop(id(asyncio.get_running_loop()), None)
    if entry is not None:
        await entry.client.aclose()

"""An httpx transport that sends requests through aiohttp (`LLM_HTTP_BACKEND=aiohttp`).

Why: reading a model's stream is the largest per-token cost of a relay, and httpx's own
stack (httpcore → h11 → anyio) pays for every SSE chunk in pure Python, plus two `epoll_ctl`
calls, because anyio's socket stream resumes and pauses reading around each `receive()`.
aiohttp parses HTTP in C (llhttp) and keeps reading while data flows, and its pool has no
quadratic bookkeeping. Measured with `bench/upstream_read.py` (docs/decisions/performance.md).

The rest of chatsite keeps talking to httpx (`httpx.AsyncClient`, `httpx.Response`,
httpx's exceptions); this module only maps aiohttp's failures onto httpx's, with the care
`chat.upstream` needs to explain them: a connect failure, a full pool, a read timeout and a
connection dropped mid-answer are all different messages for the user.
(httpx-aiohttp does the same job, but maps every `ClientConnectionError`, including a drop
mid-answer, to `ConnectTimeout`; this is the small part of it we need, mapped precisely.)
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import httpx


@contextlib.contextmanager
def _mapped(request: httpx.Request, *, pool_full: bool = False) -> Iterator[None]:
    """Re-raise aiohttp's exceptions as the httpx ones that mean the same."""
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:  # waiting for the pool, or connecting
        kind = httpx.PoolTimeout if pool_full else httpx.ConnectTimeout
        raise kind(str(exc) or "timed out", request=request) from exc
    except aiohttp.SocketTimeoutError as exc:
        raise httpx.ReadTimeout(str(exc) or "timed out", request=request) from exc
    except aiohttp.ServerTimeoutError as exc:  # any other timeout aiohttp names
        raise httpx.ReadTimeout(str(exc) or "timed out", request=request) from exc
    except (aiohttp.InvalidUrlClientError, aiohttp.NonHttpUrlClientError) as exc:
        raise httpx.UnsupportedProtocol(str(exc), request=request) from exc
    except aiohttp.ClientConnectorError as exc:  # refused, unreachable, DNS
        raise httpx.ConnectError(str(exc), request=request) from exc
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    except aiohttp.ClientResponseError as exc:  # a malformed status line or headers
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    except aiohttp.ClientOSError as exc:  # reset by peer and the like
        raise httpx.ReadError(str(exc), request=request) from exc
    except aiohttp.ClientError as exc:
        raise httpx.TransportError(str(exc), request=request) from exc


class _Body(httpx.AsyncByteStream):
    """A response body read as it arrives; closing it early closes the connection."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        request: httpx.Request,
        on_close: Callable[[], None],
    ) -> None:
        self._response = response
        self._request = request
        self._on_close: Callable[[], None] | None = on_close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped(self._request):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        response = self._response
        if response.content.at_eof():
            response.release()  # read to the end: the connection goes back to the pool
        else:
            # Unread body (a stop, a cancelled turn): drop the connection so the model
            # server sees it and stops generating.
            response.close()
        if self._on_close is not None:
            on_close, self._on_close = self._on_close, None
            on_close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 through one pooled `aiohttp.ClientSession` (created on first use)."""

    def __init__(self, *, limits: httpx.Limits, ssl_context: ssl.SSLContext) -> None:
        self._ssl = ssl_context
        self._limit = limits.max_connections or 0
        self._keepalive = limits.keepalive_expiry
        self._session: aiohttp.ClientSession | None = None
        self._in_flight = 0  # responses not yet closed: a full pool means a PoolTimeout

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._limit,
                limit_per_host=0,
                keepalive_timeout=self._keepalive if self._keepalive is not None else 30.0,
                use_dns_cache=True,
                ssl=self._ssl,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,  # httpx decodes, as with its own transport
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        session = self._get_session()
        pool_full = bool(self._limit) and self._in_flight >= self._limit
        body = request.content or None  # the JSON payload, already encoded
        self._in_flight += 1
        try:
            with _mapped(request, pool_full=pool_full):
                response = await session.request(
                    request.method,
                    str(request.url),
                    headers=list(request.headers.multi_items()),
                    data=body,
                    allow_redirects=False,
                    compress=None,
                    skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
                    timeout=aiohttp.ClientTimeout(
                        total=None,
                        connect=timeouts.get("pool"),
                        sock_connect=timeouts.get("connect"),
                        sock_read=timeouts.get("read"),
                    ),
                )
        except BaseException:
            self._in_flight -= 1
            raise
        return httpx.Response(
            status_code=response.status,
            headers=[(k, v) for k, v in response.raw_headers],
            stream=_Body(response, request, self._closed_one),
            request=request,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode(),
            },
        )

    @property
    def in_flight(self) -> int:
        """Responses sent through this transport and not closed yet."""
        return self._in_flight

    def _closed_one(self) -> None:
        self._in_flight -= 1

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

"""The built-in OpenAI-compatible demo model (ARCHITECTURE §7): a pure ASGI app, no Django.

It answers `POST {prefix}/chat/completions` (streaming or not) and `GET {prefix}/models`
deterministically, so the chat, its tests and its benchmarks run without a real model.
Directives at the start of the last user message steer it:

    /echo <text>        answer exactly <text> (one space, tab or newline after /echo is eaten)
    /long <n>           n tokens of deterministic prose (a prefix of one fixed text)
    /fail <status>      that HTTP status (400-599) with an OpenAI-style error body
    /cut <n>            stream the first n tokens of /long, then drop the connection
    /stall <s> [rest]   wait s seconds before the first token, then answer [rest]

Standalone: `python -m chat.demo_upstream --port N [--host H] [--ttfb-ms X] [--tps Y]`
(`--port 0` picks a free port; the line printed once listening names the base URL).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http
import json
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

Scope = MutableMapping[str, Any]
ASGIMessage = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]

MODELS = ("demo-full", "demo-lite")
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_LONG_TOKENS = 200_000
MAX_STALL_SECONDS = 3600.0
# With tokens_per_second=0 tokens go out in batches of this many SSE events per body send:
# one send per token would make "as fast as possible" mostly per-send overhead.
FAST_BATCH_TOKENS = 64

# A token is a run of up to 12 non-space characters plus the whitespace after it (or a run of
# leading whitespace), so the tokens of any text join back to exactly that text.
_TOKEN_RE = re.compile(r"\S{1,12}\s*|\s+")
_DIRECTIVE_RE = re.compile(r"\s*/(echo|long|fail|cut|stall)(?=\s|$)")
# What must be escaped to quote a question inline without it turning into markup.
_MARKDOWN_SPECIAL = frozenset("\\`*_[]<>|~")


class DemoRequestError(Exception):
    """A request the demo refuses, carried to an OpenAI-style error response."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


class _ClientGone(Exception):
    """The client disconnected: the generation stops where it is."""


class ConnectionCut(Exception):
    """Raised after a `/cut` response when the server gives us no way to drop the socket.

    ASGI servers such as uvicorn and hypercorn answer an exception raised after the body
    started by closing the connection, which is exactly the failure /cut simulates.
    """


@dataclass
class AnswerPlan:
    """What a completion request asked for, once the directives are read."""

    tokens: list[str]
    stall_seconds: float = 0.0
    cut: bool = False
    fail_status: int | None = None


@dataclass
class _Request:
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    prompt_tokens: int
    plan: AnswerPlan = field(default_factory=lambda: AnswerPlan(tokens=[]))


def tokenize(text: str) -> list[str]:
    """Split text into word-ish tokens that join back to exactly `text`."""
    return _TOKEN_RE.findall(text)


_LONG_WORDS = (
    "the stream carries each token quickly across a socket while browser renders "
    "markdown and server keeps every chunk in order so nothing is lost when tab "
    "reconnects later model answer quietly steady river signal window buffer frame "
    "light garden morning engine patient careful bright simple honest small large "
    "clear"
)
_LONG_VOCABULARY = tuple(_LONG_WORDS.split())
_long_tokens_cache: list[str] = []
_long_state = [20251129]  # the LCG state, kept so the cached text only ever grows


def _next_random(bound: int) -> int:
    # A tiny LCG: the same sequence on every run and Python version (`random` does not
    # promise that across versions), and fast enough for a few hundred thousand tokens.
    _long_state[0] = (_long_state[0] * 1103515245 + 12345) % 2**31
    return (_long_state[0] >> 8) % bound


def long_tokens(n: int) -> list[str]:
    """The first n tokens of one fixed text of sentences and paragraphs (a word + space)."""
    while len(_long_tokens_cache) < n:
        sentences = 3 + _next_random(3)
        for s in range(sentences):
            words: list[str] = []
            for _ in range(6 + _next_random(9)):
                word = _LONG_VOCABULARY[_next_random(len(_LONG_VOCABULARY))]
                if words and word == words[-1]:  # "morning morning" reads like a bug
                    word = _LONG_VOCABULARY[
                        (_LONG_VOCABULARY.index(word) + 1) % len(_LONG_VOCABULARY)
                    ]
                words.append(word)
            words[0] = words[0].capitalize()
            ending = ".\n\n" if s == sentences - 1 else ". "
            _long_tokens_cache.extend(w + " " for w in words[:-1])
            _long_tokens_cache.append(words[-1] + ending)
    return _long_tokens_cache[:n]


def _escape_markdown(text: str) -> str:
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in text)


def default_reply(question: str) -> str:
    """The friendly answer to a message without a directive: shows off markdown rendering."""
    asked = " ".join(question.split())
    if len(asked) > 120:
        asked = asked[:117] + "..."
    lines = ["## Hello from the demo model", ""]
    if asked:
        lines += [f"You asked: *{_escape_markdown(asked)}*", ""]
    lines += [
        "I am the **built-in demo model**. I do not really understand questions, but I answer "
        "the same way every time, so the whole chat can be tried and tested without a real "
        "model.",
        "",
        "- Answers **stream** token by token.",
        "- Markdown is rendered *safely* on the server.",
        "- Directives: `/echo <text>`, `/long <n>`, `/fail <status>`, `/cut <n>`, "
        "`/stall <seconds>`.",
        "",
        "```python",
        "def greet(name: str) -> str:",
        '    return f"Hello, {name}!"',
        "",
        'print(greet("chatsite"))',
        "```",
        "",
        "Have a nice day!",
    ]
    return "\n".join(lines)


def _int_argument(directive: str, raw: str | None, low: int, high: int) -> int:
    try:
        value = int(raw or "")
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise DemoRequestError(
            400, f"/{directive} needs a whole number from {low} to {high}", "invalid_directive"
        )
    return value


def plan_answer(text: str) -> AnswerPlan:
    """Read the directive (if any) at the start of the last user message."""
    match = _DIRECTIVE_RE.match(text)
    if match is None:
        return AnswerPlan(tokens=tokenize(default_reply(text)))
    directive, rest = match.group(1), text[match.end() :]
    if directive == "echo":
        # Eat exactly one separator so "/echo  x" answers " x" and "/echo\nx" answers "x".
        if rest.startswith("\r\n"):
            rest = rest[2:]
        elif rest[:1] in (" ", "\t", "\n", "\r"):
            rest = rest[1:]
        return AnswerPlan(tokens=tokenize(rest))
    parts = rest.split(maxsplit=1)
    argument = parts[0] if parts else None
    remainder = parts[1] if len(parts) > 1 else ""
    if directive == "long":
        return AnswerPlan(tokens=long_tokens(_int_argument("long", argument, 0, MAX_LONG_TOKENS)))
    if directive == "cut":
        n = _int_argument("cut", argument, 0, MAX_LONG_TOKENS)
        return AnswerPlan(tokens=long_tokens(n), cut=True)
    if directive == "fail":
        return AnswerPlan(tokens=[], fail_status=_int_argument("fail", argument, 400, 599))
    # /stall <seconds> [rest]: the rest is answered as if it were the whole message.
    try:
        seconds = float(argument or "")
    except ValueError:
        seconds = -1.0
    if not 0.0 <= seconds <= MAX_STALL_SECONDS:  # also refuses nan
        raise DemoRequestError(
            400,
            f"/stall needs a number of seconds from 0 to {MAX_STALL_SECONDS:g}",
            "invalid_directive",
        )
    plan = plan_answer(remainder)
    plan.stall_seconds += seconds
    return plan


def _message_text(content: Any) -> str:
    """The text of a message's content: a string, or OpenAI's list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                raise DemoRequestError(
                    400, "Unsupported message content part", "invalid_value", "messages"
                )
        return "".join(texts)
    raise DemoRequestError(
        400, "Message content must be a string or a list of parts", "invalid_type", "messages"
    )


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if not value >= 0:
        raise ValueError(f"{name}={raw!r} must be 0 or more")
    return value


def _error_body(
    message: str, kind: str, code: str | None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


_FAIL_KINDS = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "permission_denied"),
    404: ("not_found_error", "not_found"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", "internal_error"),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "overloaded"),
    504: ("server_error", "timeout"),
}


class DemoModel:
    """The demo model as an ASGI app; `stats` counts completions so tests can see cancellation."""

    def __init__(
        self,
        prefix: str = "/v1",
        ttfb_ms: int | None = None,
        tokens_per_second: float | None = None,
    ) -> None:
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self.ttfb_ms = int(_env_number("DEMO_TTFB_MS", 150)) if ttfb_ms is None else ttfb_ms
        self.tokens_per_second = (
            _env_number("DEMO_TOKENS_PER_SECOND", 40.0)
            if tokens_per_second is None
            else tokens_per_second
        )
        if self.ttfb_ms < 0 or self.tokens_per_second < 0:
            raise ValueError("ttfb_ms and tokens_per_second must be 0 or more")
        # started == completed + cancelled + active at every await point. A /cut answer counts
        # as completed: it did what it was asked to.
        self.stats = {"started": 0, "completed": 0, "cancelled": 0, "active": 0, "tokens_sent": 0}
        self._next_id = 0

    # --- ASGI entry ------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1000})
            return
        path: str = scope["path"]
        method: str = scope["method"]
        sub = path[len(self.prefix) :] if path.startswith(self.prefix) else None
        try:
            if sub == "/chat/completions" and method == "POST":
                await self._chat_completions(receive, send)
            elif sub == "/models" and method == "GET":
                data = [self._model_card(m) for m in MODELS]
                await _send_json(send, 200, {"object": "list", "data": data})
            elif sub is not None and sub.startswith("/models/") and method == "GET":
                name = sub[len("/models/") :]
                if name not in MODELS:
                    raise _unknown_model(name)
                await _send_json(send, 200, self._model_card(name))
            else:
                await _send_json(
                    send,
                    404,
                    _error_body(
                        f"Unknown request: {method} {path}", "invalid_request_error", "not_found"
                    ),
                )
        except DemoRequestError as exc:
            kind = "invalid_request_error" if exc.status < 500 else "server_error"
            await _send_json(send, exc.status, _error_body(exc.message, kind, exc.code, exc.param))

    @staticmethod
    def _model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "chatsite"}

    @staticmethod
    async def _lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    # --- chat completions ------------------------------------------------------------------

    async def _chat_completions(self, receive: Receive, send: Send) -> None:
        body = await _read_body(receive)
        if body is None:
            return  # the client left before it finished sending the request
        request = self._parse_request(body)
        plan = request.plan
        if plan.fail_status is not None:
            status = plan.fail_status
            kind, code = _FAIL_KINDS.get(
                status,
                ("invalid_request_error" if status < 500 else "server_error", f"http_{status}"),
            )
            phrase = _reason_phrase(status)
            headers = [(b"retry-after", b"1")] if status in (429, 503) else []
            await _send_json(
                send,
                status,
                _error_body(
                    f"The demo model failed on purpose (/fail {status}: {phrase})", kind, code
                ),
                headers,
            )
            return
        self._next_id += 1
        completion_id = f"chatcmpl-demo-{self._next_id}"
        answer = self._stream if request.stream else self._complete
        client_gone = asyncio.Event()
        generation = asyncio.ensure_future(answer(send, request, completion_id, client_gone))
        # Watch for the client leaving while we generate: a stopped chat turn must stop the
        # tokens at once, which is what a real model server (and our tests) want to see.
        disconnect = asyncio.ensure_future(_wait_for_disconnect(receive, client_gone))
        self.stats["started"] += 1
        self.stats["active"] += 1
        outcome = "cancelled"
        try:
            await asyncio.wait({generation, disconnect}, return_when=asyncio.FIRST_COMPLETED)
            if generation.done():
                generation.result()  # re-raise what the generation raised
                outcome = "completed"
        except _ClientGone:
            pass
        except ConnectionCut:
            outcome = "completed"
            raise
        finally:
            self.stats["active"] -= 1
            self.stats[outcome] += 1
            for task in (generation, disconnect):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionCut, _ClientGone):
                await generation
            with contextlib.suppress(asyncio.CancelledError):
                await disconnect

    def _parse_request(self, body: bytes) -> _Request:
        try:
            payload = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise DemoRequestError(
                400, "The request body is not valid JSON", "invalid_json"
            ) from None
        if not isinstance(payload, dict):
            raise DemoRequestError(400, "The request body must be a JSON object", "invalid_json")
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            raise DemoRequestError(
                400, "'model' is required", "missing_required_parameter", "model"
            )
        if model not in MODELS:
            raise _unknown_model(model)
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise DemoRequestError(
                400, "'messages' must be a non-empty list", "invalid_value", "messages"
            )
        texts: list[tuple[str, str]] = []
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise DemoRequestError(
                    400, "Each message needs a 'role'", "invalid_value", "messages"
                )
            texts.append((message["role"], _message_text(message.get("content"))))
        max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise DemoRequestError(
                400, "'max_tokens' must be a positive integer", "invalid_value", "max_tokens"
            )
        stream_options = payload.get("stream_options") or {}
        last_user = next((text for role, text in reversed(texts) if role == "user"), "")
        request = _Request(
            model=model,
            stream=payload.get("stream") is True,
            include_usage=isinstance(stream_options, dict)
            and stream_options.get("include_usage") is True,
            max_tokens=max_tokens,
            # A deterministic stand-in for a tokenizer: whitespace-separated words.
            prompt_tokens=max(1, sum(len(text.split()) for _, text in texts)),
        )
        request.plan = plan_answer(last_user)
        return request

    def _limit(self, request: _Request) -> tuple[list[str], str]:
        tokens = request.plan.tokens
        if request.max_tokens is not None and len(tokens) > request.max_tokens:
            return tokens[: request.max_tokens], "length"
        return tokens, "stop"

    async def _stream(
        self, send: Send, request: _Request, completion_id: str, client_gone: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        started_at = loop.time()
        tokens, finish_reason = self._limit(request)
        if request.plan.cut and finish_reason == "length":
            request.plan.cut = False  # max_tokens ended it before the cut: a normal end
        created = int(time.time())
        head = (
            f'{{"id":"{completion_id}","object":"chat.completion.chunk","created":{created},'
            f'"model":{json.dumps(request.model)},"system_fingerprint":"demo",'
            f'"choices":[{{"index":0,"delta":'
        )
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        first_due = started_at + self.ttfb_ms / 1000 + request.plan.stall_seconds
        await _sleep_until(loop, first_due)
        pieces = [
            _sse(head + '{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}')
        ]
        tps = self.tokens_per_second
        i, n = 0, len(tokens)
        while i < n:
            if client_gone.is_set():
                # Checked before every send: when tokens flow as fast as possible this stops
                # the very next batch, without waiting for the task to be cancelled.
                raise _ClientGone
            if tps > 0:
                # Due times come from one start time, so sleeps that overrun do not add up.
                await _sleep_until(loop, first_due + i / tps)
                elapsed = loop.time() - first_due
                j = min(n, max(i + 1, int(elapsed * tps) + 1))
            else:
                j = min(n, i + FAST_BATCH_TOKENS)
            for token in tokens[i:j]:
                pieces.append(
                    _sse(
                        head
                        + '{"content":'
                        + _json_string(token)
                        + '},"logprobs":null,"finish_reason":null}]}'
                    )
                )
            await send(
                {"type": "http.response.body", "body": _encode("".join(pieces)), "more_body": True}
            )
            self.stats["tokens_sent"] += j - i
            pieces = []
            i = j
            if tps == 0:
                await asyncio.sleep(0)  # let the disconnect watcher and other requests run
        if request.plan.cut:
            if pieces:
                await send(
                    {
                        "type": "http.response.body",
                        "body": _encode("".join(pieces)),
                        "more_body": True,
                    }
                )
            _drop_connection(send)
            return
        pieces.append(_sse(head + f'{{}},"logprobs":null,"finish_reason":"{finish_reason}"}}]}}'))
        if request.include_usage:
            usage = _usage(request.prompt_tokens, len(tokens))
            pieces.append(
                _sse(
                    f'{{"id":"{completion_id}","object":"chat.completion.chunk","created":{created},'
                    f'"model":{json.dumps(request.model)},"system_fingerprint":"demo",'
                    f'"choices":[],"usage":{json.dumps(usage)}}}'
                )
            )
        pieces.append("data: [DONE]\n\n")
        await send(
            {"type": "http.response.body", "body": _encode("".join(pieces)), "more_body": False}
        )

    async def _complete(
        self, send: Send, request: _Request, completion_id: str, client_gone: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        tokens, finish_reason = self._limit(request)
        if request.plan.cut and finish_reason == "length":
            request.plan.cut = False
        due = loop.time() + self.ttfb_ms / 1000 + request.plan.stall_seconds
        if self.tokens_per_second > 0 and tokens:
            due += (len(tokens) - 1) / self.tokens_per_second
        await _sleep_until(loop, due)
        body = _encode(
            json.dumps(
                {
                    "id": completion_id,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": request.model,
                    "system_fingerprint": "demo",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "".join(tokens)},
                            "logprobs": None,
                            "finish_reason": finish_reason,
                        }
                    ],
                    "usage": _usage(request.prompt_tokens, len(tokens)),
                },
                ensure_ascii=False,
            )
        )
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        if request.plan.cut:
            await send(
                {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
            )
            self.stats["tokens_sent"] += len(tokens)
            _drop_connection(send)
            return
        await send({"type": "http.response.body", "body": body, "more_body": False})
        self.stats["tokens_sent"] += len(tokens)


# --- small pieces of the protocol -------------------------------------------------------------


def _unknown_model(name: str) -> DemoRequestError:
    return DemoRequestError(
        404,
        f"The model `{name}` does not exist or you do not have access to it.",
        "model_not_found",
        "model",
    )


def _reason_phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _sse(data: str) -> str:
    return "data: " + data + "\n\n"


def _json_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _encode(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (sent to us as a JSON escape) cannot be UTF-8; a real server would
        # escape it, so do the same rather than fail.
        return text.encode("utf-8", "backslashreplace")


async def _send_json(
    send: Send, status: int, payload: dict[str, Any], headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise DemoRequestError(413, "The request body is too large", "request_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _wait_for_disconnect(receive: Receive, client_gone: asyncio.Event) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    client_gone.set()


async def _sleep_until(loop: asyncio.AbstractEventLoop, due: float) -> None:
    delay = due - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


def _drop_connection(send: Send) -> None:
    """End a /cut response by closing the socket mid-body, so the client sees a broken stream.

    ASGI has no "abort" message. daphne ignores an exception raised after the body started
    (and would keep the socket open forever), so when `send` is daphne's
    `partial(server.handle_reply, request)` we close its Twisted request directly:
    `loseConnection` flushes what was written and then closes, leaving the chunked body
    unterminated. Any other server gets an exception, which they answer by closing.
    """
    args = getattr(send, "args", ())
    lose = getattr(args[0], "loseConnection", None) if args else None
    if callable(lose):
        lose()
        return
    raise ConnectionCut("the /cut directive ended this response without finishing it")


app = DemoModel()


# --- standalone server ------------------------------------------------------------------------


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
        prog="python -m chat.demo_upstream", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--port", type=int, required=True, help="TCP port (0 picks a free one)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--ttfb-ms", type=int, default=None, help="default: $DEMO_TTFB_MS or 150")
    parser.add_argument("--tps", type=float, default=None, help="tokens/s, 0 = as fast as possible")
    parser.add_argument("--prefix", default="/v1")
    args = parser.parse_args(argv)
    model = DemoModel(prefix=args.prefix, ttfb_ms=args.ttfb_ms, tokens_per_second=args.tps)
    serve(model, args.host, args.port, model.prefix)


if __name__ == "__main__":
    main()

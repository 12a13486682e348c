"""The demo model as an ASGI application: OpenAI's `POST /chat/completions` (streaming or not)
and `GET /models`, deterministic, steered by directives (chat/demo_upstream/__init__.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from chat.demo_upstream.answers import (
    FAIL_KINDS,
    FAST_BATCH_TOKENS,
    MODELS,
    AnswerPlan,
    ClientGone,
    CompletionRequest,
    ConnectionCut,
    DemoRequestError,
    continue_plan,
    env_number,
    error_body,
    message_text,
    plan_answer,
    tokenize,
)
from chat.demo_upstream.titles import TITLE_REQUEST, title_for
from chat.demo_upstream.wire import (
    Receive,
    Scope,
    Send,
    drop_connection,
    encode,
    json_string,
    read_body,
    reason_phrase,
    send_json,
    sleep_until,
    sse,
    unknown_model,
    usage_of,
    wait_for_disconnect,
)


class DemoModel:
    """The demo model as an ASGI app; `stats` counts completions so tests can see cancellation."""

    def __init__(
        self,
        prefix: str = "/v1",
        ttfb_ms: int | None = None,
        tokens_per_second: float | None = None,
    ) -> None:
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self.ttfb_ms = int(env_number("DEMO_TTFB_MS", 150)) if ttfb_ms is None else ttfb_ms
        self.tokens_per_second = (
            env_number("DEMO_TOKENS_PER_SECOND", 40.0)
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
                await send_json(send, 200, {"object": "list", "data": data})
            elif sub is not None and sub.startswith("/models/") and method == "GET":
                name = sub[len("/models/") :]
                if name not in MODELS:
                    raise unknown_model(name)
                await send_json(send, 200, self._model_card(name))
            else:
                await send_json(
                    send,
                    404,
                    error_body(
                        f"Unknown request: {method} {path}", "invalid_request_error", "not_found"
                    ),
                )
        except DemoRequestError as exc:
            kind = "invalid_request_error" if exc.status < 500 else "server_error"
            await send_json(send, exc.status, error_body(exc.message, kind, exc.code, exc.param))

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
        body = await read_body(receive)
        if body is None:
            return  # the client left before it finished sending the request
        request = self._parse_request(body)
        plan = request.plan
        if plan.fail_status is not None:
            status = plan.fail_status
            kind, code = FAIL_KINDS.get(
                status,
                ("invalid_request_error" if status < 500 else "server_error", f"http_{status}"),
            )
            phrase = reason_phrase(status)
            headers = [(b"retry-after", b"1")] if status in (429, 503) else []
            await send_json(
                send,
                status,
                error_body(
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
        disconnect = asyncio.ensure_future(wait_for_disconnect(receive, client_gone))
        self.stats["started"] += 1
        self.stats["active"] += 1
        outcome = "cancelled"
        try:
            await asyncio.wait({generation, disconnect}, return_when=asyncio.FIRST_COMPLETED)
            if generation.done():
                generation.result()  # re-raise what the generation raised
                outcome = "completed"
        except ClientGone:
            pass
        except ConnectionCut:
            outcome = "completed"
            raise
        finally:
            self.stats["active"] -= 1
            self.stats[outcome] += 1
            for task in (generation, disconnect):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionCut, ClientGone):
                await generation
            with contextlib.suppress(asyncio.CancelledError):
                await disconnect

    def _parse_request(self, body: bytes) -> CompletionRequest:
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
            raise unknown_model(model)
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
            texts.append((message["role"], message_text(message.get("content"))))
        max_tokens = payload.get("max_completion_tokens", payload.get("max_tokens"))
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
        ):
            raise DemoRequestError(
                400, "'max_tokens' must be a positive integer", "invalid_value", "max_tokens"
            )
        stream_options = payload.get("stream_options") or {}
        last_user = next((text for role, text in reversed(texts) if role == "user"), "")
        request = CompletionRequest(
            model=model,
            stream=payload.get("stream") is True,
            include_usage=isinstance(stream_options, dict)
            and stream_options.get("include_usage") is True,
            max_tokens=max_tokens,
            # A deterministic stand-in for a tokenizer: whitespace-separated words.
            prompt_tokens=max(1, sum(len(text.split()) for _, text in texts)),
        )
        system = "\n\n".join(text for role, text in texts if role == "system")
        if system.startswith(TITLE_REQUEST):
            request.plan = AnswerPlan(tokens=tokenize(title_for(last_user)))
            return request
        request.plan = plan_answer(last_user, system)
        if texts[-1][0] == "assistant":
            # The request ends with the assistant's partial answer: go on from it.
            request.plan = continue_plan(request.plan, texts[-1][1])
        return request

    def _limit(self, request: CompletionRequest) -> tuple[list[str], str]:
        tokens = request.plan.tokens
        limits = [n for n in (request.max_tokens, request.plan.length_limit) if n is not None]
        if limits and len(tokens) > min(limits):
            return tokens[: min(limits)], "length"
        return tokens, "stop"

    async def _stream(
        self, send: Send, request: CompletionRequest, completion_id: str, client_gone: asyncio.Event
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
        await sleep_until(loop, first_due)
        pieces = [
            sse(head + '{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}')
        ]
        tps = self.tokens_per_second
        i, n = 0, len(tokens)
        while i < n:
            if client_gone.is_set():
                # Checked before every send: when tokens flow as fast as possible this stops
                # the very next batch, without waiting for the task to be cancelled.
                raise ClientGone
            if tps > 0:
                # Due times come from one start time, so sleeps that overrun do not add up.
                await sleep_until(loop, first_due + i / tps)
                elapsed = loop.time() - first_due
                j = min(n, max(i + 1, int(elapsed * tps) + 1))
            else:
                j = min(n, i + FAST_BATCH_TOKENS)
            for token in tokens[i:j]:
                pieces.append(
                    sse(
                        head
                        + '{"content":'
                        + json_string(token)
                        + '},"logprobs":null,"finish_reason":null}]}'
                    )
                )
            await send(
                {"type": "http.response.body", "body": encode("".join(pieces)), "more_body": True}
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
                        "body": encode("".join(pieces)),
                        "more_body": True,
                    }
                )
            drop_connection(send)
            return
        pieces.append(sse(head + f'{{}},"logprobs":null,"finish_reason":"{finish_reason}"}}]}}'))
        if request.include_usage:
            usage = usage_of(request.prompt_tokens, len(tokens))
            pieces.append(
                sse(
                    f'{{"id":"{completion_id}","object":"chat.completion.chunk","created":{created},'
                    f'"model":{json.dumps(request.model)},"system_fingerprint":"demo",'
                    f'"choices":[],"usage":{json.dumps(usage)}}}'
                )
            )
        pieces.append("data: [DONE]\n\n")
        await send(
            {"type": "http.response.body", "body": encode("".join(pieces)), "more_body": False}
        )

    async def _complete(
        self, send: Send, request: CompletionRequest, completion_id: str, client_gone: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        tokens, finish_reason = self._limit(request)
        if request.plan.cut and finish_reason == "length":
            request.plan.cut = False
        due = loop.time() + self.ttfb_ms / 1000 + request.plan.stall_seconds
        if self.tokens_per_second > 0 and tokens:
            due += (len(tokens) - 1) / self.tokens_per_second
        await sleep_until(loop, due)
        body = encode(
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
                    "usage": usage_of(request.prompt_tokens, len(tokens)),
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
            drop_connection(send)
            return
        await send({"type": "http.response.body", "body": body, "more_body": False})
        self.stats["tokens_sent"] += len(tokens)


app = DemoModel()

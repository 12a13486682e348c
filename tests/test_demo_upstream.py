"""The demo model: OpenAI-compatible, deterministic, steered by directives, stops when left."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chat.demo_upstream import (
    FAST_BATCH_TOKENS,
    ConnectionCut,
    DemoModel,
    default_reply,
    long_tokens,
    plan_answer,
    tokenize,
)
from chat.upstream.sse import SSEParser
from tests.demo_server import AppResponse, call_demo_app, running_demo_server

COMPLETIONS = "/v1/chat/completions"


@pytest.fixture(scope="module")
def demo_url() -> Iterator[str]:
    with running_demo_server(ttfb_ms=0, tps=0) as url:
        yield url


def fast_model(**kwargs: Any) -> DemoModel:
    return DemoModel(ttfb_ms=0, tokens_per_second=0, **kwargs)


def ask(
    text: str, *, model: str = "demo-full", stream: bool = True, **extra: Any
) -> dict[str, Any]:
    return {
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def chunks_of(response: AppResponse) -> list[Any]:
    """The decoded `data:` payloads of a streamed answer ("[DONE]" kept as a string)."""
    events = SSEParser().feed(response.body)
    return [event.data if event.data == "[DONE]" else json.loads(event.data) for event in events]


def text_of(chunks: list[Any]) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in chunks
        if isinstance(c, dict) and c["choices"]
    )


def content_deltas(chunks: list[Any]) -> list[str]:
    return [
        c["choices"][0]["delta"]["content"]
        for c in chunks
        if isinstance(c, dict) and c["choices"] and c["choices"][0]["delta"].get("content")
    ]


# --- routes ---------------------------------------------------------------------------------


async def test_it_lists_demo_full_and_demo_lite() -> None:
    response = await call_demo_app(fast_model(), "GET", "/v1/models")
    assert response.status == 200
    assert [m["id"] for m in response.json()["data"]] == ["demo-full", "demo-lite"]
    single = await call_demo_app(fast_model(), "GET", "/v1/models/demo-lite")
    assert single.json()["id"] == "demo-lite"


async def test_an_unknown_model_is_an_openai_style_404() -> None:
    for method, path, payload in (
        ("POST", COMPLETIONS, ask("hi", model="gpt-9")),
        ("GET", "/v1/models/gpt-9", None),
    ):
        response = await call_demo_app(fast_model(), method, path, payload)
        assert response.status == 404
        assert response.json()["error"]["code"] == "model_not_found"
        assert "gpt-9" in response.json()["error"]["message"]


async def test_any_other_request_is_a_json_404() -> None:
    for method, path in (("GET", "/v1/nothing"), ("GET", COMPLETIONS), ("POST", "/other")):
        response = await call_demo_app(fast_model(), method, path, {})
        assert response.status == 404
        assert response.headers[b"content-type"] == b"application/json"
        assert response.json()["error"]["type"] == "invalid_request_error"


async def test_it_serves_under_the_prefix_it_was_mounted_at() -> None:
    app = DemoModel(prefix="/demo/v1", ttfb_ms=0, tokens_per_second=0)
    assert (await call_demo_app(app, "GET", "/demo/v1/models")).status == 200
    assert (await call_demo_app(app, "GET", "/v1/models")).status == 404
    answer = await call_demo_app(app, "POST", "/demo/v1/chat/completions", ask("/echo mounted"))
    assert text_of(chunks_of(answer)) == "mounted"


async def test_malformed_requests_are_openai_style_400s() -> None:
    for payload in (
        [1, 2],
        {"model": "demo-full"},
        {"model": "demo-full", "messages": []},
        {"model": "demo-full", "messages": [{"content": "no role"}]},
        ask("hi", max_tokens=0),
        ask("/long many"),
        ask("/fail 200"),
        ask("/stall -1"),
        ask("/cut"),
    ):
        response = await call_demo_app(fast_model(), "POST", COMPLETIONS, payload)
        assert response.status == 400, payload
        assert response.json()["error"]["message"]


async def test_lifespan_startup_and_shutdown_complete() -> None:
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent: list[str] = []

    async def receive() -> dict[str, str]:
        return next(messages)

    async def send(message: dict[str, str]) -> None:
        sent.append(message["type"])

    await fast_model()({"type": "lifespan"}, receive, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


# --- the stream format ----------------------------------------------------------------------


async def test_a_stream_has_a_role_delta_content_a_finish_usage_and_done() -> None:
    response = await call_demo_app(
        fast_model(),
        "POST",
        COMPLETIONS,
        ask("/echo one two", stream_options={"include_usage": True}),
    )
    assert response.status == 200 and response.finished
    assert response.headers[b"content-type"].startswith(b"text/event-stream")
    chunks = chunks_of(response)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-3]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-2]["choices"] == []
    assert chunks[-2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert chunks[-1] == "[DONE]"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks[:-1])


async def test_usage_is_sent_only_when_asked_for() -> None:
    chunks = chunks_of(await call_demo_app(fast_model(), "POST", COMPLETIONS, ask("/echo x")))
    assert not any("usage" in c for c in chunks if isinstance(c, dict))
    assert chunks[-1] == "[DONE]"


async def test_every_chunk_echoes_the_requested_model_and_lite_answers_the_same_text() -> None:
    texts = {}
    for model in ("demo-full", "demo-lite"):
        chunks = chunks_of(
            await call_demo_app(fast_model(), "POST", COMPLETIONS, ask("Why?", model=model))
        )
        assert {c["model"] for c in chunks if isinstance(c, dict)} == {model}
        texts[model] = text_of(chunks)
    assert texts["demo-full"] == texts["demo-lite"]


async def test_a_non_streamed_request_gets_one_json_completion() -> None:
    response = await call_demo_app(
        fast_model(), "POST", COMPLETIONS, ask("/echo whole", stream=False)
    )
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "whole"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 1


async def test_max_tokens_cuts_the_answer_with_finish_reason_length() -> None:
    response = await call_demo_app(fast_model(), "POST", COMPLETIONS, ask("/long 50", max_tokens=7))
    chunks = chunks_of(response)
    assert text_of(chunks) == "".join(long_tokens(7))
    assert [c["choices"][0]["finish_reason"] for c in chunks if isinstance(c, dict)][-1] == "length"
    full = await call_demo_app(
        fast_model(), "POST", COMPLETIONS, ask("/long 5", stream=False, max_tokens=9)
    )
    assert full.json()["choices"][0]["finish_reason"] == "stop"


async def test_prompt_tokens_are_a_deterministic_count_of_words() -> None:
    payload = {
        "model": "demo-full",
        "stream": False,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "/echo three little words"}]},
        ],
    }
    response = await call_demo_app(fast_model(), "POST", COMPLETIONS, payload)
    assert response.json()["usage"]["prompt_tokens"] == 6
    assert response.json()["choices"][0]["message"]["content"] == "three little words"


# --- directives -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "hello",
        "two  spaces and a trailing space ",
        "line one\nline two\n\n  indented\n",
        "Grüße 世界 🎉 ZWJ👩‍👩‍👧 \u00a0nbsp",
        "averyveryverylongwordthatmustbesplitintopieces",
        "",
    ],
)
async def test_echo_answers_exactly_the_text_in_several_pieces(text: str) -> None:
    chunks = chunks_of(await call_demo_app(fast_model(), "POST", COMPLETIONS, ask("/echo " + text)))
    assert text_of(chunks) == text
    if len(text.split()) > 1 or len(text) > 12:
        assert len(content_deltas(chunks)) > 1


@given(st.text())
def test_echo_tokens_join_back_to_any_text(text: str) -> None:
    assert "".join(plan_answer("/echo " + text).tokens) == text
    assert "".join(tokenize(text)) == text


def test_echo_eats_one_separator_after_the_directive() -> None:
    assert "".join(plan_answer("/echo\nx").tokens) == "x"
    assert "".join(plan_answer("/echo\r\nx").tokens) == "x"
    assert "".join(plan_answer("/echo  x").tokens) == " x"
    assert "".join(plan_answer("/echoes x").tokens) != "x"  # not a directive at all


async def test_long_answers_n_tokens_of_text_with_paragraphs() -> None:
    chunks = chunks_of(await call_demo_app(fast_model(), "POST", COMPLETIONS, ask("/long 300")))
    deltas = content_deltas(chunks)
    assert len(deltas) == 300
    assert all(delta.endswith((" ", "\n")) for delta in deltas)
    assert "\n\n" in "".join(deltas)  # paragraphs, so it renders as markdown


async def test_markdown_answers_about_n_tokens_of_markdown_the_same_every_time() -> None:
    from chat.demo_upstream.markdown import markdown_answer

    chunks = chunks_of(await call_demo_app(fast_model(), "POST", COMPLETIONS, ask("/markdown 600")))
    text = "".join(content_deltas(chunks))
    assert text == markdown_answer(600)  # deterministic: the live-rendering bench's answer
    assert 600 <= len(content_deltas(chunks)) < 800
    assert "```" in text and "\n- " in text and "|" in text  # code, a list, a table
    assert plan_answer("/markdown 600").tokens == plan_answer("/markdown 600").tokens


def test_long_text_is_deterministic_and_one_text_cut_at_n() -> None:
    assert plan_answer("/long 40").tokens == plan_answer("/long 40").tokens
    assert plan_answer("/long 500").tokens[:40] == plan_answer("/long 40").tokens
    assert plan_answer("/long 0").tokens == []


async def test_the_same_request_always_streams_the_same_text() -> None:
    for text in ("/long 64", "How do I sort a list?", "/echo same"):
        first = await call_demo_app(fast_model(), "POST", COMPLETIONS, ask(text))
        second = await call_demo_app(fast_model(), "POST", COMPLETIONS, ask(text))
        assert content_deltas(chunks_of(first)) == content_deltas(chunks_of(second))


@pytest.mark.parametrize("status", [400, 401, 404, 429, 500, 503, 599])
async def test_fail_answers_that_status_with_an_openai_style_error(status: int) -> None:
    response = await call_demo_app(fast_model(), "POST", COMPLETIONS, ask(f"/fail {status}"))
    assert response.status == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert str(status) in error["message"]
    assert (b"retry-after" in response.headers) == (status in (429, 503))


async def test_cut_raises_when_the_server_offers_no_way_to_drop_the_socket() -> None:
    # Not daphne: the exception is what uvicorn and hypercorn answer by closing the socket.
    app = fast_model()
    response = await call_demo_app(app, "POST", COMPLETIONS, ask("/cut 5"))
    assert isinstance(response.error, ConnectionCut)
    assert not response.finished
    assert content_deltas(chunks_of(response)) == long_tokens(5)
    assert app.stats["active"] == 0


async def test_cut_on_daphne_drops_the_connection_after_n_tokens(demo_url: str) -> None:
    received: list[bytes] = []
    async with httpx.AsyncClient(trust_env=False) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream(
                "POST", demo_url + "/chat/completions", json=ask("/cut 4")
            ) as r:
                async for chunk in r.aiter_bytes():
                    received.append(chunk)
    events = SSEParser().feed(b"".join(received))
    deltas = [json.loads(e.data)["choices"][0]["delta"].get("content") for e in events]
    assert [d for d in deltas if d] == long_tokens(4)
    assert all(e.data != "[DONE]" for e in events)


async def test_stall_then_answers_the_rest_of_the_message() -> None:
    chunks = chunks_of(
        await call_demo_app(fast_model(), "POST", COMPLETIONS, ask("/stall 0.01 /echo late"))
    )
    assert text_of(chunks) == "late"
    assert plan_answer("/stall 1.5").stall_seconds == 1.5
    assert plan_answer("/stall 1 /stall 2 /long 3").stall_seconds == 3


async def test_a_stall_sends_no_token_before_it_ends() -> None:
    # The client leaves right after the headers; a 60 s stall means no token may have gone out.
    app = fast_model()
    response = await call_demo_app(
        app, "POST", COMPLETIONS, ask("/stall 60 /long 5"), disconnect_after_body_messages=0
    )
    assert response.status == 200
    assert response.body_messages == []
    assert app.stats["tokens_sent"] == 0
    assert app.stats["cancelled"] == 1


async def test_without_a_directive_it_answers_friendly_markdown_about_the_question() -> None:
    text = text_of(
        chunks_of(await call_demo_app(fast_model(), "POST", COMPLETIONS, ask("How *do* I sort?")))
    )
    assert text == default_reply("How *do* I sort?")
    assert text.startswith("## ")
    assert "**" in text and "\n- " in text and "```python\n" in text
    assert "How \\*do\\* I sort?" in text  # quoted, with markdown escaped


async def test_only_the_last_user_message_is_read_for_directives() -> None:
    payload = {
        "model": "demo-full",
        "stream": True,
        "messages": [
            {"role": "user", "content": "/fail 500"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "/echo fine"},
        ],
    }
    response = await call_demo_app(fast_model(), "POST", COMPLETIONS, payload)
    assert text_of(chunks_of(response)) == "fine"


# --- pacing and stopping --------------------------------------------------------------------


async def test_as_fast_as_possible_batches_many_tokens_per_send() -> None:
    response = await call_demo_app(fast_model(), "POST", COMPLETIONS, ask("/long 1000"))
    assert len(content_deltas(chunks_of(response))) == 1000
    assert len(response.body_messages) <= 1000 // FAST_BATCH_TOKENS + 2


async def test_a_paced_stream_still_sends_every_token_once_in_order() -> None:
    app = DemoModel(ttfb_ms=0, tokens_per_second=5000)
    response = await call_demo_app(app, "POST", COMPLETIONS, ask("/long 200"))
    assert content_deltas(chunks_of(response)) == long_tokens(200)
    assert app.stats == {
        "started": 1,
        "completed": 1,
        "cancelled": 0,
        "active": 0,
        "tokens_sent": 200,
    }


async def test_a_client_that_leaves_stops_the_generation_at_once() -> None:
    app = fast_model()
    response = await call_demo_app(
        app, "POST", COMPLETIONS, ask("/long 200000"), disconnect_after_body_messages=3
    )
    assert app.stats["cancelled"] == 1
    assert app.stats["completed"] == 0
    assert app.stats["active"] == 0
    # The generation checks for the disconnect before every send: nothing after the third.
    assert app.stats["tokens_sent"] == 3 * FAST_BATCH_TOKENS
    assert response.sends_after_disconnect == 0
    assert not response.finished


def test_speeds_come_from_the_environment_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEMO_TTFB_MS", raising=False)
    monkeypatch.delenv("DEMO_TOKENS_PER_SECOND", raising=False)
    assert (DemoModel().ttfb_ms, DemoModel().tokens_per_second) == (150, 40.0)
    monkeypatch.setenv("DEMO_TTFB_MS", "7")
    monkeypatch.setenv("DEMO_TOKENS_PER_SECOND", "0")
    assert (DemoModel().ttfb_ms, DemoModel().tokens_per_second) == (7, 0.0)
    assert DemoModel(ttfb_ms=1, tokens_per_second=2).ttfb_ms == 1
    monkeypatch.setenv("DEMO_TOKENS_PER_SECOND", "fast")
    with pytest.raises(ValueError, match="DEMO_TOKENS_PER_SECOND"):
        DemoModel()


# --- the standalone server, with real clients -----------------------------------------------


def test_the_official_openai_client_streams_from_it_and_gets_usage(demo_url: str) -> None:
    client = openai.OpenAI(base_url=demo_url, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="demo-lite",
        messages=[{"role": "user", "content": "/echo Hello, 世界!\nBye."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello, 世界!\nBye."
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert {c.model for c in chunks} == {"demo-lite"}
    assert [c.id for c in client.models.list()] == ["demo-full", "demo-lite"]
    client.close()


def test_the_official_openai_client_sees_fail_statuses(demo_url: str) -> None:
    client = openai.OpenAI(base_url=demo_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(
            model="demo-full", messages=[{"role": "user", "content": "/fail 429"}]
        )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    completion = client.chat.completions.create(
        model="demo-full", messages=[{"role": "user", "content": "/long 3"}]
    )
    assert completion.choices[0].message.content == "".join(long_tokens(3))
    client.close()


def test_it_starts_standalone_on_the_port_it_is_given() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with running_demo_server(port=port) as url:
        assert url == f"http://127.0.0.1:{port}/v1"
        assert httpx.get(url + "/models", trust_env=False).json()["data"][0]["id"] == "demo-full"

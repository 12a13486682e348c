"""A model server's error text never reaches a user: a real daphne whose model server (a real
HTTP server started here) fails with masked API keys, internal host names and tracebacks in its
errors. The user reads plain words for the kind of failure, on the socket and on the page; the
operator finds the server's own words in the log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.servers import migrated_sqlite, signup
from tests.test_daphne import (
    chat_socket,
    daphne_instance,
    new_username,
    read_answer,
    ready,
    send_prompt,
)
from tests.test_reliability_upstream import SSE_HEAD, _delta, _event

KEY_FRAGMENT = "sk-proj-Ab12****************************wxYZ"
INTERNAL_HOST = "gpu-node-7.internal.corp"
SECRETS = (KEY_FRAGMENT, INTERNAL_HOST, "10.0.3.17", "hunter2", "/srv/vllm", "Traceback")


def _response(status: str, content_type: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


# What real model servers and the proxies in front of them have answered, secrets included.
FAILURES: dict[str, tuple[bytes, str]] = {
    "bad_key": (
        _response(
            "401 Unauthorized",
            "application/json",
            json.dumps(
                {
                    "error": {
                        "message": f"Incorrect API key provided: {KEY_FRAGMENT}. You can find "
                        "your API key at https://platform.openai.com/account/api-keys.",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    }
                }
            ).encode(),
        ),
        "refused this site's request",
    ),
    "proxy_502": (
        _response(
            "502 Bad Gateway",
            "text/html",
            f"<html><body>connect error: {INTERNAL_HOST}:8443 (10.0.3.17)</body></html>".encode(),
        ),
        "had a problem and could not answer",
    ),
    "traceback_500": (
        _response(
            "500 Internal Server Error",
            "application/json",
            json.dumps(
                {
                    "detail": 'Traceback (most recent call last): File "/srv/vllm/engine.py", '
                    "line 7: cannot reach postgres://vllm:hunter2@db.internal:5432"
                }
            ).encode(),
        ),
        "had a problem and could not answer",
    ),
    "error_event": (
        SSE_HEAD
        + _delta("Hello ")
        + _event({"error": {"message": f"worker {INTERNAL_HOST} died; key {KEY_FRAGMENT}"}}),
        "reported an error while answering",
    ),
}


async def serve_failure(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"content-length:\s*(\d+)", head, re.IGNORECASE)
        body = await reader.readexactly(int(length.group(1))) if length else b""
        if head.startswith(b"GET"):  # the app warming its pool
            writer.write(_response("200 OK", "application/json", b'{"data": []}'))
        else:
            mode = json.loads(body)["messages"][-1]["content"].split()[-1]
            writer.write(FAILURES[mode][0])
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest.fixture
async def leaky_upstream() -> AsyncIterator[str]:
    server = await asyncio.start_server(serve_failure, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


async def test_a_model_servers_error_text_reaches_the_log_and_never_the_user(
    leaky_upstream: str,
) -> None:
    database = migrated_sqlite(Path(tempfile.mkdtemp(prefix="chatsite-leaky-")))
    with daphne_instance("web1", database_url=database, LLM_BASE_URL=leaky_upstream) as server:
        client = await asyncio.to_thread(signup, server.base, new_username())
        async with chat_socket(server.base, client) as ws:
            await ready(ws)
            for mode, (_, plain) in FAILURES.items():
                await send_prompt(ws, f"please fail {mode}")
                answer = await read_answer(ws)
                assert answer.done is not None and answer.done["status"] == "failed", mode
                assert plain in answer.done["error"], (mode, answer.done["error"])
                everything = json.dumps(answer.done) + "".join(answer.html)
                for secret in SECRETS:
                    assert secret not in everything, (mode, secret)
        # The pages, reloaded (each prompt began a conversation): every failed answer shows
        # its plain message and no secret.
        home = await asyncio.to_thread(client.get, "/")
        links = sorted(set(re.findall(r'href="(/c/[0-9a-f-]{36}/)"', home.text)))
        assert len(links) == len(FAILURES)
        pages = "".join([(await asyncio.to_thread(client.get, link)).text for link in links])
        for _, plain in FAILURES.values():
            assert plain in pages.replace("&#x27;", "'")
        for secret in SECRETS:
            assert secret not in pages, secret
        # The operator can still see what the model server said.
        log = server.log()
        for secret in (KEY_FRAGMENT, INTERNAL_HOST, "hunter2"):
            assert secret in log, secret

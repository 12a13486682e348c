"""The built-in demo model is public only where it is the model: mounted when LLM_BASE_URL names
it (or in DEBUG), behind the host check; elsewhere /demo/v1/ is Django's 404."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.demo_server import running_demo_server
from tests.servers import running_chatsite, signup
from tests.test_daphne import chat_socket, new_username, read_answer, ready, send_prompt

COMPLETION = {
    "model": "demo-full",
    "stream": False,
    "messages": [{"role": "user", "content": "/echo free tokens"}],
}


def ask_demo(base: str, host: str | None = None) -> httpx.Response:
    headers = {"Host": host} if host else {}
    return httpx.post(f"{base}/demo/v1/chat/completions", json=COMPLETION, headers=headers)


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[str]:
    """A model server that is not this site (the standalone demo model stands in for one)."""
    with running_demo_server(ttfb_ms=0, tps=0) as url:
        yield url


async def test_a_site_whose_model_is_elsewhere_does_not_serve_the_demo_model(
    elsewhere: str,
) -> None:
    with running_chatsite(LLM_BASE_URL=elsewhere) as base:
        # What the review did: anonymous completions from a production site.
        async with httpx.AsyncClient(base_url=base) as http:
            responses = [
                await http.post("/demo/v1/chat/completions", json=COMPLETION),
                await http.get("/demo/v1/models"),
            ]
        for response in responses:
            assert response.status_code == 404
            assert "free tokens" not in response.text and "demo-full" not in response.text
        # The site itself works, answered by its real model.
        client = signup(base, new_username())
        async with chat_socket(base, client) as ws:
            await ready(ws)
            await send_prompt(ws, "/echo from the configured model")
            answer = await read_answer(ws)
        assert answer.text == "from the configured model"


def test_in_debug_the_demo_model_is_served_whatever_the_model(elsewhere: str) -> None:
    with running_chatsite(LLM_BASE_URL=elsewhere, DJANGO_DEBUG="1") as base:
        assert ask_demo(base).status_code == 200


def test_demo_mount_off_takes_it_away_even_where_it_is_the_model() -> None:
    with running_chatsite(DEMO_MOUNT="off") as base:
        assert ask_demo(base).status_code == 404


def test_where_the_demo_is_the_model_it_answers_only_hosts_this_site_serves() -> None:
    with running_chatsite(DJANGO_ALLOWED_HOSTS="chat.example.com") as base:
        # A name that is neither an allowed host nor the one LLM_BASE_URL calls us by.
        refused = ask_demo(base, host="evil.example")
        assert refused.status_code == 400
        assert "free tokens" not in refused.text
        # The app calls itself by LLM_BASE_URL's name (127.0.0.1), which is not a public host
        # here: its own turns still get answers.
        assert ask_demo(base).status_code == 200

"""A 10,000-message conversation on a real daphne, on PostgreSQL and on SQLite (issue 13,
finding 17): the page is its latest window, "Load earlier messages" pages back (and 404s for
someone else), a prompt and a regeneration send frames that do not grow with the thread and a
history that stops at the model's context, and an edit deep in history shows the right
branch. The recursive walk's SQL is the part that differs between the backends."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chat.tokens import chars_to_tokens
from tests.long_conversation import text_of
from tests.servers import ROOT, base_env, migrated_sqlite, signup
from tests.test_daphne import (
    chat_socket,
    daphne_instance,
    fresh_postgres_database,
    needs_postgres,
    new_username,
    read_answer,
    ready,
)

pytestmark = pytest.mark.timeout(600)

LONG = 10_000
PAGE_BYTES = 200_000  # the whole thread was 7.7 MB
FRAME_BYTES = 5_000  # a regeneration's frame was 7.7 MB per socket
CONTEXT_CHARS = 24_000  # LLM_CONTEXT_CHARS's default


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=needs_postgres)])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    if request.param == "sqlite":
        database_url = migrated_sqlite(Path(tmp_path_factory.mktemp("paging")))
        with daphne_instance("web1", database_url=database_url) as instance:
            yield instance.base, database_url
    else:
        with (
            fresh_postgres_database("chatsite_paging") as database_url,
            daphne_instance("web1", database_url=database_url) as instance,
        ):
            yield instance.base, database_url


def seed(database_url: str, username: str, messages: int = LONG, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tests.long_conversation", username, str(messages), *extra],
        cwd=ROOT,
        env=base_env(DATABASE_URL=database_url),
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def shown(html: str) -> list[int]:
    seen: list[int] = []
    for n in re.findall(r"(?:prompt|answer) message (\d{5})\.", html):
        if not seen or seen[-1] != int(n):
            seen.append(int(n))
    return seen


def mid_of(html: str, i: int) -> str:
    """The mid of seeded message `i` in a page (the article that holds its text)."""
    for article in re.findall(r"<article .*?</article>", html, flags=re.S):
        if text_of(i).split(" Some")[0] in article:
            found = re.search(r'data-mid="([^"]+)"', article)
            assert found is not None
            return found.group(1)
    raise AssertionError(f"message {i} is not on the page")


def test_the_page_and_load_earlier_are_windows_and_someone_elses_is_404(server: tuple) -> None:
    base, database_url = server
    username = new_username()
    client = signup(base, username)
    conversation = seed(database_url, username)
    page = client.get(f"/c/{conversation}/")
    assert page.status_code == 200 and len(page.content) < PAGE_BYTES, len(page.content)
    assert shown(page.text) == list(range(LONG - 50, LONG))
    before = re.search(r"\?before=([^\"&]+)", page.text)
    assert before is not None
    earlier = client.get(f"/c/{conversation}/messages/", params={"before": before.group(1)})
    assert earlier.status_code == 200
    assert shown(earlier.text) == list(range(LONG - 100, LONG - 50))
    assert "Load earlier messages" in earlier.text
    # Another user: the conversation does not exist for them, whatever the message.
    stranger = signup(base, new_username())
    url = f"/c/{conversation}/messages/"
    assert stranger.get(url, params={"before": before.group(1)}).status_code == 404
    assert stranger.get(f"/c/{conversation}/").status_code == 404
    # A conversation stored before leaves were (no leaf): its newest message ends the branch,
    # found by a subquery inside the walk (the conversation's id as each backend stores it).
    legacy = seed(database_url, username, 120, "--no-leaf")
    assert shown(client.get(f"/c/{legacy}/").text) == list(range(70, 120))


async def test_prompt_regenerate_and_a_deep_edit_send_only_what_changed(server: tuple) -> None:
    base, database_url = server
    username = new_username()
    client = signup(base, username)
    conversation = seed(database_url, username)
    page = client.get(f"/c/{conversation}/").text
    async with chat_socket(base, client) as ws:
        await ready(ws)
        await ws.send(
            json.dumps({"type": "prompt", "conversation": conversation, "text": "/echo next"})
        )
        prompt = await read_answer(ws, timeout=60)
        assert prompt.done is not None and prompt.done["status"] == "complete", prompt.errors
        first_frame = prompt.html[0]
        assert len(first_frame) < FRAME_BYTES, len(first_frame)
        assert "data-fork-after" not in first_frame  # a plain append
        # Upstream got what fits the model's context, not 10,000 messages.
        assert prompt.done["usage"]["prompt_tokens"] <= chars_to_tokens(CONTEXT_CHARS) + 200

        await ws.send(json.dumps({"type": "regenerate", "mid": prompt.mid}))
        again = await read_answer(ws, timeout=60)
        assert again.done is not None and again.done["status"] == "complete", again.errors
        fork = again.html[0]
        assert len(fork) < FRAME_BYTES, len(fork)
        assert 'data-fork-after="' in fork and "2 / 2" in fork
        assert shown(fork) == []  # none of the thread's messages

        # An edit of message 5,000: the frame says the branch goes on from message 4,999.
        deep, above = mid_of_deep(client, conversation, page)
        await ws.send(
            json.dumps(
                {
                    "type": "prompt",
                    "conversation": conversation,
                    "text": "/echo edited deep",
                    "replaces": deep,
                }
            )
        )
        edit = await read_answer(ws, timeout=60)
        assert edit.done is not None and edit.done["status"] == "complete", edit.errors
        assert f'data-fork-after="{above}"' in edit.html[0] and len(edit.html[0]) < FRAME_BYTES
    # The branch on show is the edit's: up to message 4,999, the new prompt and its answer.
    page = client.get(f"/c/{conversation}/").text
    assert shown(page) == list(range(4999 - 47, 5000))
    assert "/echo edited deep" in page and "edited deep" in page
    assert "1 / 2" not in page and "2 / 2" in page


def mid_of_deep(client: object, conversation: str, page: str) -> tuple[str, str]:
    """The mids of messages 5,000 (a prompt) and 4,999, paging back from the page as a
    person would: each "Load earlier messages" is one more window."""
    # The last two windows: messages 4,999 and 5,000 may lie on either side of a seam.
    previous, html = "", page
    while not {4999, 5000} <= set(shown(html + previous)):
        before = re.search(r"\?before=([^\"&]+)", html)
        assert before is not None
        window = client.get(  # type: ignore[attr-defined]
            f"/c/{conversation}/messages/", params={"before": before.group(1)}
        )
        previous, html = html, window.text
    both = html + previous
    return mid_of(both, 5000), mid_of(both, 4999)

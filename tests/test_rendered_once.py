"""An answer is rendered at most once (issue 19's review, finding 1): its HTML is stored when it
ends, and an answer whose HTML is empty (markdown made only of link reference definitions) is
stored as "" and shown as it is. Only NULL means "not rendered": such an answer (saved before
its HTML was stored, or whose rendering failed) is rendered on its first showing and stored.

Through the real ASGI app and the demo model; the renderer is wrapped (and still called) to
count how often it runs. On PostgreSQL and over daphne: tests/test_rendered_once_servers.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from markdown_it import MarkdownIt

from chat import branches
from chat.models import Message
from tests.conftest import receive_until_done

pytestmark = pytest.mark.usefixtures("chat_settings")

# Renders to nothing: a link reference definition defines a link and shows nothing.
ONLY_DEFINITIONS = "[a]: http://x"


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text the page's renderer is asked to render (it still renders them)."""
    seen: list[str] = []
    real = branches.render_markdown

    def counting(text: str) -> str:
        seen.append(text)
        return real(text)

    monkeypatch.setattr(branches, "render_markdown", counting)
    return seen


def load_page(user: Any, conversation_id: Any) -> tuple[str, list[str]]:
    """The conversation's page, and the SQL it ran."""
    client = Client()
    client.force_login(user)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/c/{conversation_id}/")
    assert response.status_code == 200
    return response.content.decode(), [q["sql"] for q in queries.captured_queries]


async def ask(connect: Any, user: Any, text: str) -> Message:
    comm = await connect(user)
    await comm.send_to(text_data=json.dumps({"type": "prompt", "conversation": "", "text": text}))
    result = await receive_until_done(comm)
    assert result["done"]["status"] == "complete"
    return await database_sync_to_async(Message.objects.get)(mid=result["done"]["mid"])


async def test_an_answer_that_renders_empty_is_stored_empty_and_never_rendered_again(
    connect: Any, owner: Any, renders: list[str]
) -> None:
    answer = await ask(connect, owner, f"/echo {ONLY_DEFINITIONS}")
    assert answer.text == ONLY_DEFINITIONS
    assert answer.html == ""  # rendered, and empty: not NULL
    for _ in range(2):
        page, sql = await database_sync_to_async(load_page)(owner, answer.conversation_id)
        assert f'data-mid="{answer.mid}"' in page
        assert renders == []  # before the fix, every page load rendered it again
        assert not [s for s in sql if s.startswith("UPDATE")]


async def test_an_answer_not_rendered_yet_is_rendered_on_its_first_showing_only(
    connect: Any, owner: Any, renders: list[str]
) -> None:
    answer = await ask(connect, owner, "/echo Some **bold** words")
    stored = answer.html
    assert stored and "<strong>bold</strong>" in stored
    # As a row saved before answers stored their HTML (or whose rendering failed) is.
    await database_sync_to_async(Message.objects.filter(pk=answer.pk).update)(html=None)
    first, _ = await database_sync_to_async(load_page)(owner, answer.conversation_id)
    assert renders == [answer.text] and "<strong>bold</strong>" in first
    await database_sync_to_async(answer.refresh_from_db)()
    assert answer.html == stored  # stored on that first showing
    second, sql = await database_sync_to_async(load_page)(owner, answer.conversation_id)
    assert renders == [answer.text]  # nothing rendered the second time
    assert not [s for s in sql if s.startswith("UPDATE")]
    assert "<strong>bold</strong>" in second


async def test_an_empty_answer_not_rendered_yet_is_stored_empty_once(
    connect: Any, owner: Any, renders: list[str]
) -> None:
    answer = await ask(connect, owner, f"/echo {ONLY_DEFINITIONS}")
    await database_sync_to_async(Message.objects.filter(pk=answer.pk).update)(html=None)
    for _ in range(3):
        await database_sync_to_async(load_page)(owner, answer.conversation_id)
    assert renders == [ONLY_DEFINITIONS]
    await database_sync_to_async(answer.refresh_from_db)()
    assert answer.html == ""


async def test_resuming_a_finished_answer_sends_its_stored_html_without_rendering_markdown(
    connect: Any, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13, finding 6: a `resume` of a long finished answer rendered its markdown again
    each time, on the thread that serves every socket's database work. Now it sends the HTML
    stored when the answer ended: with markdown parsing and rendering made to fail, a resume
    still succeeds, twice, with exactly the stored HTML."""
    answer = await ask(connect, owner, "Show me what you can render")  # a list and code
    stored = answer.html
    assert stored and "<li>" in stored and "<pre" in stored

    def no_markdown(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("markdown was parsed or rendered again for a finished answer")

    # Every markdown-it instance (the answer renderer and the live block parser alike).
    monkeypatch.setattr(MarkdownIt, "render", no_markdown)
    monkeypatch.setattr(MarkdownIt, "parse", no_markdown)
    comm = await connect(owner)
    for _ in range(2):
        await comm.send_to(text_data=json.dumps({"type": "resume", "mid": answer.mid, "after": 3}))
        html = await comm.receive_from(timeout=10)
        assert not html.startswith("{") and f'data-mid="{answer.mid}"' in html
        assert stored in html
        done = json.loads(await comm.receive_from(timeout=10))
        assert done["type"] == "done" and done["mid"] == answer.mid
        assert done["status"] == "complete"
        while not await comm.receive_nothing(timeout=0.3):  # its title, today's tokens left
            await comm.receive_from(timeout=10)

"""An answer is rendered at most once (issue 19's review, finding 1), on SQLite and on
PostgreSQL: the migration that makes NULL mean "not rendered" keeps every row's meaning, a real
turn's end stores an empty rendering as "" (the end-of-turn statements of issue 18 on each
backend), and a page load stores the rendering of an answer that had none."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.servers import ROOT, base_env, migrated_sqlite, signup
from tests.test_daphne import (
    chat_socket,
    daphne_instance,
    fresh_postgres_database,
    needs_postgres,
    new_username,
    read_answer,
    ready,
    send_prompt,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=needs_postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated database of either backend."""
    if request.param == "sqlite":
        yield migrated_sqlite(tmp_path)
    else:
        with fresh_postgres_database("chatsite_rendered") as url:
            yield url


def run_sql(database_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """One statement, straight on the database (%s placeholders on both backends)."""
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            return conn.execute(query.replace("%s", "?"), params).fetchall()
    with psycopg.connect(database_url, autocommit=True) as pg:
        cursor = pg.execute(query, params)
        return cursor.fetchall() if cursor.description else []


# Back to the migration before, rows as each kind was stored then, forward again; then back
# once more (the reverse migration), printing the html column after each.
MIGRATION_SCRIPT = """
import json
from django.core.management import call_command
from chat.models import Conversation, Message
from django.contrib.auth import get_user_model

call_command("migrate", "chat", "0013", verbosity=0)
user = get_user_model().objects.create_user("migrated")
conversation = Conversation.objects.create(user=user)
rows = {
    "prompt": dict(role="user", text="hi", html="", status="complete"),
    "rendered": dict(role="assistant", text="**b**", html="<p><strong>b</strong></p>\\n",
                     status="complete"),
    "not_rendered": dict(role="assistant", text="**b**", html="", status="stopped"),
    "empty_answer": dict(role="assistant", text="", html="", status="failed"),
    "streaming": dict(role="assistant", text="so far", html="", status="streaming"),
}
for mid, fields in rows.items():
    Message.objects.create(mid=mid, conversation=conversation, **fields)
def html():
    return dict(Message.objects.values_list("mid", "html"))
call_command("migrate", "chat", verbosity=0)
forward = html()
call_command("migrate", "chat", "0013", verbosity=0)
print(json.dumps({"forward": forward, "back": html()}))
"""


def test_the_migration_keeps_what_each_stored_html_meant(database_url: str) -> None:
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", MIGRATION_SCRIPT],
        cwd=ROOT,
        env=base_env(DATABASE_URL=database_url),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["forward"] == {
        "prompt": None,
        "rendered": "<p><strong>b</strong></p>\n",
        "not_rendered": None,  # rendered (and stored) when next shown
        "empty_answer": "",  # a finished answer with no text renders to "": done
        "streaming": None,
    }
    back = {**result["forward"], "prompt": "", "not_rendered": "", "streaming": ""}
    assert result["back"] == back


async def real_answer(base: str, client: httpx.Client, text: str) -> tuple[str, str]:
    """(mid, conversation id) of a real answer over a real socket."""
    async with chat_socket(base, client) as ws:
        await ready(ws)
        await send_prompt(ws, text)
        answer = await read_answer(ws)
    assert answer.done is not None and answer.done["status"] == "complete", answer.done
    assert answer.mid is not None
    found = re.search(r'id="conversation-id" value="([0-9a-f-]{36})"', "".join(answer.html))
    assert found is not None
    return answer.mid, found.group(1)


def stored_html(database_url: str, mid: str) -> str | None:
    [(html,)] = run_sql(database_url, "SELECT html FROM chat_message WHERE mid = %s", mid)
    return html  # type: ignore[no-any-return]


def test_a_real_turn_stores_an_empty_rendering_and_a_page_stores_a_missing_one(
    database_url: str,
) -> None:
    with daphne_instance("web1", database_url=database_url) as instance:
        client = signup(instance.base, new_username())
        empty, conversation = asyncio.run(real_answer(instance.base, client, "/echo [a]: http://x"))
        assert stored_html(database_url, empty) == ""  # rendered, empty: not NULL
        bold, other = asyncio.run(real_answer(instance.base, client, "/echo Some **bold**"))
        stored = stored_html(database_url, bold)
        assert stored is not None and "<strong>bold</strong>" in stored
        # As an answer stored before its HTML was (or whose rendering failed) is.
        run_sql(database_url, "UPDATE chat_message SET html = NULL WHERE mid = %s", bold)
        page = client.get(f"/c/{other}/")
        assert page.status_code == 200 and "<strong>bold</strong>" in page.text
        assert stored_html(database_url, bold) == stored  # stored by that page load
        assert client.get(f"/c/{conversation}/").status_code == 200
        assert stored_html(database_url, empty) == ""

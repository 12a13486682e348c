"""Feedback, export and share on a real daphne, on PostgreSQL and on SQLite: a real answer (with
characters beyond ASCII) voted on, exported, shared, read logged out and unshared. What is
stored (a vote, a JSON snapshot) goes through each backend's own types."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import migrated_sqlite, signup
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
ECHO = "Zürich 🌈 «quotes» and <b>markup</b>"


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=needs_postgres)])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    if request.param == "sqlite":
        database_url = migrated_sqlite(Path(tmp_path_factory.mktemp("sharing")))
        with daphne_instance("web1", database_url=database_url) as instance:
            yield instance.base
    else:
        with (
            fresh_postgres_database("chatsite_sharing") as database_url,
            daphne_instance("web1", database_url=database_url) as instance,
        ):
            yield instance.base


def csrf(client: httpx.Client) -> dict[str, str]:
    return {"X-CSRFToken": client.cookies["csrftoken"], "HX-Request": "true"}


async def real_answer(server: str, client: httpx.Client) -> tuple[str, str]:
    """Ask the demo model over a real socket: (the answer's mid, the new conversation's id)."""
    async with chat_socket(server, client) as ws:
        await ready(ws)
        await send_prompt(ws, f"/echo {ECHO}")
        answer = await read_answer(ws)
    assert answer.done is not None and answer.done["status"] == "complete"
    assert answer.mid is not None
    conversation = re.search(r'id="conversation-id" value="([0-9a-f-]{36})"', "".join(answer.html))
    assert conversation is not None
    return answer.mid, conversation.group(1)


def test_vote_export_share_and_unshare_a_real_answer(server: str) -> None:
    client = signup(server, new_username())
    mid, cid = asyncio.run(real_answer(server, client))

    vote = client.post(
        f"/m/{mid}/feedback/",
        data={"value": "down", "comment": "Ça ne va pas 🙁"},
        headers=csrf(client),
    )
    assert vote.status_code == 200 and 'aria-pressed="true">👎' in vote.text

    document = client.get(f"/c/{cid}/export.json").json()
    exported = document["conversation"]["messages"][1]
    assert exported["text"] == ECHO and exported["usage"]["completion_tokens"] > 0
    assert ECHO in client.get(f"/c/{cid}/export.md").text
    account = client.get("/settings/export.json").json()
    assert account["feedback"][0]["comment"] == "Ça ne va pas 🙁"

    shared = client.post(f"/c/{cid}/share/", headers=csrf(client))
    path = re.search(r'href="(/s/[A-Za-z0-9_-]{43}/)"', shared.text)
    assert path is not None
    with httpx.Client(base_url=server) as stranger:
        page = stranger.get(path.group(1))
        assert page.status_code == 200 and page.headers["x-robots-tag"].startswith("noindex")
        assert "Zürich 🌈 «quotes» and &lt;b&gt;markup&lt;/b&gt;" in page.text  # escaped
        unshared = client.post(f"/c/{cid}/unshare/", headers=csrf(client))
        assert unshared.status_code == 200
        assert stranger.get(path.group(1)).status_code == 404
    # Someone else: nothing of it exists for them.
    other = signup(server, new_username())
    for url in (f"/c/{cid}/export.json", f"/c/{cid}/export.md"):
        assert other.get(url).status_code == 404
    assert other.post(f"/c/{cid}/share/", headers=csrf(other)).status_code == 404
    assert (
        other.post(f"/m/{mid}/feedback/", data={"value": "up"}, headers=csrf(other))
    ).status_code == 404
    assert json.loads(other.get("/settings/export.json").text)["conversations"] == []

"""Device tiers are advisory; a plan that forbids the full model is not (issue 13.10).

The review's phone sent `Sec-CH-UA-Mobile: ?0` (what Chrome's "Request desktop site" sends)
and got the full model. Any client can send any User-Agent and client hints, and the
`chat_tier` cookie, so the device decides only where a plan leaves it to the device. These
tests attack over real sockets to a real daphne on PostgreSQL with every device signal
claiming a desktop, and read what answered from the database.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest
from websockets.asyncio.client import ClientConnection, connect

from chat.limits.plans import LIMITS_CACHE_SECONDS
from tests.servers import ROOT, base_env, running_chatsite
from tests.test_daphne import fresh_postgres_database, query_one, read_answer, ready, ws_url

PASSWORD = "a-long-test-passphrase-42"
PHONE_UA = (
    "Mozilla/5.0 (Linux; Android 14; Pixel 7) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Mobile Safari/537.36"
)
DESKTOP_UA = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36"
)
# Every way a client can claim a desktop, or ask for the full model, at once.
DESKTOP_CLAIMS = {"Sec-CH-UA-Mobile": "?0", "Cookie": "chat_tier=full"}

SETUP = f"""
from django.contrib.auth.models import User
from chat.models import Plan, Quota
lite_only = Plan.objects.create(name="Lite only", full_model_allowed=False,
                                allow_full_on_mobile=True)
full = Plan.objects.create(name="Full", full_model_allowed=True, allow_full_on_mobile=True)
later = Plan.objects.create(name="Full for now", full_model_allowed=True)
for name, plan in (("limited", lite_only), ("paying", full), ("upgraded", later)):
    Quota.objects.create(user=User.objects.create_user(name, password={PASSWORD!r}), plan=plan)
"""


@dataclass(frozen=True)
class Site:
    base: str
    database_url: str


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with fresh_postgres_database() as database_url:
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", SETUP],
            cwd=ROOT,
            env=base_env(DATABASE_URL=database_url),
            check=True,
            capture_output=True,
        )
        with running_chatsite(database_url=database_url) as base:
            yield Site(base, database_url)


def session_of(base: str, username: str) -> str:
    """Log in through the real form; the session cookie."""
    with httpx.Client(base_url=base, timeout=30, trust_env=False) as client:
        client.get("/accounts/login/")
        response = client.post(
            "/accounts/login/",
            data={
                "username": username,
                "password": PASSWORD,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
        )
        assert response.status_code == 302, response.text[:300]
        return str(client.cookies["sessionid"])


@asynccontextmanager
async def socket_as(base: str, session: str, user_agent: str) -> AsyncIterator[ClientConnection]:
    """A socket whose handshake carries the session and every desktop claim."""
    headers = {
        "Sec-CH-UA-Mobile": DESKTOP_CLAIMS["Sec-CH-UA-Mobile"],
        "Cookie": f"sessionid={session}; {DESKTOP_CLAIMS['Cookie']}",
    }
    async with connect(
        ws_url(base),
        origin=base,  # type: ignore[arg-type]
        additional_headers=headers,
        user_agent_header=user_agent,
        proxy=None,
        open_timeout=10,
    ) as ws:
        yield ws


async def answered_by(
    ws: ClientConnection, database_url: str, text: str, *, model: str | None = None
) -> tuple[Any, ...]:
    """Send a prompt (asking for `model` by name, if given); (model, tier) stored for it."""
    frame = {"type": "prompt", "conversation": "", "text": text}
    if model:
        frame["model"] = model
    await ws.send(json.dumps(frame))
    answer = await read_answer(ws)
    assert answer.done is not None and answer.done["status"] == "complete", answer
    row = query_one(database_url, "SELECT model, tier FROM chat_message WHERE mid = %s", answer.mid)
    assert row is not None
    return row


async def refuses_the_full_model(ws: ClientConnection) -> bool:
    """A prompt that asks for the full model by name is refused (issue 17.1: `bad_request`,
    never sent upstream), not answered by it."""
    frame = {"type": "prompt", "conversation": "", "text": "/echo hi", "model": "demo-full"}
    await ws.send(json.dumps(frame))
    while True:
        raw = await asyncio.wait_for(ws.recv(), 20)
        if isinstance(raw, str) and raw.startswith("{"):
            reply = json.loads(raw)
            return bool(reply["type"] == "error" and reply["code"] == "bad_request")


@pytest.mark.parametrize("user_agent", [PHONE_UA, DESKTOP_UA], ids=["phone", "desktop"])
async def test_a_plan_without_the_full_model_gets_lite_whatever_the_device_claims(
    site: Site, user_agent: str
) -> None:
    session = session_of(site.base, "limited")
    async with socket_as(site.base, session, user_agent) as ws:
        hello = await ready(ws)
        assert (hello["tier"], hello["model"]) == ("lite", "demo-lite")
        assert [m["id"] for m in hello["models"]] == ["demo-lite"]
        assert await refuses_the_full_model(ws)
        assert await answered_by(ws, site.database_url, "/echo hi") == ("demo-lite", "lite")


@pytest.mark.parametrize("user_agent", [PHONE_UA, DESKTOP_UA], ids=["phone", "desktop"])
def test_the_page_says_lite_for_such_a_plan_and_offers_no_full(site: Site, user_agent: str) -> None:
    with httpx.Client(base_url=site.base, timeout=30, trust_env=False) as client:
        client.cookies.set("sessionid", session_of(site.base, "limited"))
        client.cookies.set("chat_tier", "full")
        page = client.get("/", headers={"User-Agent": user_agent, "Sec-CH-UA-Mobile": "?0"})
    assert 'id="tier-badge" class="tier-badge" data-tier="lite"' in page.text
    assert "Your plan answers with the lite model." in page.text  # policy.why_sentence


async def test_the_same_claims_get_the_full_model_where_the_plan_allows_it(site: Site) -> None:
    # The control: the attack's headers are not what makes the answer lite.
    session = session_of(site.base, "paying")
    async with socket_as(site.base, session, PHONE_UA) as ws:
        hello = await ready(ws)
        assert (hello["tier"], hello["model"]) == ("full", "demo-full")
        answered = await answered_by(ws, site.database_url, "/echo hi", model="demo-full")
        assert answered == ("demo-full", "full")


async def test_a_plan_changed_under_an_open_socket_holds_from_the_next_answer(site: Site) -> None:
    # The socket's tier is decided at its handshake; the turn checks the plan itself.
    session = session_of(site.base, "upgraded")
    async with socket_as(site.base, session, DESKTOP_UA) as ws:
        assert (await ready(ws))["tier"] == "full"
        answered = await answered_by(ws, site.database_url, "/echo one", model="demo-full")
        assert answered == ("demo-full", "full")
        # The admin switches the plan off behind the signals' back (a bulk UPDATE); each
        # process re-reads limits after their short cache (no signal reaches another process).
        with psycopg.connect(site.database_url, autocommit=True) as db:
            db.execute(
                "UPDATE chat_plan SET full_model_allowed = false WHERE name = 'Full for now'"
            )
        await asyncio.sleep(LIMITS_CACHE_SECONDS + 0.5)
        assert await refuses_the_full_model(ws)
        assert await answered_by(ws, site.database_url, "/echo two") == ("demo-lite", "lite")

"""The model picker cannot hand out the full model that a plan forbids (hostile review).

The review listed the full tier's model as a pickable model (admin: Pickable models, "phones"
on, every plan: what an admin who wants it in the picker with a nicer label does), put a user
on a plan with "full model allowed" off, and claimed a phone in the socket's User-Agent: the
phone's `ready` offered `demo-full` and a prompt asking for it by name was answered by it,
although the same user on a desktop was refused. The plan's word was applied only when the
device said full (`chat.tiers.policy.lite_only` marked only that case, and
`chat.turns.start.tier_within_plan` skipped sockets that were lite already), so a device that
is lite by its own claim kept every pickable model. Real sockets to a real daphne on
PostgreSQL; what answered is read from the database.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx
import psycopg
import pytest
from websockets.asyncio.client import ClientConnection, connect

from chat.limits.plans import LIMITS_CACHE_SECONDS
from tests.servers import ROOT, base_env, running_chatsite
from tests.test_daphne import fresh_postgres_database, ready, ws_url
from tests.test_security_tiers import (
    DESKTOP_UA,
    PASSWORD,
    PHONE_UA,
    Site,
    answered_by,
    refuses_the_full_model,
    session_of,
)

SETUP = f"""
from django.contrib.auth.models import User
from chat.models import PickableModel, Plan, Quota
PickableModel.objects.create(model="demo-full", label="The big one", phones=True)
no_full = Plan.objects.create(name="No full", full_model_allowed=False)
later = Plan.objects.create(name="Full for now", full_model_allowed=True)
for name, plan in (("limited", no_full), ("upgraded", later)):
    Quota.objects.create(user=User.objects.create_user(name, password={PASSWORD!r}), plan=plan)
"""


@asynccontextmanager
async def socket_as(base: str, session: str, user_agent: str) -> AsyncIterator[ClientConnection]:
    """A socket that says what it is: a phone's User-Agent alone makes it lite by the device."""
    async with connect(
        ws_url(base),
        origin=base,  # type: ignore[arg-type]
        additional_headers={"Cookie": f"sessionid={session}"},
        user_agent_header=user_agent,
        proxy=None,
        open_timeout=10,
    ) as ws:
        yield ws


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


@pytest.mark.parametrize("user_agent", [PHONE_UA, DESKTOP_UA], ids=["phone", "desktop"])
async def test_a_pickable_full_model_is_not_offered_or_answered_where_the_plan_forbids_it(
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
def test_the_page_offers_no_full_model_in_its_picker_for_such_a_plan(
    site: Site, user_agent: str
) -> None:
    with httpx.Client(base_url=site.base, timeout=30, trust_env=False) as client:
        client.cookies.set("sessionid", session_of(site.base, "limited"))
        page = client.get("/", headers={"User-Agent": user_agent})
    assert page.status_code == 200
    assert 'value="demo-full"' not in page.text
    assert "Your plan answers with the lite model." in page.text  # policy.why_sentence


async def test_a_phone_socket_loses_the_pickable_full_model_when_the_plan_is_switched_off(
    site: Site,
) -> None:
    session = session_of(site.base, "upgraded")
    async with socket_as(site.base, session, PHONE_UA) as ws:
        hello = await ready(ws)
        # The control: where the plan allows it, the phone may pick the listed full model.
        assert (hello["tier"], [m["id"] for m in hello["models"]]) == (
            "lite",
            ["demo-lite", "demo-full"],
        )
        answered = await answered_by(ws, site.database_url, "/echo one", model="demo-full")
        assert answered == ("demo-full", "lite")
        # The admin switches the full model off behind the signals' back (a bulk UPDATE).
        with psycopg.connect(site.database_url, autocommit=True) as db:
            db.execute(
                "UPDATE chat_plan SET full_model_allowed = false WHERE name = 'Full for now'"
            )
        await asyncio.sleep(LIMITS_CACHE_SECONDS + 0.5)
        assert await refuses_the_full_model(ws)
        assert await answered_by(ws, site.database_url, "/echo two") == ("demo-lite", "lite")

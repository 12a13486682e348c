"""Page loads are rate limited (hostile review, High): `GET /c/<id>/` and `GET /s/<token>/`
send a long answer's stored HTML (over a megabyte), and 30 loops of them made another user's
first token go from ~15 ms to 777 ms. Every load of a page that sends a whole conversation
(the page, the shared page, the two exports) now counts against CHAT_PAGE_RATE per user, or
per client address when anonymous; over it: 429, Retry-After and a page that says why.

Attacked from outside: the Django test client (counting in the real Redis: it runs each
request on an event loop of its own, which the in-process storage does not outlive) and a
real daphne counting in its own memory."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest
from django.test import Client

from chat.models import Conversation, SharedConversation
from tests.conftest import REDIS_URL
from tests.servers import ROOT, base_env, running_chatsite, signup

pytestmark = pytest.mark.django_db

DEFAULT_PAGE_RATE = "60/minute"  # docs/configuration.md


@pytest.fixture
def pages(settings: Any, redis_prefix: str) -> Any:
    settings.REDIS_URL = REDIS_URL
    settings.CHAT_PAGE_RATE = "5/minute"
    return settings


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def assert_refused_page(response: Any) -> None:
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    body = response.content.decode()
    # A whole page in the site's style, saying why and when, not a bare fragment.
    assert body.lstrip().lower().startswith("<!doctype html")
    assert 'rel="stylesheet"' in body
    assert "Conversations were opened too often (at most 5 page loads per minute)" in body
    assert "Try again in" in body


def test_one_user_looping_page_loads_is_refused_and_another_user_is_not(
    pages: Any, owner: Any, django_user_model: Any
) -> None:
    other = django_user_model.objects.create_user("other", password="a-long-test-passphrase-42")
    mine = Conversation.objects.create(user=owner, title="Mine")
    theirs = Conversation.objects.create(user=other, title="Theirs")
    attacker = logged_in(owner)
    codes = [attacker.get(f"/c/{mine.id}/").status_code for _ in range(5)]
    assert codes == [200] * 5
    assert_refused_page(attacker.get(f"/c/{mine.id}/"))
    # The exports are the same whole conversation: refused too, as is any other conversation
    # of the user (or one that does not exist: the count comes before the lookup).
    assert attacker.get(f"/c/{mine.id}/export.md").status_code == 429
    assert attacker.get(f"/c/{mine.id}/export.json").status_code == 429
    assert attacker.get(f"/c/{uuid.uuid4()}/").status_code == 429
    # Pages that do not send a conversation are not counted.
    assert attacker.get("/conversations/").status_code == 200
    # An htmx navigation gets the reason in the alert region.
    over = attacker.get(f"/c/{mine.id}/", headers={"HX-Request": "true"})
    assert over.status_code == 429 and over["HX-Retarget"] == "#alerts"
    # Another user is not refused.
    victim = logged_in(other)
    assert [victim.get(f"/c/{theirs.id}/").status_code for _ in range(5)] == [200] * 5


def test_exports_count_against_the_same_rate(pages: Any, owner: Any) -> None:
    mine = Conversation.objects.create(user=owner, title="Mine")
    client = logged_in(owner)
    for path in ("export.md", "export.json", "export.md", "export.json", ""):
        response = client.get(f"/c/{mine.id}/{path}")
        response.close()  # a streamed export holds an export slot until it is closed
        assert response.status_code == 200, path
    assert client.get(f"/c/{mine.id}/export.json").status_code == 429


def test_anonymous_shared_pages_are_limited_per_address(pages: Any, owner: Any) -> None:
    conversation = Conversation.objects.create(user=owner, title="Shared")
    token = "t" * 43
    SharedConversation.objects.create(
        conversation=conversation, token=token, title="Shared", messages=[]
    )
    one = Client(REMOTE_ADDR="192.0.2.1")
    assert [one.get(f"/s/{token}/").status_code for _ in range(5)] == [200] * 5
    assert_refused_page(one.get(f"/s/{token}/"))
    # A header the client sends does not make it someone else.
    spoofed = one.get(f"/s/{token}/", headers={"X-Forwarded-For": "198.51.100.7"})
    assert spoofed.status_code == 429
    # Another address is not refused.
    two = Client(REMOTE_ADDR="192.0.2.2")
    assert two.get(f"/s/{token}/").status_code == 200
    # IPv6 counts per /64: another address of the same /64 is the same client.
    for n in range(5):
        assert Client(REMOTE_ADDR=f"2001:db8::{n + 1}").get(f"/s/{token}/").status_code == 200
    assert Client(REMOTE_ADDR="2001:db8::ff").get(f"/s/{token}/").status_code == 429
    assert Client(REMOTE_ADDR="2001:db8:0:1::1").get(f"/s/{token}/").status_code == 200


def test_a_person_clicking_through_conversations_is_never_refused(
    settings: Any, redis_prefix: str, owner: Any
) -> None:
    settings.REDIS_URL = REDIS_URL
    assert settings.CHAT_PAGE_RATE == DEFAULT_PAGE_RATE  # the default of chatsite/settings.py
    conversations = [Conversation.objects.create(user=owner, title=f"C{n}") for n in range(20)]
    client = logged_in(owner)
    assert [client.get(f"/c/{c.id}/").status_code for c in conversations] == [200] * 20


def test_a_bad_page_rate_stops_the_process_at_start_up() -> None:
    def load(value: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "import chatsite.settings"],
            cwd=ROOT,
            env=base_env(CHAT_PAGE_RATE=value),
            capture_output=True,
            text=True,
        )

    assert load("3/hour;10/day").returncode == 0  # the control
    for bad in ("lots", "", "5 per fortnight"):
        result = load(bad)
        assert result.returncode != 0
        assert "ImproperlyConfigured" in result.stderr and "CHAT_PAGE_RATE" in result.stderr


@pytest.mark.timeout(120)
def test_over_daphne_without_redis_a_page_loop_is_refused_and_others_are_not() -> None:
    with running_chatsite(port=9701, REDIS_URL="", CHAT_PAGE_RATE="5/minute") as base:
        storm, calm = signup(base, "storm"), signup(base, "calm")
        page = f"/c/{uuid.uuid4()}/"  # not theirs: a 404, counted all the same
        assert [storm.get(page).status_code for _ in range(5)] == [404] * 5
        refused = storm.get(page)
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert "Conversations were opened too often" in refused.text
        assert [calm.get(page).status_code for _ in range(5)] == [404] * 5
        anonymous = httpx.Client(base_url=base, timeout=10)
        shared = "/s/" + "u" * 43 + "/"
        assert [anonymous.get(shared).status_code for _ in range(5)] == [404] * 5
        assert anonymous.get(shared).status_code == 429
        for client in (storm, calm, anonymous):
            client.close()

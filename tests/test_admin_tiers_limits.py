"""The admin refuses limits the limiter cannot enforce, warns of a tier's model the model server
does not list, and tests a tier with a one-line answer (issue 16.5)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from importlib import import_module
from typing import Any

import pytest
from django.apps import apps
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.test import Client

from chat.models import ModelTier, Plan, Quota
from chat.ops import tier_check
from tests.demo_server import demo_stats, running_demo_server

seed_tiers = import_module("chat.migrations.0002_seed_tiers")


@pytest.fixture
def admin_client(django_user_model: Any, chat_settings: Any) -> Client:
    # The tiers and the Standard plan are seeded by a migration; a transactional test that ran
    # before in this process (the order differs in each xdist worker) may have flushed them.
    seed_tiers.seed(apps, None)
    boss = django_user_model.objects.create_superuser("boss", password="boss-pass-123456")
    client = Client()
    client.force_login(boss)
    return client


def plan_form(**fields: str) -> dict[str, str]:
    return {
        "name": "Team",
        "rate_limit": "",
        "daily_tokens": "",
        "max_concurrent_streams": "",
        **fields,
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    "rate", ["twenty per minute", "20/fortnight", "20/minute,", "-1/minute", "20/minute;x"]
)
def test_full_clean_refuses_a_rate_the_limiter_cannot_read(rate: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Plan(name="Team", rate_limit=rate).full_clean()
    [message] = refused.value.message_dict["rate_limit"]
    assert f"“{rate}” is not a rate limit the limiter can read" in message
    assert "20/minute" in message  # says how to write one
    quota = Quota(rate_limit=rate)
    with pytest.raises(ValidationError) as refused:
        quota.clean()
    assert "rate_limit" in refused.value.message_dict


@pytest.mark.django_db
def test_a_rate_of_zero_and_zero_streams_are_refused() -> None:
    # Both would refuse every message: the user is locked out with an odd message.
    with pytest.raises(ValidationError) as refused:
        Plan(name="Team", rate_limit="0/minute", max_concurrent_streams=0).full_clean()
    assert set(refused.value.message_dict) == {"rate_limit", "max_concurrent_streams"}
    assert "allows no message at all" in refused.value.message_dict["rate_limit"][0]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "rate", ["", "20/minute", "20 per minute", "20/minute;500/day", "5 per 2 hours"]
)
def test_what_the_limiter_reads_is_accepted(rate: str) -> None:
    plan = Plan(name="Team", rate_limit=rate)
    plan.full_clean()  # raises if refused
    assert plan.rate_limit == rate


@pytest.mark.django_db
def test_the_plan_form_refuses_twenty_per_minute_with_a_clear_message(
    admin_client: Client,
) -> None:
    response = admin_client.post("/admin/chat/plan/add/", plan_form(rate_limit="twenty per minute"))
    assert response.status_code == 200  # the form again, not a redirect
    page = response.content.decode()
    assert "is not a rate limit the limiter can read" in page
    assert not Plan.objects.filter(name="Team").exists()
    response = admin_client.post("/admin/chat/plan/add/", plan_form(rate_limit="20 per minute"))
    assert response.status_code == 302
    assert Plan.objects.get(name="Team").rate_limit == "20 per minute"


@pytest.mark.django_db
def test_the_quota_inline_refuses_it_too(admin_client: Client, owner: Any) -> None:
    page = admin_client.get(f"/admin/auth/user/{owner.pk}/change/").content.decode()
    # The inline says what a blank field means and what is in force now.
    assert "Blank: the plan" in page
    assert "Limits in force now" in page
    assert "1,000 messages per minute; no daily token quota; 20 answers at a time" in page
    assert "From plan Standard" in page
    form = {
        "username": owner.username,
        "date_joined_0": "2024-01-01",
        "date_joined_1": "00:00:00",
        "is_active": "on",
        "quota-TOTAL_FORMS": "1",
        "quota-INITIAL_FORMS": "0",
        "quota-MIN_NUM_FORMS": "0",
        "quota-MAX_NUM_FORMS": "1",
        "quota-0-user": str(owner.pk),
        "quota-0-rate_limit": "twenty per minute",
    }
    response = admin_client.post(f"/admin/auth/user/{owner.pk}/change/", form)
    assert response.status_code == 200
    assert "is not a rate limit the limiter can read" in response.content.decode()
    assert not Quota.objects.filter(user=owner).exists()


@pytest.mark.django_db
def test_a_tier_naming_a_model_the_server_does_not_list_is_warned_of(
    admin_client: Client,
) -> None:
    ModelTier.objects.filter(tier="lite").update(model="no-such-model")
    page = admin_client.get("/admin/chat/modeltier/").content.decode()
    assert "“no-such-model” is not one the model server lists" in page
    assert "demo-lite" in page  # what it does list
    assert "“demo-full” is not one" not in page
    full = ModelTier.objects.get(tier="full")
    page = admin_client.get(f"/admin/chat/modeltier/{full.pk}/change/").content.decode()
    assert "is not one the model server lists" not in page


@pytest.mark.django_db
def test_when_the_server_cannot_be_asked_the_admin_says_so(
    admin_client: Client, settings: Any
) -> None:
    settings.LLM_BASE_URL = "http://127.0.0.1:9/v1"  # the discard port: nothing listens
    page = admin_client.get("/admin/chat/modeltier/").content.decode()
    assert "Could not check the tiers&#x27; models: The model server could not be reached" in page


def models_asked(base_url: str) -> int:
    return sum(1 for path, _ in demo_stats(base_url)["requests"] if path == "/v1/models")


@pytest.mark.django_db
def test_the_model_servers_list_is_asked_once_for_many_views_then_again_when_it_expires(
    admin_client: Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ModelTier.objects.filter(tier="lite").update(model="no-such-model")
    full = ModelTier.objects.get(tier="full")
    with running_demo_server(stats=True) as url:
        settings.LLM_BASE_URL = url
        before = models_asked(url)  # the start-up check asked once
        pages = [admin_client.get("/admin/chat/modeltier/") for _ in range(3)]
        pages.append(admin_client.get(f"/admin/chat/modeltier/{full.pk}/change/"))
        # Every view warns (the list is kept, not the warning) ...
        for page in pages[:3]:
            assert "“no-such-model” is not one the model server lists" in page.content.decode()
        # ... and the model server was asked once for all four.
        assert models_asked(url) - before == 1
        # Kept briefly: once it expires (1 s here) the next view asks again.
        monkeypatch.setattr(tier_check, "LISTED_CACHE_SECONDS", 1)
        cache.delete(tier_check._listed_key())
        admin_client.get("/admin/chat/modeltier/")
        time.sleep(1.5)
        page = admin_client.get("/admin/chat/modeltier/").content.decode()
        assert "“no-such-model” is not one the model server lists" in page
        assert models_asked(url) - before == 3


@pytest.mark.django_db
def test_a_model_server_that_never_answers_holds_one_view_for_a_moment_not_every_one(
    admin_client: Client, settings: Any
) -> None:
    # A server that takes connections and never answers (a hung model server).
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def take() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=take, daemon=True).start()
    try:
        settings.LLM_BASE_URL = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        for _ in range(3):
            page = admin_client.get("/admin/chat/modeltier/")
            assert page.status_code == 200
            assert (
                "Could not check the tiers&#x27; models: The model server did not list its "
                f"models within {tier_check.LIST_SECONDS:g} s" in page.content.decode()
            )
        # Only the first view waited for it: the failure is kept like a list.
        assert len(held) == 1
    finally:
        listener.close()
        for connection in held:
            connection.close()


@pytest.mark.django_db
def test_the_test_action_streams_a_one_line_answer_from_each_tier(admin_client: Client) -> None:
    ModelTier.objects.filter(tier="lite").update(model="no-such-model")
    tiers = list(ModelTier.objects.values_list("pk", flat=True))
    response = admin_client.post(
        "/admin/chat/modeltier/",
        {"action": "try_tiers", "_selected_action": tiers},
        follow=True,
    )
    page = response.content.decode()
    assert "Full tier (demo-full) answered in" in page
    # The first line of the demo's answer, rendered as the chat renders answers (not "## …").
    assert '<div class="tier-answer"><h2>Hello from the demo model</h2>' in page
    assert "Lite tier (no-such-model) did not answer" in page
    assert "does not offer the model" in page

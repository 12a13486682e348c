"""The Django admin: staff only; plans, quotas and usage; tiers and device rules take effect."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.test import Client

from chat.limits.limiter import Admission, Limiter
from chat.limits.usage import today
from chat.models import DeviceRule, ModelTier, Plan, Quota, Usage, UsageReset
from tests.conftest import PHONE_UA, REDIS_URL


@pytest.fixture
def admin_client(django_user_model: Any) -> Client:
    admin = django_user_model.objects.create_superuser("boss", password="boss-pass-123456")
    client = Client()
    client.force_login(admin)
    return client


@pytest.mark.django_db
def test_non_staff_users_get_nothing_from_the_admin(owner: Any) -> None:
    client = Client()
    client.force_login(owner)
    for url in (
        "/admin/",
        "/admin/auth/user/",
        "/admin/chat/plan/",
        f"/admin/auth/user/{owner.pk}/change/",
    ):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")


@pytest.mark.django_db
def test_the_user_list_shows_plan_usage_today_and_what_is_left(
    admin_client: Client, owner: Any, settings: Any
) -> None:
    settings.CHAT_DAILY_TOKENS = 1000
    plan = Plan.objects.create(name="Gold <b>", daily_tokens=5000)
    Quota.objects.create(user=owner, plan=plan)
    Usage.objects.create(
        user=owner,
        model="demo-full",
        tier="full",
        requests=3,
        prompt_tokens=100,
        completion_tokens=200,
    )
    page = admin_client.get("/admin/auth/user/").content.decode()
    assert "Gold &lt;b&gt;" in page  # plan names are escaped
    assert ">300<" in page
    assert "4,700" in page
    # Filters and search are there.
    assert admin_client.get("/admin/auth/user/?q=owner").status_code == 200
    assert (
        admin_client.get(f"/admin/auth/user/?quota__plan__id__exact={plan.pk}").status_code == 200
    )


@pytest.mark.django_db
def test_a_users_page_charts_their_last_30_days(admin_client: Client, owner: Any) -> None:
    Usage.objects.create(
        user=owner,
        day=date.today() - timedelta(days=3),
        model="demo-lite",
        tier="lite",
        requests=2,
        prompt_tokens=10,
        completion_tokens=20,
    )
    page = admin_client.get(f"/admin/auth/user/{owner.pk}/change/").content.decode()
    assert "<svg" in page and "Tokens per day, last 30 days" in page
    assert "demo-lite" in page  # usage broken down by tier and model


@pytest.mark.django_db
def test_the_admin_index_charts_site_wide_usage(admin_client: Client, owner: Any) -> None:
    Usage.objects.create(user=owner, model="demo-full", tier="full", requests=1, prompt_tokens=5)
    page = admin_client.get("/admin/").content.decode()
    assert "All users: tokens per day" in page
    assert 'id="site-usage"' in page


@pytest.mark.django_db
def test_bulk_action_puts_users_on_a_plan(
    admin_client: Client, owner: Any, other_user: Any
) -> None:
    plan = Plan.objects.create(name="Team")
    response = admin_client.post(
        "/admin/auth/user/",
        {"action": "assign_plan", "_selected_action": [owner.pk, other_user.pk], "plan": plan.pk},
    )
    assert response.status_code == 302
    assert set(Quota.objects.filter(plan=plan).values_list("user_id", flat=True)) == {
        owner.pk,
        other_user.pk,
    }


@pytest.mark.django_db
def test_resetting_todays_usage_gives_the_quota_back_and_keeps_the_history(
    admin_client: Client, owner: Any, settings: Any, redis_prefix: str
) -> None:
    # The admin's requests each run on their own event loop: the count must live in Redis.
    settings.REDIS_URL = REDIS_URL
    settings.CHAT_DAILY_TOKENS = 1000
    day = today()
    Usage.objects.create(
        user=owner,
        day=day,
        model="m",
        tier="full",
        requests=2,
        prompt_tokens=300,
        completion_tokens=600,
    )

    async def spend() -> None:
        limiter = Limiter()
        admission = await limiter.admit(owner.pk, estimate_tokens=900)
        assert isinstance(admission, Admission)
        await admission.settle(900)
        await limiter.aclose()

    async def counted() -> tuple[int, int]:
        limiter = Limiter()
        try:
            return await limiter.tokens_today(owner.pk)
        finally:
            await limiter.aclose()

    async_to_sync(spend)()
    assert "100" in _left_today(admin_client, owner)
    response = admin_client.post(
        "/admin/auth/user/", {"action": "reset_today", "_selected_action": [owner.pk]}, follow=True
    )
    assert "Their usage history and charts keep today." in response.content.decode()
    # The history is whole (the chart keeps the day); the reset is recorded beside it.
    assert Usage.objects.get(user=owner, day=day).total_tokens == 900
    assert list(UsageReset.objects.values_list("user_id", "day", "tokens")) == [
        (owner.pk, day, 900)
    ]
    chart = admin_client.get(f"/admin/auth/user/{owner.pk}/change/").content.decode()
    assert f"{day:%Y-%m-%d}: 900 tokens, 2 requests" in chart
    assert "1,000" in _left_today(admin_client, owner)
    assert async_to_sync(counted)() == (0, 1000)


def _left_today(client: Client, user: Any) -> str:
    """The "Left today" cell of the user's row in the admin's user list."""
    page = client.get(f"/admin/auth/user/?q={user.username}").content.decode()
    return page.split('class="field-remaining_today">', 1)[1].split("<", 1)[0]


@pytest.mark.usefixtures("chat_settings")
async def test_admin_tier_edits_apply_on_the_next_connection(connect: Any, owner: Any) -> None:
    def edit() -> None:
        ModelTier.objects.filter(tier="lite").update(model="tiny-model")
        ModelTier.objects.get(tier="lite").save()  # post_save drops the cached policy

    await database_sync_to_async(edit)()
    phone = await connect(owner, user_agent=PHONE_UA)
    assert (phone.ready["tier"], phone.ready["model"]) == ("lite", "tiny-model")

    def phones_get_full() -> None:
        for rule in DeviceRule.objects.filter(signal="device", value="phone"):
            rule.enabled = False
            rule.save()

    await database_sync_to_async(phones_get_full)()
    again = await connect(owner, user_agent=PHONE_UA)
    assert again.ready["tier"] == "full"

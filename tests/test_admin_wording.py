"""What the admin says, as a new admin reads it: chatsite's own names, the limits a plan puts
in force, what users are offered to pick, a tier test's answer as text, which answers had their
model picked. Each page is read as a superuser and as a view-only staff user."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client, override_settings

from chat.limits.usage import today
from chat.models import Conversation, Message, ModelTier, PickableModel, Plan, Quota, Usage
from chat.tiers.picker import with_choices
from chat.tiers.policy import clear_policy_cache
from tests.hostile_upstream import hostile_upstream
from tests.test_admin_models import desktop

pytestmark = pytest.mark.django_db


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def superuser(django_user_model: Any) -> Client:
    return logged_in(django_user_model.objects.create_superuser("boss", password="pw-0123456789"))


@pytest.fixture
def viewer(django_user_model: Any) -> Client:
    """Staff who may view everything in the admin and change nothing."""
    user = django_user_model.objects.create_user("viewer", password="pw-0123456789", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    return logged_in(user)


@pytest.fixture(params=["superuser", "viewer"])
def staff(request: pytest.FixtureRequest) -> Client:
    client: Client = request.getfixturevalue(request.param)
    return client


def text_of(html: str) -> str:
    """The page's words as a person reads them: tags gone, entities decoded, spaces folded."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def test_the_admin_is_chatsites_not_djangos(staff: Client) -> None:
    page = staff.get("/admin/").content.decode()
    assert "Django administration" not in page and "Django site admin" not in page
    assert re.search(r'<div id="site-name"><a href="/admin/">chatsite admin</a></div>', page)
    title = re.search(r"<title>(.*?)</title>", page, re.S)
    assert title and title.group(1).strip() == "Plans, usage, models and chats | chatsite admin"
    assert "<h1>Plans, usage, models and chats</h1>" in page
    # And before logging in.
    login = Client().get("/admin/login/").content.decode()
    assert "chatsite admin" in login and "Django" not in text_of(login)


def column(page: str, field: str) -> list[str]:
    """The words of one column of an admin list, row by row."""
    cells = re.findall(rf'<t[hd] class="field-{field}[^"]*"[^>]*>(.*?)</t[hd]>', page, re.S)
    return [text_of(cell) for cell in cells]


def paired(page: str, key: str, value: str) -> dict[str, str]:
    return dict(zip(column(page, key), column(page, value), strict=True))


def plan_rows(client: Client) -> dict[str, tuple[str, ...]]:
    """The plan list's rows: name → its rate limit, daily tokens and concurrent streams."""
    page = client.get("/admin/chat/plan/").content.decode()
    fields = ("rate_in_force", "daily_tokens_in_force", "streams_in_force")
    limits = zip(*(column(page, f) for f in fields), strict=True)
    return dict(zip(column(page, "name"), limits, strict=True))


def test_the_plan_list_shows_the_limits_in_force_where_a_plan_leaves_them_blank(
    staff: Client, settings: Any
) -> None:
    settings.CHAT_RATE_LIMIT = "20/minute;500/day"
    settings.CHAT_DAILY_TOKENS = 200_000
    settings.CHAT_MAX_CONCURRENT_STREAMS = 2
    Plan.objects.all().delete()
    Plan.objects.create(name="Own", rate_limit="5/minute", daily_tokens=0, max_concurrent_streams=4)
    Plan.objects.create(name="Blank")
    assert plan_rows(staff) == {
        "Own": ("5/minute", "unlimited", "4"),
        "Blank": ("default (20/minute;500/day)", "default (200,000)", "default (2)"),
    }
    # With a default plan, a blank field of another plan takes the default plan's value
    # (chat.limits.plans.limits_of); the default plan's own blanks take the settings'.
    Plan.objects.create(name="Standard", is_default=True, daily_tokens=50_000)
    rows = plan_rows(staff)
    assert rows["Blank"] == (
        "default (20/minute;500/day)",
        "default plan's (50,000)",
        "default (2)",
    )
    assert rows["Standard"] == ("default (20/minute;500/day)", "50,000", "default (2)")
    assert rows["Own"] == ("5/minute", "unlimited", "4")


def test_a_users_limits_section_reads_as_one_heading_without_a_form_number(
    staff: Client, owner: Any
) -> None:
    for quota in (None, Quota.objects.create(user=owner)):
        page = staff.get(f"/admin/auth/user/{owner.pk}/change/").content.decode()
        words = text_of(page)
        assert "Plan and personal limits" in words, quota
        # No "…: #1" under either one-form section (the limits, the custom instructions).
        assert "#1" not in words and "blank fields: the plan's" not in words
        assert "quota of" not in words
        assert "A blank field below takes the plan's value" in words


def always_offered(client: Client) -> str:
    page = client.get("/admin/chat/pickablemodel/").content.decode()
    box = re.search(r'<div class="module" id="always-offered">(.*?)</div>', page, re.S)
    assert box, "the pickable models' list says nothing of what users are offered anyway"
    return text_of(box.group(1))


def test_an_empty_pickable_model_list_names_the_models_users_are_offered_anyway(
    staff: Client, owner: Any
) -> None:
    PickableModel.objects.all().delete()
    ModelTier.objects.filter(tier="lite").update(model="small-model")
    clear_policy_cache()
    # What a desktop user is offered with no rows: the tier models, which the page names.
    offered = [model for model, _ in with_choices(desktop(), owner).models]
    assert offered == ["demo-full", "small-model"]
    words = always_offered(staff)
    assert "demo-full (full tier) and small-model (lite tier)" in words
    assert "This list is empty, so those are all the models users can pick." in words

    PickableModel.objects.create(model="gpt-big", label="Big model")
    words = always_offered(staff)
    assert "The models below are offered besides those" in words
    assert "This list is empty" not in words


HOSTILE_LINE = (
    '<img src=x onerror="alert(1)"> **Hello** <script>alert(2)</script> [x](javascript:alert(3))'
)


@pytest.mark.usefixtures("chat_settings")
def test_a_tier_tests_answer_is_rendered_markdown_and_sanitised(superuser: Client) -> None:
    # A model server of our own answering a hostile first line: the demo model cannot be made
    # to (the test prompt is fixed).
    full = list(ModelTier.objects.filter(tier="full").values_list("pk", flat=True))
    with (
        hostile_upstream(tokens=1, delta_text=HOSTILE_LINE + "\nmore") as (base, _),
        override_settings(LLM_BASE_URL=base),
    ):
        page = superuser.post(
            "/admin/chat/modeltier/",
            {"action": "try_tiers", "_selected_action": full},
            follow=True,
        ).content.decode()
    answer = re.search(r'<div class="tier-answer">(.*?)</div>', page, re.S)
    assert answer, page[-3000:]
    shown = answer.group(1)
    assert "<strong>Hello</strong>" in shown
    # The tags are shown as text, never as markup; the script link is no link.
    assert "<img" not in shown and "<script" not in shown and "href" not in shown, shown
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in shown


def test_usage_and_message_lists_say_when_a_model_was_picked_not_chosen_by_the_tier(
    staff: Client, owner: Any
) -> None:
    # What a turn writes (chat.conversations, chat.limits.usage): on a desktop (full tier) the
    # owner picked demo-lite for one answer and let the tier choose demo-full for another.
    conversation = Conversation.objects.create(user=owner, title="Picked")
    for mid, model, picked in (("1-t-01", "demo-lite", True), ("2-t-01", "demo-full", False)):
        Message.objects.create(
            mid=mid,
            conversation=conversation,
            role="assistant",
            model=model,
            tier="full",
            picked=picked,
        )
        Usage.objects.create(user=owner, day=today(), model=model, tier="full", requests=1)

    messages = staff.get("/admin/chat/message/").content.decode()
    assert paired(messages, "model", "message_chosen_by") == {
        "demo-lite": "picked (on the full tier)",
        "demo-full": "the full tier",
    }
    usage = staff.get("/admin/chat/usage/").content.decode()
    assert paired(usage, "model", "usage_chosen_by") == {
        "demo-lite": "picked (on the full tier)",
        "demo-full": "the full tier",
    }
    # The conversation's answers say it too.
    thread = text_of(
        staff.get(f"/admin/chat/conversation/{conversation.pk}/change/").content.decode()
    )
    assert "demo-lite picked (on the full tier)" in thread
    assert "demo-full the full tier" in thread

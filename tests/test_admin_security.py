"""The admin as a hostile staff member would use it: a view-only account posts the actions it was
not offered, over real HTTP with a real CSRF token, against a real daphne."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import httpx
import pytest

from tests.staff import action_choices, admin_session, chatsite_prepared, csrf_token, rows

# viewer: may view everything in the admin, change nothing. editor: may also change users (the
# control: the same posts do change things for them). target: an ordinary user with usage today.
# The day the usage row is made for, fixed once: a run that crosses midnight must look for the
# row on the day it was made (a CI run at 00:00 UTC found none "today").
SET_UP_DAY = date.today().isoformat()
SCRIPT = f"""
from chat.models import Plan, Usage
view_all = [f"{{p.content_type.app_label}}.{{p.codename}}"
            for p in Permission.objects.filter(codename__startswith="view_")]
make_user("viewer", staff=True, perms=view_all)
make_user("editor", staff=True, perms=[*view_all, "auth.change_user"])
make_user("tierkeeper", staff=True, perms=[*view_all, "chat.change_modeltier"])
make_user("userkeeper", staff=True, perms=["auth.view_user"])
target = make_user("target")
Plan.objects.create(name="Unlimited", daily_tokens=0, rate_limit="100000/minute")
Usage.objects.create(user=target, day="{SET_UP_DAY}", model="demo-full",
                     tier="full", requests=3, prompt_tokens=100, completion_tokens=200)
"""


@pytest.fixture(scope="module")
def site() -> Iterator[tuple[str, Path]]:
    with chatsite_prepared(SCRIPT) as prepared:
        yield prepared


def user_id(database: Path, username: str) -> int:
    return int(rows(database, "SELECT id FROM auth_user WHERE username = ?", username)[0][0])


def plan_of(database: Path, username: str) -> list[str]:
    return [
        name
        for (name,) in rows(
            database,
            "SELECT p.name FROM chat_quota q JOIN chat_plan p ON p.id = q.plan_id "
            "JOIN auth_user u ON u.id = q.user_id WHERE u.username = ?",
            username,
        )
    ]


def usage_rows_of_the_day(database: Path, username: str) -> int:
    return len(
        rows(
            database,
            "SELECT g.id FROM chat_usage g JOIN auth_user u ON u.id = g.user_id "
            "WHERE u.username = ? AND g.day = ?",
            username,
            SET_UP_DAY,
        )
    )


def post_action(client: httpx.Client, action: str, selected: list[int], **extra: str) -> int:
    """Post an action on the user list as the list's own form does (a logged-in client)."""
    token = csrf_token(client, "/admin/auth/user/")
    response = client.post(
        "/admin/auth/user/",
        data={
            "csrfmiddlewaretoken": token,
            "action": action,
            "_selected_action": [str(pk) for pk in selected],
            "select_across": "0",
            "index": "0",
            **extra,
        },
    )
    return int(response.status_code)


def test_a_view_only_staff_user_is_offered_no_action_on_any_admin_list(
    site: tuple[str, Path],
) -> None:
    base, _ = site
    viewer = admin_session(base, "viewer")
    index = viewer.get("/admin/").text
    # Every list the admin registers, read off the index page: a model registered later is
    # covered without touching this test.
    lists = sorted(set(re.findall(r'href="(/admin/[a-z_]+/[a-z_]+/)"', index)))
    assert "/admin/auth/user/" in lists and "/admin/chat/plan/" in lists, lists
    for url in lists:
        page = viewer.get(url)
        assert page.status_code == 200, url
        assert action_choices(page.text) == [], f"{url} offers a view-only user an action"
    # The control: someone who may change users is offered both actions.
    editor = admin_session(base, "editor")
    offered = action_choices(editor.get("/admin/auth/user/").text)
    assert {"assign_plan", "reset_today"} <= set(offered), offered


def test_a_view_only_staff_user_posting_the_actions_changes_nothing(
    site: tuple[str, Path],
) -> None:
    base, database = site
    unlimited = rows(database, "SELECT id FROM chat_plan WHERE name = 'Unlimited'")[0][0]
    viewer = admin_session(base, "viewer")
    me, target = user_id(database, "viewer"), user_id(database, "target")

    # What the review did: move oneself to an unlimited plan, and wipe a user's usage today.
    assert post_action(viewer, "assign_plan", [me, target], plan=str(unlimited)) < 500
    assert post_action(viewer, "reset_today", [target]) < 500
    assert plan_of(database, "viewer") == []
    assert plan_of(database, "target") == []
    assert usage_rows_of_the_day(database, "target") == 1
    # A reset keeps the rows whoever runs it; what it would leave is a UsageReset record.
    assert rows(database, "SELECT COUNT(*) FROM chat_usagereset") == [(0,)]

    # The control: the same posts from a user who may change users do take effect, so the
    # test above would have seen it if they had worked.
    editor = admin_session(base, "editor")
    assert post_action(editor, "assign_plan", [target], plan=str(unlimited)) == 302
    assert plan_of(database, "target") == ["Unlimited"]


def test_a_view_only_staff_user_cannot_make_the_model_answer_with_the_tier_test(
    site: tuple[str, Path],
) -> None:
    """The tier test spends the model server's time and tokens: it needs the change right."""
    base, database = site
    tiers = [str(pk) for (pk,) in rows(database, "SELECT id FROM chat_modeltier")]

    def try_tiers(client: httpx.Client) -> str:
        token = csrf_token(client, "/admin/chat/modeltier/")
        response = client.post(
            "/admin/chat/modeltier/",
            data={
                "csrfmiddlewaretoken": token,
                "action": "try_tiers",
                "_selected_action": tiers,
                "index": "0",
            },
            follow_redirects=True,
        )
        assert response.status_code == 200
        return response.text

    viewer = admin_session(base, "viewer")
    assert "try_tiers" not in action_choices(viewer.get("/admin/chat/modeltier/").text)
    page = try_tiers(viewer)
    assert "answered in" not in page and "did not answer" not in page
    # Django ignores an action it did not offer: the post just shows the list again.
    assert "Select model tier to view" in page

    # The control: a staff user who may change tiers is offered the test, and it answers.
    keeper = admin_session(base, "tierkeeper")
    assert "try_tiers" in action_choices(keeper.get("/admin/chat/modeltier/").text)
    assert "Full tier (demo-full) answered in" in try_tiers(keeper)


def test_the_admin_index_sums_up_usage_and_feedback_only_for_staff_who_may_view_them(
    site: tuple[str, Path],
) -> None:
    # A staff member who may only view users is shown neither the site's usage nor the
    # feedback per model (the review found both on the index for any staff member).
    index = admin_session(site[0], "userkeeper").get("/admin/")
    assert index.status_code == 200
    assert 'id="site-usage"' not in index.text and 'id="feedback-by-model"' not in index.text
    # The control: staff who may view them get both.
    viewer_index = admin_session(site[0], "viewer").get("/admin/").text
    assert 'id="site-usage"' in viewer_index and 'id="feedback-by-model"' in viewer_index

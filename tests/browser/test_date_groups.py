"""The conversation list grouped by date, on a desktop and on phones, as ChatGPT does it: Pinned
first, then Today, Yesterday, Previous 7 days, Previous 30 days and months; each heading once,
also when older conversations load as the list scrolls; a conversation written to moves to
Today."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    DEVICES,
    chatsite_with_database,
    manage_shell,
    open_chat,
    press,
    run_axe,
    send,
    signed_in_context,
    unique_name,
    wait_for_answer,
    watch_for_errors,
)

pytestmark = pytest.mark.browser
OLD = 50  # with the five below, more than one page of the list (chat.views.SIDEBAR_SIZE)

MAKE = """
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.utils import timezone
from chat.models import Conversation
user = get_user_model().objects.get(username={name!r})
now = timezone.now()
def make(title, days, pinned=False):
    c = Conversation.objects.create(user=user, title=title, pinned=pinned)
    Conversation.objects.filter(pk=c.pk).update(updated_at=now - timedelta(days=days))
make("pinned long ago", 200, True)
make("written today", 0)
make("written yesterday", 1)
make("four days ago", 4)
make("fifteen days ago", 15)
for i in range({old}):
    make(f"old {{i}}", 100 + i / 1000)
"""

GROUPS = """() => {
  const groups = [];
  for (const li of document.querySelectorAll("#conversation-list > li")) {
    if (li.matches(".conv-group")) groups.push([li.textContent.trim(), []]);
    if (!li.matches(".conv")) continue;
    const title = li.querySelector("a").textContent.replace("📌", "").trim();
    groups[groups.length - 1][1].push(title);
  }
  return groups;
}"""


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, str]]:
    with chatsite_with_database() as server:
        yield server


def month_label(days_ago: float) -> str:
    now = datetime.now(UTC)
    then = now - timedelta(days=days_ago)
    return f"{then:%B}" if then.year == now.year else f"{then:%B %Y}"


def groups(page: Page) -> list[tuple[str, list[str]]]:
    return [(label, titles) for label, titles in page.evaluate(GROUPS)]


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_list_is_grouped_by_date_with_pins_first_across_pages(
    browser: Browser, server: tuple[str, str], device: str
) -> None:
    base, database_url = server
    name = unique_name("groups")
    # The browser's clock and time zone are UTC, as the server's dates are made here.
    context = signed_in_context(browser, base, name, timezone_id="UTC", **DEVICES[device])
    manage_shell(database_url, MAKE.format(name=name, old=OLD))
    page = open_chat(context)
    errors = watch_for_errors(page)
    if device != "desktop":
        press(page, page.get_by_role("button", name="Open the conversation list"))
    expect(page.locator("#conversation-list > li.conv")).to_have_count(50)  # the first page
    # Scrolling to the end of the list loads the older ones (infinite scroll).
    page.locator("#conversation-list li.more").scroll_into_view_if_needed()
    expect(page.locator("#conversation-list > li.conv")).to_have_count(5 + OLD)
    found = groups(page)
    labels = [label for label, _ in found]
    assert len(labels) == len(set(labels)), labels  # each heading once, across both pages
    assert found[:5] == [
        ("Pinned", ["pinned long ago"]),
        ("Today", ["written today"]),
        ("Yesterday", ["written yesterday"]),
        ("Previous 7 days", ["four days ago"]),
        ("Previous 30 days", ["fifteen days ago"]),
    ]
    assert labels[5] == month_label(100)
    assert sum(len(titles) for _, titles in found[5:]) == OLD
    expect(page.get_by_role("heading", name="Yesterday", exact=True)).to_be_visible()
    assert run_axe(page) == []

    # Writing to an old conversation moves it to Today (under the pinned one).
    page.get_by_role("link", name="fifteen days ago").click()
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, "/echo back again")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    found = groups(page)
    assert found[0] == ("Pinned", ["pinned long ago"])
    assert found[1] == ("Today", ["fifteen days ago", "written today"])
    assert "Previous 30 days" not in [label for label, _ in found]
    assert errors == []
    context.close()


def test_a_search_result_is_grouped_too(browser: Browser, server: tuple[str, str]) -> None:
    base, database_url = server
    name = unique_name("search")
    context = signed_in_context(browser, base, name, timezone_id="UTC")
    manage_shell(database_url, MAKE.format(name=name, old=3))
    page = open_chat(context)
    page.get_by_label("Search conversations").fill("days ago")
    expect(page.locator("#conversation-list > li.conv")).to_have_count(2)
    assert groups(page) == [
        ("Previous 7 days", ["four days ago"]),
        ("Previous 30 days", ["fifteen days ago"]),
    ]
    context.close()

"""The daily quota as a person meets it in Chromium: the tokens the meter shows can be spent,
and an admin's "Reset today's token usage" gives them back while the chart keeps the day."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    PASSWORD,
    chatsite_with_superuser,
    new_context,
    open_chat,
    signed_in_context,
    unique_name,
    wait_for_answer,
    watch_for_errors,
)

pytestmark = pytest.mark.browser

ADMIN = "quota-admin"
# `/long 1200` is 2 words of prompt and 1,200 tokens of answer by the demo model's count, so a
# quota of 1,917 leaves exactly the 715 tokens of the report (issue 16.4).
QUOTA = 1917


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with chatsite_with_superuser(ADMIN, PASSWORD, CHAT_DAILY_TOKENS=str(QUOTA)) as base:
        yield base


def type_and_press_send(page: Page, text: str) -> None:
    page.locator("#prompt").click()
    page.keyboard.type(text)
    page.get_by_role("button", name="Send", exact=True).click()


def meter_number(page: Page) -> int:
    return int(page.locator("#usage-meter").inner_text().split()[0].replace(",", ""))


def test_with_715_tokens_left_a_typed_prompt_is_answered_and_the_meter_goes_down(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    errors = watch_for_errors(page)
    meter = page.locator("#usage-meter")
    expect(meter).to_have_text(f"{QUOTA:,} tokens left today")
    type_and_press_send(page, "/long 1200")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete", timeout=30_000)
    expect(meter).to_have_text("715 tokens left today")

    # Every prompt used to reserve 1,000 tokens, so with 715 left this one was refused.
    type_and_press_send(page, "hello")
    answer = wait_for_answer(page, 2)
    expect(answer).to_have_attribute("data-status", "complete")
    expect(answer).to_contain_text("Hello from the demo model")
    expect(page.locator("#alerts .alert")).to_have_count(0)
    expect(meter).not_to_have_text("715 tokens left today")
    assert 0 < meter_number(page) < 715
    assert errors == []
    context.close()


def test_an_admin_resets_a_users_day_and_the_chart_still_shows_it(
    browser: Browser, server: str
) -> None:
    name = unique_name("spender")
    user = signed_in_context(browser, server, username=name)
    page = open_chat(user)
    type_and_press_send(page, f"/long {QUOTA + 500}")
    first = wait_for_answer(page, 1)
    expect(first).to_have_attribute("data-status", "stopped", timeout=30_000)
    expect(first).to_contain_text("daily quota reached")
    expect(page.locator("#usage-meter")).to_have_text("0 tokens left today")
    type_and_press_send(page, "hello")
    alert = page.locator("#alerts .alert")
    expect(alert).to_have_attribute("data-code", "quota_exceeded")
    expect(alert).to_contain_text("00:00 UTC")

    admin = new_context(browser, server)
    desk = admin.new_page()
    desk.goto("/admin/")
    desk.get_by_label("Username").fill(ADMIN)
    desk.get_by_label("Password").fill(PASSWORD)
    desk.get_by_role("button", name="Log in").click()
    desk.get_by_role("link", name="Users").first.click()
    row = desk.locator("#result_list tr", has=desk.get_by_role("link", name=name, exact=True))
    row.get_by_role("checkbox").check()
    desk.get_by_label("Action:").select_option(
        label="Reset today's token usage of the selected users"
    )
    desk.get_by_role("button", name="Go").click()
    expect(desk.locator(".messagelist")).to_contain_text(
        "Their usage history and charts keep today."
    )
    expect(row.locator(".field-remaining_today")).to_have_text(f"{QUOTA:,}")

    # The user's page: today's bar still carries the day's tokens.
    row.get_by_role("link", name=name, exact=True).click()
    today = f"{datetime.now(UTC):%Y-%m-%d}"
    bar = desk.locator("svg.usage-chart rect title", has_text=today)
    expect(bar).to_have_count(1)
    used = int(
        re.findall(rf"{today}: ([\d,]+) tokens", bar.text_content() or "")[0].replace(",", "")
    )
    assert 0 < used <= QUOTA

    # And the user has the whole quota again.
    page.reload()
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    expect(page.locator("#usage-meter")).to_have_text(f"{QUOTA:,} tokens left today")
    type_and_press_send(page, "hello")
    expect(wait_for_answer(page, 2)).to_have_attribute("data-status", "complete")
    admin.close()
    user.close()

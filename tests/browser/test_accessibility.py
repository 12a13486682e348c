"""axe-core in Chromium: no serious or critical violations on the pages people and admins use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    PASSWORD,
    PHONE,
    chatsite_with_superuser,
    new_context,
    open_chat,
    run_axe,
    send,
    signed_in_context,
    wait_for_answer,
)

pytestmark = pytest.mark.browser

ADMIN = "root"
RICH_ANSWER = (
    "## A heading\n\nSome **bold**, *italic* and `code`.\n\n"
    "> a quote\n\n1. one\n2. two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
    "```python\nprint('hi')\n```\n\n[a link](https://example.com)"
)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with chatsite_with_superuser(ADMIN, PASSWORD) as base:
        yield base


@pytest.mark.parametrize("path", ["/accounts/login/", "/accounts/signup/"])
def test_the_account_pages_have_no_serious_violations(
    browser: Browser, server: str, path: str
) -> None:
    context = new_context(browser, server)
    page = context.new_page()
    page.goto(path)
    assert run_axe(page) == []
    context.close()


def test_a_signup_with_errors_has_no_serious_violations(browser: Browser, server: str) -> None:
    context = new_context(browser, server)
    page = context.new_page()
    page.goto("/accounts/signup/")
    page.fill("#id_username", "x")
    page.fill("#id_password1", "short")
    page.fill("#id_password2", "other")
    page.get_by_role("button", name="Sign up").click()
    expect(page.locator(".form-error").first).to_be_visible()
    assert run_axe(page) == []
    context.close()


def test_the_skip_link_is_the_first_stop_and_shows_its_focus(browser: Browser, server: str) -> None:
    context = new_context(browser, server)
    page = context.new_page()
    page.goto("/accounts/login/")
    expect(page.locator("#id_username")).to_be_focused()  # autofocus
    page.keyboard.press("Shift+Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    expect(skip).to_be_in_viewport()
    assert skip.evaluate("el => getComputedStyle(el).outlineStyle") == "solid"
    context.close()


@pytest.mark.parametrize("device", ["desktop", "phone"])
def test_the_chat_page_has_no_serious_violations_empty_and_with_answers(
    browser: Browser, server: str, device: str
) -> None:
    options = PHONE if device == "phone" else {}
    context = signed_in_context(browser, server, **options)
    page = open_chat(context)
    assert run_axe(page) == []  # the empty state

    send(page, "/echo " + RICH_ANSWER)
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    send(page, "/fail 503")
    expect(wait_for_answer(page, 2)).to_have_attribute("data-status", "failed")
    assert run_axe(page) == []
    # And in the dark theme (contrast is checked again with the other colours).
    page.get_by_role("button", name="Dark theme").click()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    assert run_axe(page) == []
    if device == "phone":
        page.get_by_role("button", name="Open the conversation list").tap()
        expect(page.locator("#sidebar")).to_be_visible()
        assert run_axe(page) == []
    context.close()


def test_a_streaming_answer_is_busy_and_read_once_when_it_is_complete(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    messages = page.locator("#messages")
    # The answers' region is polite and says it is busy while an answer streams, so a
    # screen reader reads the answer once when it is complete, not word by word.
    expect(messages).to_have_attribute("aria-live", "polite")
    expect(messages).to_have_attribute("aria-busy", "false")
    send(page, "/stall 1 /echo done")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "streaming")
    expect(messages).to_have_attribute("aria-busy", "true")
    expect(answer.locator(".body")).to_have_attribute("aria-busy", "true")
    expect(answer).to_have_attribute("data-status", "complete")
    expect(messages).to_have_attribute("aria-busy", "false")
    expect(answer.locator(".body")).to_have_attribute("aria-busy", "false")
    context.close()


def test_the_admin_index_has_no_serious_violations(browser: Browser, server: str) -> None:
    context = new_context(browser, server)
    page = context.new_page()
    page.goto("/admin/")
    page.fill("#id_username", ADMIN)
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#site-name")).to_be_visible()
    expect(page).to_have_url(f"{server}/admin/")
    assert run_axe(page) == []
    context.close()

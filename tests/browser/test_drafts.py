"""Unsent drafts in the prompt box, by hand on a desktop and on phones: a reload keeps what was
typed (per conversation, and for the new chat), sending clears it, it stays in the browser, and
the next person to log in on that browser never finds it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    DEVICES,
    PASSWORD,
    fill,
    is_touch,
    open_chat,
    press,
    signed_in_context,
    type_prompt,
    unique_name,
    use,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite, signup

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


def reload(page: Page) -> None:
    page.reload()
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")


def visit(page: Page, path: str) -> None:
    page.goto(path)
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")


def kept(page: Page) -> dict[str, str]:
    """The page's entries in the tab's sessionStorage (drafts.js: `chatsite.<owner>.<name>`)."""
    entries: dict[str, str] = page.evaluate(
        """() => Object.fromEntries(Object.keys(sessionStorage)
            .filter((key) => key.startsWith("chatsite."))
            .map((key) => [key, sessionStorage.getItem(key)]))"""
    )
    return entries


def send_box(page: Page) -> None:
    """Send what the box holds: Enter on a keyboard, the Send button on a touch screen."""
    if is_touch(page):
        press(page, page.locator("#send"))
    else:
        page.locator("#prompt").press("Enter")


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_draft_survives_a_reload_per_conversation_and_goes_once_sent(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    sent: list[str] = []
    page.on(
        "request",
        lambda request: sent.append(f"{request.url} {request.post_data or ''}"),
    )
    box = page.locator("#prompt")

    # The new chat's draft, two lines, survives a reload.
    type_prompt(page, "/echo first question")
    # A new line: Shift+Enter on a keyboard; on a touch screen Return makes one.
    page.keyboard.press("Enter" if is_touch(page) else "Shift+Enter")
    page.keyboard.type("second line")
    reload(page)
    expect(box).to_have_value("/echo first question\nsecond line")
    page.screenshot(path=f"/tmp/u1-draft-{device}.png")

    # Sent, it is gone: from the box, and after a reload, here and on a new chat.
    send_box(page)
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    expect(page).to_have_url(re.compile(r"/c/[^/]+/$"))
    conversation = page.url
    expect(box).to_have_value("")
    reload(page)
    expect(box).to_have_value("")
    visit(page, "/")
    expect(box).to_have_value("")

    # Each conversation keeps its own draft, and so does the new chat.
    type_prompt(page, "for a new chat")
    visit(page, conversation)
    expect(box).to_have_value("")
    type_prompt(page, "a follow-up, not sent yet")
    visit(page, "/")
    expect(box).to_have_value("for a new chat")
    visit(page, conversation)
    expect(box).to_have_value("a follow-up, not sent yet")
    reload(page)
    expect(box).to_have_value("a follow-up, not sent yet")

    # The draft stays in the browser: no request ever carried the unsent text.
    assert not [r for r in sent if "follow-up" in r or "for%20a%20new" in r or "for a new" in r]
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_next_user_of_a_tab_finds_nothing_of_the_last_ones_drafts(
    browser: Browser, server: str, device: str
) -> None:
    # Alice has two tabs; she types in one and, without sending, logs out in the other.
    context = signed_in_context(browser, server, **DEVICES[device])
    first = open_chat(context)
    second = open_chat(context)
    errors = watch_for_errors(second)
    touch = is_touch(second)
    type_prompt(second, "ALICE PRIVATE DRAFT")
    alices = [key for key, value in kept(second).items() if value == "ALICE PRIVATE DRAFT"]
    assert alices, kept(second)  # the draft was kept: there is something to leak
    if touch:
        use(touch, first.get_by_role("button", name="Open the conversation list"))
    use(touch, first.get_by_role("button", name="Log out"))
    expect(first).to_have_url(f"{server}/accounts/login/")
    first.close()

    # Bob logs in through the real login form in Alice's other tab, and lands on a new chat.
    bob = unique_name("bob")
    signup(server, bob).close()
    second.goto("/")
    expect(second).to_have_url(f"{server}/accounts/login/?next=/")
    fill(second, touch, "Username", bob)
    fill(second, touch, "Password", PASSWORD)
    use(touch, second.get_by_role("button", name="Log in"))
    expect(second).to_have_url(f"{server}/")
    expect(second.locator("#connection")).to_have_attribute("data-state", "connected")
    expect(second.locator(".account .who")).to_have_text(bob)

    # His box is empty, and nothing Alice's is left in the tab's storage.
    expect(second.locator("#prompt")).to_have_value("")
    left = kept(second)
    assert not [key for key in alices if key in left], left
    assert "ALICE PRIVATE DRAFT" not in "".join(left.values()), left
    owner = second.locator("#main").get_attribute("data-storage-owner")
    assert owner and all(key.startswith(f"chatsite.{owner}.") for key in left), left
    # What Bob types now is his, and comes back to him.
    type_prompt(second, "bob's own draft")
    second.reload()
    expect(second.locator("#prompt")).to_have_value("bob's own draft")
    assert errors == []
    context.close()

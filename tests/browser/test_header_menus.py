"""The chat header's ⚙ (system prompt) and ⋯ (share and export) menus, opened by hand on a
desktop and on phones: each opens whole on the screen (on a 360 px phone they ran off its left
edge, Save out of reach) and its controls work."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.browser.browsing import (
    DEVICES,
    open_chat,
    open_system_prompt,
    press,
    send,
    signed_in_context,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


def assert_on_screen(page: Page, popover: Locator) -> None:
    box = popover.bounding_box()
    width = page.evaluate("() => document.documentElement.clientWidth")
    assert box is not None
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, (box, width)


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_headers_menus_open_on_the_screen_and_save(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/echo hi")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")

    settings = page.locator("#conversation-settings-menu")
    open_system_prompt(page)
    popover = settings.locator(".conversation-settings-popover")
    expect(popover).to_be_visible()
    assert_on_screen(page, popover)
    press(page, page.locator("#system-prompt"))
    page.keyboard.insert_text("Answer like a pirate.")
    press(page, settings.get_by_role("button", name="Save"))
    expect(settings.locator(".saved")).to_have_text("Saved.")

    share = page.locator("#share-menu")
    press(page, share.get_by_label("Share and export"))
    popover = share.locator(".conversation-settings-popover")
    expect(popover).to_be_visible()
    assert_on_screen(page, popover)
    press(page, share.get_by_role("button", name="Share link"))
    expect(share.locator(".share-link a")).to_contain_text("/s/")
    assert_on_screen(page, popover)
    assert errors == []
    context.close()


# Whether the title's first `n` characters are drawn inside its box (a long title is cut, with
# "…", where its box ends: after two lines on a phone).
TITLE_SHOWS = """(t, n) => {
  const range = document.createRange();
  range.setStart(t.firstChild, 0);
  range.setEnd(t.firstChild, n);
  const box = t.getBoundingClientRect();
  return [...range.getClientRects()].every(
    (r) => r.right <= box.right + 0.5 && r.bottom <= box.bottom + 0.5);
}"""


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_title_is_readable_and_the_system_prompt_says_what_it_is(
    browser: Browser, server: str, device: str
) -> None:
    # On a 360 px phone ☰, ⚙, ⋯ and ◐ left the title "Write a P…", and "⚙" next to the
    # account's "Settings" was a second "settings" nobody could tell apart.
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "Write a Python function that reverses a linked list in place")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    title = page.locator("#chat-title")
    expect(title).to_have_text("Write a Python function that reverses a linked list in place")
    assert title.evaluate(TITLE_SHOWS, len("Write a Python function")), "the title is cut short"
    head = page.locator(".chat-head").bounding_box()
    assert head is not None and head["height"] <= 64, head  # still one slim header

    # Its name (and tooltip) says what it is, wherever it is.
    gear = page.locator("#conversation-settings-menu > summary")
    expect(gear).to_have_attribute("title", "System prompt for this chat")
    if device == "desktop":
        expect(gear).to_have_accessible_name("System prompt for this chat")
    else:
        expect(gear).to_be_hidden()  # in the ⋯ menu instead, by the same name
        press(page, page.locator("#share-menu > summary"))
        item = page.locator("#share-menu").get_by_role("button", name="System prompt for this chat")
        expect(item).to_be_visible()
        press(page, page.locator("#share-menu > summary"))  # closed again
    open_system_prompt(page)
    expect(page.get_by_label("System prompt for this conversation")).to_be_visible()
    expect(page.locator("#share-menu")).not_to_have_attribute("open", "")
    assert errors == []
    context.close()

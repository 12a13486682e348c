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
    press(page, settings.get_by_label("Conversation settings"))
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

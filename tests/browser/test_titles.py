"""Titles as a person sees them, on a desktop and on phones (issue 17.4): after the first
answer the provisional title (the prompt's words) changes, live, in the sidebar and the
header, to the one the lite model wrote; a second tab of the same user sees it too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    DEVICES,
    is_touch,
    open_chat,
    press,
    send,
    signed_in_context,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser

PROMPT = "Explain how a rainbow forms, in three short paragraphs."
TITLE = "Explain how a rainbow forms"  # what the demo model titles it (docs/protocol.md)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite(CHAT_TITLES="1") as base:
        yield base


def open_list(page: Page) -> None:
    if is_touch(page):
        press(page, page.get_by_role("button", name="Open the conversation list"))
        expect(page.locator("#sidebar")).to_be_visible()


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_title_changes_after_the_first_answer_in_every_tab(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    other = open_chat(context)  # a second tab of the same user, on the first screen
    errors = watch_for_errors(page) + watch_for_errors(other)
    send(page, PROMPT)
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    expect(page.locator("#chat-title")).to_have_text(TITLE)
    open_list(page)
    item = page.locator("#conversation-list li.conv").first
    expect(item.locator("a").first).to_have_text(TITLE)
    open_list(other)
    expect(other.locator("#conversation-list li.conv a").first).to_have_text(TITLE)
    # The title's tokens are counted: the meter shows what the server counts (after a reload).
    expect(page.locator("#usage-meter")).not_to_have_text("200,000 tokens left today")
    shown = page.locator("#usage-meter").inner_text()
    # It is the title from now on, after a reload too.
    page.reload()
    expect(page.locator("#chat-title")).to_have_text(TITLE)
    expect(page.locator("#usage-meter")).to_have_text(shown)
    assert errors == []
    context.close()

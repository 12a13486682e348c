"""Unsent drafts in the prompt box, by hand on a desktop and on phones: a reload keeps what was
typed (per conversation, and for the new chat), sending clears it, and it stays in the browser."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    DEVICES,
    is_touch,
    open_chat,
    press,
    signed_in_context,
    type_prompt,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

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

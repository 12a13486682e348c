"""`make screenshots`: the README's pictures, on a desktop and a phone, light and dark: the first
screen, a conversation, a limit message by the prompt box, and the tier popover."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    PHONE,
    open_chat,
    press,
    send,
    signed_in_context,
    wait_for_answer,
)
from tests.servers import ROOT, running_chatsite

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        os.environ.get("SCREENSHOTS") != "1",
        reason="screenshots are taken only with SCREENSHOTS=1 (make screenshots)",
    ),
]

OUT = ROOT / "docs" / "screenshots"
QUESTION = "How do I greet someone in Python?"
DEVICES = ("desktop", "phone")
THEMES = ("light", "dark")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # One message a minute: the limit scene's second message is refused.
    with running_chatsite(CHAT_RATE_LIMIT="1/minute") as base:
        yield base


def open_page(browser: Browser, server: str, scene: str, device: str, theme: str) -> Page:
    options = PHONE if device == "phone" else {}
    context = signed_in_context(
        browser,
        server,
        username=f"ada_{scene.replace('-', '_')}_{device}_{theme}",
        color_scheme=theme,
        **options,
    )
    page = open_chat(context)
    other = "light" if theme == "dark" else "dark"
    expect(page.locator("html")).not_to_have_attribute("data-theme", other)
    return page


def photograph(page: Page, name: str) -> Path:
    # No focus ring or caret in the picture (what a tap or a click left focused).
    page.evaluate("() => document.activeElement?.blur()")
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.png"
    page.screenshot(path=str(path), animations="disabled", caret="hide")
    assert path.stat().st_size > 10_000
    page.context.close()
    return path


def ask(page: Page, text: str, count: int) -> None:
    send(page, text)
    expect(wait_for_answer(page, count)).to_have_attribute("data-status", "complete")


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("device", DEVICES)
def test_the_first_screen_is_photographed(
    browser: Browser, server: str, device: str, theme: str
) -> None:
    page = open_page(browser, server, "first", device, theme)
    expect(page.get_by_role("heading", name="What can I help with?")).to_be_in_viewport()
    photograph(page, f"first-screen-{device}-{theme}")


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("device", DEVICES)
def test_a_conversation_is_photographed(
    browser: Browser, server: str, device: str, theme: str
) -> None:
    page = open_page(browser, server, "conversation", device, theme)
    ask(page, QUESTION, 1)
    page.locator("#messages").evaluate("m => { m.scrollTop = 0; }")
    photograph(page, f"{device}-{theme}")


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("device", DEVICES)
def test_a_limit_message_is_photographed(
    browser: Browser, server: str, device: str, theme: str
) -> None:
    page = open_page(browser, server, "limit", device, theme)
    ask(page, "Hello! What can you do?", 1)
    send(page, "And one more question, please.")
    expect(page.locator("#alerts .alert .countdown")).to_be_visible()
    photograph(page, f"limit-{device}-{theme}")


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("device", DEVICES)
def test_the_tier_popover_is_photographed(
    browser: Browser, server: str, device: str, theme: str
) -> None:
    page = open_page(browser, server, "tier", device, theme)
    press(page, page.locator("#tier-badge"))
    expect(page.locator("#tier-info")).to_be_visible()
    photograph(page, f"tier-{device}-{theme}")

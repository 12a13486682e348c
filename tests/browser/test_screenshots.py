"""`make screenshots`: the README's pictures of a conversation: desktop, phone, light, dark."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import PHONE, open_chat, send, signed_in_context, wait_for_answer
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


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("device", ["desktop", "phone"])
def test_a_conversation_is_photographed(
    browser: Browser, server: str, device: str, theme: str
) -> None:
    options = PHONE if device == "phone" else {}
    context = signed_in_context(
        browser, server, username=f"ada_{device}_{theme}", color_scheme=theme, **options
    )
    page = open_chat(context)
    send(page, QUESTION)
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")
    other = "light" if theme == "dark" else "dark"
    expect(page.locator("html")).not_to_have_attribute("data-theme", other)
    page.locator("#prompt").blur()  # no focus ring or caret in the picture
    page.locator("#messages").evaluate("m => { m.scrollTop = 0; }")
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{device}-{theme}.png"
    page.screenshot(path=str(path), animations="disabled", caret="hide")
    assert path.stat().st_size > 10_000
    context.close()

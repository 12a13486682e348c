"""A stale link to a conversation (deleted, or another account's), by hand on a desktop and on
phones: the app's own page says so, with no console error, and its link starts a new chat."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import DEVICES, press, signed_in_context, watch_for_errors
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_stale_conversation_link_says_so_and_leads_to_a_new_chat(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = context.new_page()
    errors = watch_for_errors(page)
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
    response = page.goto(f"/c/{uuid.uuid4()}/")
    assert response is not None and response.status == 404
    expect(page.get_by_role("heading", name="This conversation is not here")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("may have been deleted")
    # The page itself is whole: only the 404 of the document, no style refused by the CSP.
    assert [m for m in console if "404" not in m] == []
    press(page, page.get_by_role("link", name="Start a new chat"))
    expect(page).to_have_url(f"{server}/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    expect(page.locator("#prompt")).to_be_editable()
    assert errors == []
    context.close()

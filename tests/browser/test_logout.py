"""Logging out by hand, on a desktop and on phones: the real Log out control (in the drawer on
a phone) leads to the login page, which says the logout worked, once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    DEVICES,
    is_touch,
    open_chat,
    signed_in_context,
    use,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


@pytest.mark.parametrize("device", list(DEVICES))
def test_logging_out_says_so_on_the_login_page(browser: Browser, server: str, device: str) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    touch = is_touch(page)
    if touch:
        use(touch, page.get_by_role("button", name="Open the conversation list"))
    use(touch, page.get_by_role("button", name="Log out"))

    # A plain word where the eye lands (it said nothing: a logout looked like a reload).
    expect(page).to_have_url(f"{server}/accounts/login/")
    notice = page.get_by_role("status").filter(has_text="You are logged out.")
    expect(notice).to_be_visible()
    expect(page.get_by_role("button", name="Log in")).to_be_visible()
    # Really logged out: the chat sends this browser back to the login page, and the notice
    # was said once (it does not come back with every later visit).
    page.goto("/")
    expect(page).to_have_url(f"{server}/accounts/login/?next=/")
    expect(page.get_by_text("You are logged out.")).to_have_count(0)
    assert errors == []
    context.close()

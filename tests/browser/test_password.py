"""Changing one's password by hand, on a desktop and on phones: from the chat page to Settings,
the form (a wrong old password first, a weak new one, its reason under New password), then out
and back in with the new one; and the login page's way to a reset."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    DEVICES,
    PASSWORD,
    error_under,
    fill,
    is_touch,
    new_context,
    open_chat,
    signed_in_context,
    unique_name,
    use,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser
NEW = "a-brand-new-passphrase-77"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_person_changes_their_password_and_logs_in_with_the_new_one(
    browser: Browser, server: str, device: str
) -> None:
    name = unique_name("pw")
    context = signed_in_context(browser, server, name, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    touch = is_touch(page)
    if touch:
        use(touch, page.get_by_role("button", name="Open the conversation list"))
    use(touch, page.get_by_role("link", name="Settings"))
    use(touch, page.get_by_role("link", name="Change your password"))
    expect(page.get_by_role("heading", name="Change your password")).to_be_visible()

    fill(page, touch, "Old password", "not-my-password")
    fill(page, touch, "New password", NEW)
    fill(page, touch, "New password confirmation", NEW)
    use(touch, page.get_by_role("button", name="Change password"))
    expect(page.get_by_role("alert").first).to_contain_text("incorrect")

    # A weak new password: its reasons show under New password, where it was typed (they were
    # under the confirmation, from a review; signup had the same).
    page.get_by_label("Old password", exact=True).fill("")
    fill(page, touch, "Old password", PASSWORD)
    fill(page, touch, "New password", "qwerty")  # too short and among the most common
    fill(page, touch, "New password confirmation", "qwerty")
    use(touch, page.get_by_role("button", name="Change password"))
    expect(page.get_by_role("alert").first).to_be_visible()
    under_new = error_under(page, "New password")
    assert under_new is not None and "too common" in under_new and "too short" in under_new
    assert error_under(page, "New password confirmation") is None

    page.get_by_label("Old password", exact=True).fill("")
    fill(page, touch, "Old password", PASSWORD)
    page.get_by_label("New password", exact=True).fill("")
    fill(page, touch, "New password", NEW)
    page.get_by_label("New password confirmation", exact=True).fill("")
    fill(page, touch, "New password confirmation", NEW)
    use(touch, page.get_by_role("button", name="Change password"))
    expect(page.get_by_role("heading", name="Password changed")).to_be_visible()

    use(touch, page.get_by_role("link", name="Back to your chats"))
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    if touch:
        use(touch, page.get_by_role("button", name="Open the conversation list"))
    use(touch, page.get_by_role("button", name="Log out"))
    expect(page.get_by_role("button", name="Log in")).to_be_visible()
    fill(page, touch, "Username", name)
    fill(page, touch, "Password", NEW)
    use(touch, page.get_by_role("button", name="Log in"))
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    assert errors == []
    context.close()


def test_the_login_page_leads_to_a_password_reset(browser: Browser, server: str) -> None:
    context = new_context(browser, server)
    page = context.new_page()
    page.goto("/accounts/login/")
    page.get_by_role("link", name="Forgot your password?").click()
    page.get_by_label("Email").fill("nobody@example.com")
    page.get_by_role("button", name="Send the link").click()
    expect(page.get_by_role("heading", name="Check your email")).to_be_visible()
    context.close()

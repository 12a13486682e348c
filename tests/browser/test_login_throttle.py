"""Guessing a password in the browser: after the allowed tries the login page says why it
refuses and for how long, keeps the username typed, and the right password waits too."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    DEVICES,
    PASSWORD,
    new_context,
    press,
    run_axe,
    unique_name,
    watch_for_errors,
)
from tests.servers import running_chatsite, signup

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite(CHAT_LOGIN_RATE_PER_USERNAME="2/hour") as base:
        yield base


def try_password(page: Page, username: str, password: str, button: str) -> int:
    """Type the username and password and press the button; the status the page came with."""
    page.locator("#id_username").fill(username)
    page.locator("#id_password").fill(password)
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        press(page, page.get_by_role("button", name=button))
    page.wait_for_load_state()
    return posted.value.status


@pytest.mark.parametrize("device", DEVICES)
def test_the_login_page_says_when_a_username_is_paused(
    browser: Browser, server: str, device: str
) -> None:
    username = unique_name("guessed")
    signup(server, username).close()
    context = new_context(browser, server, **DEVICES[device])
    page = context.new_page()
    errors = watch_for_errors(page)
    page.goto("/accounts/login/")
    for n in range(2):
        assert try_password(page, username, f"wrong-{n}", "Log in") == 200
        expect(page.get_by_role("alert")).to_have_text(re.compile("did not match"))

    assert try_password(page, username, "wrong-again", "Log in") == 429
    alert = page.locator("#login-throttled")
    expect(alert).to_be_visible()
    expect(alert).to_have_attribute("role", "alert")
    expect(alert).to_have_text(
        re.compile(r"Too many login attempts for this username\..*try again in \d+ (h|min)")
    )
    # What the person typed stays; the password field is empty, as after any failure.
    expect(page.locator("#id_username")).to_have_value(username)
    expect(page.locator("#id_password")).to_have_value("")
    assert run_axe(page) == []
    # The right password waits too (the guesser must not learn it), and says so again.
    assert try_password(page, username, PASSWORD, "Log in") == 429
    expect(alert).to_be_visible()
    assert page.url.endswith("/accounts/login/")
    assert errors == []
    context.close()


def test_the_admin_login_page_says_when_an_address_is_paused(browser: Browser) -> None:
    with running_chatsite(CHAT_LOGIN_RATE_PER_ADDRESS="2/hour") as base:
        context = new_context(browser, base)
        page = context.new_page()
        page.goto("/admin/login/")
        for n in range(2):
            assert try_password(page, f"admin{n}", "wrong", "Log in") == 200
            expect(page.locator(".errornote")).to_contain_text("correct username and password")
        assert try_password(page, "admin9", "wrong", "Log in") == 429
        expect(page.locator(".errornote")).to_have_text(
            re.compile(r"Too many login attempts from your network address\. Try again in \d+")
        )
        context.close()

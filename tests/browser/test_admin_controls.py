"""The admin as a new staff member uses it, on a desktop and on phones: a rate limit the limiter
cannot read is refused in words, a tier whose model the model server does not list is warned
of, and "Test the selected tiers" streams a one-line answer (issue 16.5)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.browser.browsing import (
    DEVICES,
    PASSWORD,
    chatsite_with_superuser,
    new_context,
)

pytestmark = pytest.mark.browser

ADMIN = "tier-admin"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with chatsite_with_superuser(ADMIN, PASSWORD) as base:
        yield base


def press(page: Page, locator: Locator) -> None:
    """A tap on a phone, else a click. Decided by the device, not by asking the page (as
    browsing.press does): a press that navigates would leave the next question unanswered."""
    viewport = page.viewport_size
    if viewport is not None and viewport["width"] < 600:
        locator.tap()
    else:
        locator.click()


def log_in(browser: Browser, server: str, device: str) -> tuple[Page, list[str]]:
    """The admin's login form filled in as a person would; the console's errors from the
    first page on (a 404, like the favicon's was, and a CSP refusal, like the inline styles'
    were, log one)."""
    page = new_context(browser, server, **DEVICES[device]).new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto("/admin/")
    press(page, page.get_by_label("Username"))
    page.keyboard.type(ADMIN)
    press(page, page.get_by_label("Password"))
    page.keyboard.type(PASSWORD)
    press(page, page.get_by_role("button", name="Log in"))
    expect(page.get_by_role("heading", name="Plans, usage, models and chats")).to_be_visible()
    return page, errors


def retype(page: Page, label: str, text: str) -> None:
    """Put the caret in a field as a person would, select what is there and type over it."""
    field = page.get_by_label(label, exact=True)
    press(page, field)
    field.select_text()
    page.keyboard.type(text)


def run_action(page: Page, rows: list[str], action: str) -> None:
    for name in rows:
        row = page.locator("#result_list tr", has=page.get_by_role("link", name=name, exact=True))
        press(page, row.get_by_role("checkbox"))
    page.get_by_label("Action:").select_option(label=action)
    press(page, page.get_by_role("button", name="Go"))


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_rate_limit_the_limiter_cannot_read_is_refused_with_how_to_write_one(
    browser: Browser, server: str, device: str
) -> None:
    page, errors = log_in(browser, server, device)
    press(page, page.get_by_role("link", name="Plans"))
    press(page, page.get_by_role("link", name="Add plan"))
    retype(page, "Name:", f"Team {device}")
    retype(page, "Rate limit:", "twenty per minute")
    press(page, page.get_by_role("button", name="Save", exact=True))
    error = page.locator(".errorlist")
    expect(error).to_contain_text("“twenty per minute” is not a rate limit the limiter can read")
    expect(error).to_contain_text("e.g. 20/minute or 20 per minute")
    # The help under the field says how to write one before anyone gets it wrong.
    expect(page.locator("#id_rate_limit_helptext")).to_contain_text("20/minute;500/day")

    retype(page, "Rate limit:", "20 per minute")
    press(page, page.get_by_role("button", name="Save", exact=True))
    expect(page.locator(".messagelist")).to_contain_text(f"Team {device}")
    expect(page.locator(".messagelist")).to_contain_text("was added successfully")
    assert errors == []
    page.context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_staff_member_tests_the_tiers_and_is_warned_of_a_model_nobody_serves(
    browser: Browser, server: str, device: str
) -> None:
    page, errors = log_in(browser, server, device)
    press(page, page.get_by_role("link", name="Model tiers"))
    messages = page.locator(".messagelist")
    expect(messages).to_have_count(0)  # both seeded models are listed by the demo model

    run_action(page, ["Full"], "Test the selected tiers: stream a one-line answer")
    expect(messages).to_contain_text("Full tier (demo-full) answered in")
    # The answer's first line rendered as the chat renders answers: a heading, not "## …".
    expect(messages.locator(".tier-answer h2")).to_have_text("Hello from the demo model")
    expect(messages).not_to_contain_text("##")

    # A typo in a tier's model: the list says so at once, and the test shows it failing.
    lite = page.locator("#result_list").get_by_role("link", name="Lite", exact=True)
    press(page, lite)
    retype(page, "Model:", f"demo-lihgt-{device}")
    press(page, page.get_by_role("button", name="Save", exact=True))
    warning = messages.locator(".warning")
    expect(warning).to_contain_text(f"“demo-lihgt-{device}” is not one the model server lists")
    expect(warning).to_contain_text("it lists: demo-full, demo-lite")
    run_action(page, ["Lite"], "Test the selected tiers: stream a one-line answer")
    expect(messages.locator(".error")).to_contain_text(
        f"Lite tier (demo-lihgt-{device}) did not answer: The model server does not offer the model"
    )

    # Put it right: the warning goes.
    press(page, lite)
    retype(page, "Model:", "demo-lite")
    press(page, page.get_by_role("button", name="Save", exact=True))
    expect(messages).to_contain_text("was changed successfully")
    expect(messages.locator(".warning")).to_have_count(0)
    assert errors == []
    page.context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_admin_pages_fit_the_screen_and_log_no_error(
    browser: Browser, server: str, device: str
) -> None:
    page, errors = log_in(browser, server, device)
    wide = "() => document.scrollingElement.scrollWidth - window.innerWidth"

    # The index: the usage chart fits, and the "By tier" table's headings are not squashed
    # into a letter a line.
    requests = page.locator("#site-usage th", has_text="Requests")
    expect(requests).to_be_visible()
    box = requests.bounding_box()
    assert box is not None and box["height"] < 40, box
    assert page.evaluate(wide) <= 0

    press(page, page.get_by_role("link", name="Users").first)
    left = page.get_by_role("columnheader", name="Left today")
    expect(left).to_be_visible()
    if device == "desktop":  # 1280 px: the whole list beside the sidebar and the filters
        results = page.locator("#changelist .results")
        fits = results.evaluate("r => r.scrollWidth <= r.clientWidth")
        assert fits, "the user list scrolls sideways at 1280 px"
        assert left.evaluate("th => th.getBoundingClientRect().right <= innerWidth")
    # The plan by its name: the default plan is "Standard", not "default".
    row = page.locator("#result_list tr", has=page.get_by_role("link", name=ADMIN))
    expect(row.locator(".field-plan_name")).to_have_text("Standard (default)")

    # The user's page: the limits in force above the fields that change them, each explained.
    press(page, row.get_by_role("link", name=ADMIN))
    expect(page.locator("#limits-in-force")).to_contain_text(
        "20 messages per minute and 500 messages per day; 200,000 tokens a day; "
        "2 answers at a time. From plan Standard"
    )
    expect(page.locator("#id_quota-0-daily_tokens_helptext")).to_contain_text("0 = unlimited")
    expect(page.locator("#id_quota-0-rate_limit_helptext")).to_contain_text("20/minute;500/day")
    if device != "desktop":
        assert page.evaluate(wide) <= 0
    assert errors == []
    page.context.close()

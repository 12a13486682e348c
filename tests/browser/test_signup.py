"""Signing up by hand, on a desktop and on phones: every field looks alike, and a weak password
is refused with its reason under Password (where it was typed), then a good one gets in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    DEVICES,
    PASSWORD,
    error_under,
    fill,
    new_context,
    unique_name,
    use,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser

# What makes a field look like the others: its shape, its border and its size.
LOOKS = """(el) => {
  const s = getComputedStyle(el), box = el.getBoundingClientRect();
  return {radius: s.borderTopLeftRadius, border: s.borderTopWidth + " " + s.borderTopStyle + " "
          + s.borderTopColor, padding: s.paddingLeft, height: box.height, width: box.width};
}"""


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_fields_look_alike_and_a_weak_password_is_refused_under_password(
    browser: Browser, server: str, device: str
) -> None:
    context = new_context(browser, server, **DEVICES[device])
    page = context.new_page()
    errors = watch_for_errors(page)
    touch = device != "desktop"
    page.goto("/accounts/signup/")

    # The optional Email field is drawn like Username and the passwords (it was square, with
    # a thin dark border and shorter, from a review).
    looks = {
        label: page.get_by_label(label, exact=True).evaluate(LOOKS)
        for label in ("Username", "Email (optional)", "Password", "Password confirmation")
    }
    assert looks["Email (optional)"] == looks["Username"] == looks["Password"], looks

    name = unique_name("signup")
    fill(page, touch, "Username", name)
    fill(page, touch, "Email (optional)", f"{name}@example.com")
    fill(page, touch, "Password", "qwerty")  # too short and among the most common
    fill(page, touch, "Password confirmation", "qwerty")
    use(touch, page.get_by_role("button", name="Sign up"))
    expect(page.get_by_role("alert").first).to_be_visible()
    under_password = error_under(page, "Password")
    assert under_password is not None and "too common" in under_password, under_password
    assert "too short" in under_password
    assert error_under(page, "Password confirmation") is None
    # What was typed apart from the passwords is still there.
    expect(page.get_by_label("Username", exact=True)).to_have_value(name)
    expect(page.get_by_label("Email (optional)", exact=True)).to_have_value(f"{name}@example.com")

    fill(page, touch, "Password", PASSWORD)
    fill(page, touch, "Password confirmation", PASSWORD)
    use(touch, page.get_by_role("button", name="Sign up"))
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", ["desktop", "android"])
def test_only_the_password_rules_are_called_requirements(
    browser: Browser, server: str, device: str
) -> None:
    # New users read "Requirements" under the optional e-mail and wondered what it required:
    # its help is shown as it is, "Requirements" is kept for what a field must satisfy.
    context = new_context(browser, server, **DEVICES[device])
    page = context.new_page()
    page.goto("/accounts/signup/")
    email = page.get_by_label("Email (optional)", exact=True)
    expect(email).to_have_accessible_description(
        "Only used to reset your password if you forget it."
    )
    note = page.locator("p.help", has_text="Only used to reset your password")
    expect(note).to_be_visible()
    expect(page.locator("details.help", has_text="Only used to reset")).to_have_count(0)

    # The password's rules stay behind "Requirements", and open with a tap or a click.
    rules = page.locator("details.help").filter(has=page.locator("li"))
    expect(rules).to_have_count(1)
    expect(rules.locator("summary")).to_have_text("Requirements")
    use(device != "desktop", rules.locator("summary"))
    expect(rules.locator("li").first).to_be_visible()
    context.close()

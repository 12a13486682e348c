"""A refused prompt in the browser: it stays in the box; the page names the limit, counts down."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    answers,
    open_chat,
    send,
    signed_in_context,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite(CHAT_RATE_LIMIT="1/minute") as base:
        yield base


def test_a_rate_limited_prompt_stays_in_the_box_with_the_limit_and_a_countdown(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/echo the one message this minute")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")

    send(page, "/echo one too many")
    alert = page.locator("#alerts .alert")
    expect(alert).to_be_visible()
    expect(alert).to_have_attribute("data-code", "rate_limited")
    expect(alert).to_contain_text("1 message per minute")
    countdown = alert.locator(".countdown")
    expect(countdown).to_have_text(re.compile(r"^You can send again in \d+ s\.$"))
    first = int(re.findall(r"\d+", countdown.inner_text())[0])
    assert 1 <= first <= 60
    # It counts down (it ticks every second; waiting for a change is not a timing assertion).
    expect(countdown).not_to_have_text(countdown.inner_text(), timeout=3000)
    # Nothing the user typed is lost, and nothing was sent.
    expect(page.locator("#prompt")).to_have_value("/echo one too many")
    expect(page.locator("#prompt")).to_be_enabled()
    expect(page.locator("#prompt")).to_be_focused()
    expect(answers(page)).to_have_count(1)
    # The alert can be dismissed, and focus goes back to the box.
    alert.get_by_role("button", name="Dismiss").click()
    expect(alert).to_have_count(0)
    expect(page.locator("#prompt")).to_be_focused()
    assert errors == []
    context.close()

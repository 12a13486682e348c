"""A failed answer as a user meets it, on a desktop and on phones: plain words, the details in a
disclosure, and Retry only where a retry can succeed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    DEVICES,
    open_chat,
    press,
    run_axe,
    send,
    signed_in_context,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_failed_answer_says_what_happened_and_offers_retry_only_where_it_can_work(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)

    # The model server had trouble (500): a moment later it may work, so Retry is offered.
    send(page, "/fail 500")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "failed")
    footer = answer.locator(".msg-footer")
    expect(footer.locator(".note.error")).to_have_text(
        "The model server had a problem and could not answer"
    )
    expect(footer).not_to_contain_text("500")  # no status codes, no server text
    expect(footer.get_by_role("button", name="Retry")).to_be_visible()
    details = footer.locator("details.failure-details")
    expect(details.locator("p")).to_be_hidden()  # closed until asked
    press(page, details.locator("summary"))
    expect(details.locator("p")).to_contain_text(answer.get_attribute("data-mid") or "?")

    # The model server refuses the request itself (400): the same request meets the same
    # refusal, so no Retry; the footer says what to do instead.
    send(page, "/fail 400")
    refused = wait_for_answer(page, 2)
    expect(refused).to_have_attribute("data-status", "failed")
    footer = refused.locator(".msg-footer")
    expect(footer.locator(".note.error")).to_contain_text("could not take this request")
    expect(footer.get_by_role("button", name="Retry")).to_have_count(0)
    expect(footer.locator(".advice")).to_have_text(
        "Retrying the same message will not help: shorten it, or start a new chat."
    )

    # The site's own settings are wrong (the model server knows no such model): no Retry.
    send(page, "/fail 404")
    misconfigured = wait_for_answer(page, 3)
    expect(misconfigured).to_have_attribute("data-status", "failed")
    footer = misconfigured.locator(".msg-footer")
    expect(footer.get_by_role("button", name="Retry")).to_have_count(0)
    expect(footer.locator(".advice")).to_contain_text("tell whoever runs this site")

    # The page as loaded says the same; Retry, where offered, asks again: a new version.
    page.reload()
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    saved = page.locator("article.msg-assistant")
    expect(saved.nth(1).get_by_role("button", name="Retry")).to_have_count(0)
    expect(saved.nth(2).get_by_role("button", name="Retry")).to_have_count(0)
    details = saved.first.locator("details.failure-details")
    press(page, details.locator("summary"))
    assert run_axe(page) == []  # the failures' footers, a disclosure open
    press(page, saved.first.get_by_role("button", name="Retry"))
    expect(saved.first.locator(".version-count")).to_have_text("2 / 2")
    expect(saved.first).to_have_attribute("data-status", "failed")
    assert errors == []
    context.close()

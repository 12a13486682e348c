"""A refused prompt in the browser: it stays in the box; the page names the limit, counts down."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    DEVICES,
    answers,
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
    expect(countdown).to_have_text(re.compile(r"^Send again in \d+ s\.$"))
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


def alert_sits_by_the_composer(page: Page) -> None:
    """The alert is just above the prompt box, in the flow: it covers no message."""
    alert = page.locator("#alerts .alert").bounding_box()
    composer = page.locator("#composer").bounding_box()
    thread = page.locator("#messages").bounding_box()
    assert alert and composer and thread
    assert alert["y"] + alert["height"] <= composer["y"] + 1
    assert composer["y"] - (alert["y"] + alert["height"]) < 24  # right by it
    assert thread["y"] + thread["height"] <= alert["y"] + 1  # under the thread, not over it


@pytest.fixture(scope="module")
def quick_limit() -> Iterator[str]:
    # A window short enough to wait out in a test: the countdown's end is what is tested.
    with running_chatsite(CHAT_RATE_LIMIT="1/8second") as base:
        yield base


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_rate_limit_alert_sits_by_the_prompt_and_goes_when_its_countdown_ends(
    browser: Browser, quick_limit: str, device: str
) -> None:
    context = signed_in_context(browser, quick_limit, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/echo the one message these 8 seconds")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")

    send(page, "/echo one too many")
    alert = page.locator("#alerts .alert")
    expect(alert).to_have_attribute("data-code", "rate_limited")
    expect(alert.locator(".countdown")).to_have_text(re.compile(r"^Send again in \d s\.$"))
    alert_sits_by_the_composer(page)
    expect(page.locator("#prompt")).to_have_value("/echo one too many")
    assert run_axe(page) == []
    # When the countdown ends the alert has nothing left to say, and goes by itself.
    expect(alert).to_have_count(0, timeout=15_000)
    press(page, page.get_by_role("button", name="Send"))
    expect(wait_for_answer(page, 2)).to_have_attribute("data-status", "complete")
    expect(page.locator("#prompt")).to_have_value("")
    assert errors == []
    context.close()


@pytest.fixture(scope="module")
def one_stream() -> Iterator[str]:
    # One answer at a time, slow enough to still be streaming while another tab asks.
    with running_chatsite(CHAT_MAX_CONCURRENT_STREAMS="1", DEMO_TOKENS_PER_SECOND="40") as base:
        yield base


@pytest.mark.parametrize("device", list(DEVICES))
def test_at_the_cap_on_answers_the_page_waits_for_an_answer_to_end_not_for_a_time(
    browser: Browser, one_stream: str, device: str
) -> None:
    context = signed_in_context(browser, one_stream, **DEVICES[device])
    first = open_chat(context)
    send(first, "/long 2000")
    streaming = wait_for_answer(first, 1)
    expect(streaming).to_have_attribute("data-status", "streaming")

    second = open_chat(context)  # another tab, a new chat
    errors = watch_for_errors(second)
    send(second, "/echo my second question")
    alert = second.locator("#alerts .alert")
    expect(alert).to_have_attribute("data-code", "too_many_streams")
    # No countdown: the block lasts until an answer ends, and the alert says so in words.
    expect(alert).to_contain_text("streaming")
    expect(alert.locator(".countdown")).to_have_count(0)
    expect(alert).not_to_contain_text("send again in")
    alert_sits_by_the_composer(second)
    expect(second.locator("#prompt")).to_have_value("/echo my second question")
    expect(answers(second)).to_have_count(0)

    # The first answer ends (stopped in its own tab); the second tab's Send then works.
    press(first, first.get_by_role("button", name="Stop"))
    expect(streaming).to_have_attribute("data-status", "stopped")
    send_button = second.get_by_role("button", name="Send")
    expect(send_button).to_be_enabled()
    press(second, send_button)
    expect(wait_for_answer(second, 1)).to_have_attribute("data-status", "complete")
    expect(alert).to_have_count(0)  # the prompt was accepted: the alert is out of date
    expect(second.locator("#prompt")).to_have_value("")
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_alert_pushes_the_thread_up_and_the_end_of_the_answer_stays_in_view(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/long 400")  # longer than the screen: the thread scrolls
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)

    def end_in_view() -> bool:
        end = answer.bounding_box()
        thread = page.locator("#messages").bounding_box()
        assert end and thread
        return end["y"] + end["height"] <= thread["y"] + thread["height"] + 1

    page.wait_for_function(
        "() => { const m = document.getElementById('messages');"
        " return m.scrollHeight - m.scrollTop - m.clientHeight < 2; }"
    )
    assert end_in_view()
    send(page, "/echo one too many")
    expect(page.locator("#alerts .alert")).to_have_attribute("data-code", "rate_limited")
    # The thread got shorter by the alert's height; its end (the answer's last line and its
    # buttons) is still in view above the alert, not hidden under it.
    page.wait_for_function(
        "() => { const m = document.getElementById('messages');"
        " return m.scrollHeight - m.scrollTop - m.clientHeight < 2; }"
    )
    assert end_in_view()
    assert errors == []
    context.close()

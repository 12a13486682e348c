"""The "↓ New text below" button, used by hand on a desktop and on phones: it shows when the
reader scrolls up while an answer streams, sits above the prompt box however tall the box has
grown (it covered a two-line prompt on phones), and brings the newest text back into view."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    DEVICES,
    open_chat,
    press,
    send,
    signed_in_context,
    type_prompt,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser

AT_BOTTOM = "m => m.scrollHeight - m.scrollTop - m.clientHeight < 48"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # Slow enough that the answer streams all through the test (Stop ends it).
    with running_chatsite(DEMO_TOKENS_PER_SECOND="40") as base:
        yield base


@pytest.mark.parametrize("device", list(DEVICES))
def test_new_text_below_stays_above_a_grown_prompt_box_and_jumps_down(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/long 2000")
    answer = wait_for_answer(page, 1)
    messages = page.locator("#messages")
    # The answer grows past the screen; the thread follows it.
    page.wait_for_function(
        "() => { const m = document.getElementById('messages');"
        " return m.scrollHeight > m.clientHeight + 300; }"
    )
    expect(answer).to_have_attribute("data-status", "streaming")

    # The reader scrolls up to read, and types a long next question meanwhile (the box grows).
    area = messages.bounding_box()
    assert area is not None
    page.mouse.move(area["x"] + area["width"] / 2, area["y"] + area["height"] / 2)
    page.mouse.wheel(0, -3000)
    jump = page.get_by_role("button", name="New text below")
    expect(jump).to_be_visible()
    type_prompt(page, "How does the answer keep every chunk in order when the tab drops? " * 5)
    prompt = page.locator("#prompt").bounding_box()
    assert prompt is not None and prompt["height"] > 60  # three lines or more

    # The button is over the thread, above the box, and nothing covers it.
    button = jump.bounding_box()
    area = messages.bounding_box()
    assert button is not None and area is not None
    assert button["y"] + button["height"] <= area["y"] + area["height"]
    assert button["y"] + button["height"] <= prompt["y"]
    centre = (button["x"] + button["width"] / 2, button["y"] + button["height"] / 2)
    on_top = page.evaluate("([x, y]) => document.elementFromPoint(x, y)?.id", list(centre))
    assert on_top == "jump"

    press(page, jump)
    expect(jump).to_be_hidden()
    # At the bottom, and following the text that goes on arriving.
    page.wait_for_function(f"() => ({AT_BOTTOM})(document.getElementById('messages'))")
    expect(answer).to_have_attribute("data-status", "streaming")
    # The next question is still there; Stop ends the answer.
    expect(page.locator("#prompt")).to_have_value(
        "How does the answer keep every chunk in order when the tab drops? " * 5
    )
    press(page, page.get_by_role("button", name="Stop"))
    expect(answer).to_have_attribute("data-status", "stopped")
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_new_text_below_goes_once_the_answer_has_ended_and_the_reader_is_at_the_bottom(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/long 500")
    answer = wait_for_answer(page, 1)
    messages = page.locator("#messages")
    page.wait_for_function(
        "() => { const m = document.getElementById('messages');"
        " return m.scrollHeight > m.clientHeight + 300; }"
    )
    expect(answer).to_have_attribute("data-status", "streaming")
    area = messages.bounding_box()
    assert area is not None
    page.mouse.move(area["x"] + area["width"] / 2, area["y"] + area["height"] / 2)
    page.mouse.wheel(0, -3000)
    jump = page.get_by_role("button", name="New text below")
    expect(jump).to_be_visible()

    # The answer ends while the reader is up the thread: what came meanwhile is still below.
    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)
    page.wait_for_timeout(300)
    expect(jump).to_be_visible()
    # The reader scrolls down to the end themselves: nothing new is below any more.
    # (The mouse wheel on phones too: the page sees the same scroll events as from a swipe.)
    page.mouse.wheel(0, 100_000)
    page.wait_for_function(f"() => ({AT_BOTTOM})(document.getElementById('messages'))")
    expect(jump).to_be_hidden()
    page.wait_for_timeout(500)
    expect(jump).to_be_hidden()
    assert errors == []
    context.close()

"""The prompt box, used by hand on a desktop and on phones: what Return does on each device, and
typing the next question while an answer streams."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    DEVICES,
    PHONES,
    Frames,
    answers,
    press,
    send,
    signed_in_context,
    source_text,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # Slow enough that an answer of a few hundred tokens is still streaming while the test
    # types; nothing waits for the whole of it (Stop ends it).
    with running_chatsite(DEMO_TOKENS_PER_SECOND="40") as base:
        yield base


def open_page(browser: Browser, server: str, device: str) -> tuple[Page, Frames]:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = context.new_page()
    frames = Frames(page)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    return page, frames


def test_on_a_desktop_enter_sends_and_shift_enter_makes_a_new_line(
    browser: Browser, server: str
) -> None:
    page, _ = open_page(browser, server, "desktop")
    box = page.locator("#prompt")
    expect(box).to_have_attribute("enterkeyhint", "send")
    expect(page.locator("#composer-keys")).to_have_text("Enter sends · Shift+Enter new line")
    expect(page.locator("#empty-state [data-keys-hint]")).to_contain_text("Shift+Enter")
    box.click()
    page.keyboard.type("/echo line one")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("line two")
    expect(box).to_have_value("/echo line one\nline two")
    expect(answers(page)).to_have_count(0)
    page.keyboard.press("Enter")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")
    assert source_text(answer) == "line one\nline two"
    expect(box).to_have_value("")
    page.context.close()


@pytest.mark.parametrize("device", PHONES)
def test_on_a_phone_return_makes_a_new_line_and_the_send_button_sends(
    browser: Browser, server: str, device: str
) -> None:
    page, frames = open_page(browser, server, device)
    errors = watch_for_errors(page)
    box = page.locator("#prompt")
    # The on-screen keyboard's Return key is labelled for a new line, and the page says so.
    expect(box).to_have_attribute("enterkeyhint", "enter")
    expect(page.locator("#composer-keys")).to_have_text("Return: new line · tap Send to send")
    expect(page.locator("#empty-state [data-keys-hint]")).to_contain_text(
        "Return makes a new line; tap Send to send"
    )
    expect(page.locator("#empty-state [data-keys-hint]")).not_to_contain_text("Shift+Enter")
    box.tap()
    page.keyboard.type("/echo line one")
    page.keyboard.press("Enter")  # the on-screen keyboard's Return
    page.keyboard.type("line two")
    expect(box).to_have_value("/echo line one\nline two")
    expect(answers(page)).to_have_count(0)
    assert frames.of_type("prompt", sent=True) == []

    page.get_by_role("button", name="Send").tap()
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")
    assert source_text(answer) == "line one\nline two"
    expect(box).to_have_value("")
    assert errors == []
    page.context.close()


@pytest.mark.parametrize("device", ["desktop", *PHONES])
def test_the_next_question_can_be_typed_while_an_answer_streams(
    browser: Browser, server: str, device: str
) -> None:
    page, frames = open_page(browser, server, device)
    errors = watch_for_errors(page)
    touch = device != "desktop"
    box = page.locator("#prompt")
    bar = page.locator("#composer .composer-bar")  # the status line, the keys, badge, meter
    press(page, box)
    page.keyboard.type("/long 400")
    idle_height = bar.bounding_box()["height"]  # type: ignore[index]
    if touch:
        page.get_by_role("button", name="Send").tap()
    else:
        page.keyboard.press("Enter")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "streaming")
    expect(box).to_have_value("")

    # While it streams the box takes the next question, and the line under it says what
    # Enter (or Send) does now.
    press(page, box)
    page.keyboard.type("/echo the next question")
    expect(box).to_have_value("/echo the next question")
    status = page.locator("#composer-status")
    if touch:
        expect(status).to_contain_text("Send works once this answer ends")
        # Stop has Send's place until the answer ends (test_stop_takes_sends_place_on_a_phone).
        expect(page.get_by_role("button", name="Send")).to_be_hidden()
    else:
        expect(status).to_contain_text("Enter works when it ends · Esc stops")
        # The whole line shows at 1280 px beside the badge, picker and meter (it was cut to
        # "Enter sends it once this answer ends · …", losing Esc).
        assert status.evaluate("e => e.scrollWidth <= e.clientWidth")
        # Enter neither loses the text nor starts a second answer (the limits would refuse
        # it): nothing is sent, the text stays.
        page.keyboard.press("Enter")
        expect(box).to_have_value("/echo the next question")
    expect(answers(page)).to_have_count(1)
    # The line under the box does not grow when an answer starts (the status replaces the
    # keys on one line): the composer does not push the answer up.
    assert bar.bounding_box()["height"] == pytest.approx(idle_height, abs=1)  # type: ignore[index]
    assert len(frames.of_type("prompt", sent=True)) == 1
    assert frames.of_type("error") == []
    expect(answer).to_have_attribute("data-status", "streaming")

    # Once the answer ends (stopped here, to keep the test short), the same box sends it.
    press(page, page.get_by_role("button", name="Stop"))
    expect(answer).to_have_attribute("data-status", "stopped")
    expect(box).to_have_value("/echo the next question")
    expect(page.locator("#composer-status")).to_be_empty()
    assert bar.bounding_box()["height"] == pytest.approx(idle_height, abs=1)  # type: ignore[index]
    if touch:
        page.get_by_role("button", name="Send").tap()
    else:
        expect(box).to_be_focused()
        page.keyboard.press("Enter")
    second = wait_for_answer(page, 2)
    expect(second).to_have_attribute("data-status", "complete")
    assert source_text(second) == "the next question"
    expect(box).to_have_value("")
    assert frames.of_type("error") == []
    assert errors == []
    page.context.close()


# A desktop only: on a phone Stop takes Send's place, and the box keeps its width (below).
def test_the_box_shrinks_back_to_its_text_once_stop_is_gone(browser: Browser, server: str) -> None:
    page, _ = open_page(browser, server, "desktop")
    errors = watch_for_errors(page)
    box = page.locator("#prompt")
    one_line = box.bounding_box()["height"]  # type: ignore[index]
    send(page, "/long 400")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "streaming")
    expect(page.get_by_role("button", name="Stop")).to_be_visible()

    # Stop takes room beside the box: the next question, typed meanwhile, wraps a little
    # earlier than it would without Stop. Short words, until it just wraps.
    press(page, box)
    for _ in range(200):
        page.keyboard.type("ab ")
        if box.bounding_box()["height"] > one_line + 5:  # type: ignore[index]
            break
    else:
        pytest.fail("the box never grew to a second line")

    # Without Stop the same text fits on one line again, and the box shrinks back to it (it
    # stayed two lines tall, from a review).
    press(page, page.get_by_role("button", name="Stop"))
    expect(answer).to_have_attribute("data-status", "stopped")
    expect(page.get_by_role("button", name="Stop")).to_be_hidden()
    expect(box).to_have_css("height", f"{one_line:g}px")
    # And emptied by hand, it is one line tall too.
    press(page, box)
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.press("Backspace")
    expect(box).to_have_value("")
    expect(box).to_have_css("height", f"{one_line:g}px")
    assert errors == []
    page.context.close()


def on_screen(page: Page, selector: str) -> None:
    """The element is visible and wholly inside the window (nothing to scroll to reach it)."""
    element = page.locator(selector)
    expect(element).to_be_visible()
    box = element.bounding_box()
    size = page.viewport_size
    assert box is not None and size is not None
    assert box["x"] >= 0 and box["x"] + box["width"] <= size["width"] + 0.5, (selector, box)
    assert box["y"] >= 0 and box["y"] + box["height"] <= size["height"] + 0.5, (selector, box)


@pytest.mark.parametrize("device", ["desktop", *PHONES])
def test_a_short_window_leaves_the_answer_most_of_its_height_and_every_control_works(
    browser: Browser, server: str, device: str
) -> None:
    page, frames = open_page(browser, server, device)
    errors = watch_for_errors(page)
    messages = page.locator("#messages")
    # What a phone's on-screen keyboard leaves of a 740 px screen (or a short window).
    page.set_viewport_size({"width": 360, "height": 360})

    def answer_share() -> float:
        return messages.bounding_box()["height"] / 360  # type: ignore[index]

    send(page, "/long 400")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "streaming")
    expect(page.locator("#composer-status")).not_to_be_empty()
    # The status line and the tier row took so much that the answer had about a third of the
    # height while it streamed (from a review); now it keeps more than half.
    assert answer_share() >= 0.5, answer_share()
    for control in ("#prompt", "#stop", "#tier-badge"):
        on_screen(page, control)
    expect(page.locator("#send")).to_be_hidden()  # Stop has its place while the answer streams
    if page.locator("#model-picker").is_visible():
        on_screen(page, "#model-picker")

    # Every control still works: type the next question, Stop, Send.
    press(page, page.locator("#prompt"))
    page.keyboard.type("/echo short and sweet")
    press(page, page.get_by_role("button", name="Stop"))
    expect(answer).to_have_attribute("data-status", "stopped")
    assert answer_share() >= 0.5, answer_share()
    on_screen(page, "#send")
    press(page, page.get_by_role("button", name="Send"))
    second = wait_for_answer(page, 2)
    expect(second).to_have_attribute("data-status", "complete")
    assert source_text(second) == "short and sweet"
    # The tier badge still opens its popover, on screen.
    press(page, page.locator("#tier-badge"))
    on_screen(page, "#tier-info")
    press(page, page.locator("#prompt"))  # focusing the box closes it
    expect(page.locator("#tier-info")).to_be_hidden()

    # A tall window again (the keyboard closed): the full composer, with its hints.
    page.set_viewport_size({"width": 360, "height": 740})
    expect(page.locator("#composer-keys")).to_be_visible()
    assert frames.of_type("error") == []
    assert errors == []
    page.context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_stop_takes_sends_place_on_a_phone_and_the_box_keeps_its_width(
    browser: Browser, server: str, device: str
) -> None:
    page, frames = open_page(browser, server, device)
    errors = watch_for_errors(page)
    touch = device != "desktop"
    box = page.locator("#prompt")
    draft = "And the second one?"
    # The draft fits on one line of the box as it is before an answer streams.
    press(page, box)
    page.keyboard.type(draft)
    idle = box.bounding_box()
    assert idle is not None
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.press("Backspace")
    expect(box).to_have_css("height", f"{idle['height']:g}px")
    send(page, "/long 400")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "streaming")
    stop = page.get_by_role("button", name="Stop")
    expect(stop).to_be_visible()

    # The same draft typed while it streams stays one line: Stop beside a greyed-out Send
    # left the box about half of a phone's width, and a one-line draft wrapped.
    press(page, box)
    page.keyboard.type(draft)
    streaming = box.bounding_box()
    assert streaming is not None
    assert streaming["height"] == pytest.approx(idle["height"], abs=1), (idle, streaming)
    if touch:
        # On a phone Stop takes Send's place (Send cannot send before the answer ends).
        expect(page.get_by_role("button", name="Send")).to_be_hidden()
        assert streaming["width"] >= 0.9 * idle["width"], (idle, streaming)
    else:
        # A desktop has room for both, and Send says it is waiting.
        expect(page.get_by_role("button", name="Send")).to_be_disabled()

    # The answer ends: Send is back where it was and sends the draft.
    press(page, stop)
    expect(answer).to_have_attribute("data-status", "stopped")
    expect(stop).to_be_hidden()
    send_button = page.get_by_role("button", name="Send")
    expect(send_button).to_be_enabled()
    assert send_button.bounding_box() is not None
    press(page, send_button)
    second = wait_for_answer(page, 2)
    expect(second).to_have_attribute("data-status", "complete")
    expect(page.locator("article.msg-user .body").last).to_have_text(draft)
    expect(box).to_have_value("")
    assert frames.of_type("error") == []
    assert errors == []
    page.context.close()

"""A 10,000-message conversation in a browser (issue 13, finding 17): the page opens at its
latest window; the reader scrolls up and clicks (or taps) "Load earlier messages", sees the
earlier messages in order with their place on screen kept; an edit of a loaded-earlier prompt
and its "2 / 2" version arrows work there. Desktop, and phones (360x740, touch)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.browser.browsing import (
    DEVICES,
    is_touch,
    open_chat,
    press,
    run_axe,
    signed_in_context,
    unique_name,
    watch_for_errors,
)
from tests.long_conversation import text_of
from tests.servers import ROOT, base_env, migrated_sqlite, running_chatsite

pytestmark = pytest.mark.browser

LONG = 10_000
WINDOW = 50


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    database_url = migrated_sqlite(tmp_path_factory.mktemp("paging"))
    with running_chatsite(database_url=database_url) as base:
        yield base, database_url


def seed(database_url: str, username: str) -> str:
    """A 10,000-message conversation of `username`, stored in one bulk insert; its id."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.long_conversation", username, str(LONG)],
        cwd=ROOT,
        env=base_env(DATABASE_URL=database_url),
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def numbers(page: Page) -> list[int]:
    """The seeded messages on show, by number, top to bottom (other messages are skipped)."""
    found = []
    for text in page.locator("#messages > article > .body").all_inner_texts():
        match = re.search(r"(?:prompt|answer) message (\d{5})\.", text)
        if match:
            found.append(int(match.group(1)))
    return found


def message(page: Page, i: int) -> Locator:
    return page.locator("#messages > article").filter(has_text=text_of(i).split(" Some")[0])


def top(locator: Locator) -> float:
    box = locator.bounding_box()
    assert box is not None
    return float(box["y"])


def scroll_to_top(page: Page) -> None:
    """Scroll the thread up to its top as the device's user would: on a touch screen,
    Chromium's own scroll gesture (its "touch" source does not scroll in headless Chromium
    here, so the platform's default source), the mouse wheel on a desktop."""
    box = page.locator("#messages").bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    touch = is_touch(page)
    cdp = page.context.new_cdp_session(page) if touch else None
    if not touch:
        page.mouse.move(x, y)
    for _ in range(60):
        if page.evaluate("document.getElementById('messages').scrollTop") == 0:
            return
        if cdp is not None:
            gesture = {"x": x, "y": y, "yDistance": 2000, "speed": 8000}
            cdp.send("Input.synthesizeScrollGesture", {**gesture, "gestureSourceType": "default"})
        else:
            page.mouse.wheel(0, -3000)
    raise AssertionError("the thread did not scroll to its top")


@pytest.mark.parametrize("device", list(DEVICES))
def test_load_earlier_messages_keeps_the_place_and_the_arrows_work_up_there(
    browser: Browser, server: tuple[str, str], device: str
) -> None:
    base, database_url = server
    username = unique_name("pager")
    context = signed_in_context(browser, base, username, **DEVICES[device])
    conversation = seed(database_url, username)
    page = open_chat(context, f"/c/{conversation}/")
    errors = watch_for_errors(page)

    # The page opens at the newest messages: only the latest window is there.
    expect(page.locator("#messages > article")).to_have_count(WINDOW)
    assert numbers(page) == list(range(LONG - WINDOW, LONG))
    expect(message(page, LONG - 1)).to_be_in_viewport()

    # Scroll up to the top of the thread, where the control is.
    load = page.get_by_role("button", name="Load earlier messages")
    scroll_to_top(page)
    expect(load).to_be_in_viewport()
    first = message(page, LONG - WINDOW)
    before = top(first)

    press(page, load)
    expect(page.locator("#messages > article")).to_have_count(2 * WINDOW)
    assert numbers(page) == list(range(LONG - 2 * WINDOW, LONG))
    # The message that was first on show stays where it was: the reader's place is kept.
    assert abs(top(first) - before) <= 2, (top(first), before)
    expect(page.locator("#announcer")).to_have_text(f"Showing {WINDOW} earlier messages.")
    expect(load).to_be_focused()  # the next control, for more

    # Edit a prompt up there: the new branch goes on from it, what followed it goes.
    edited = LONG - 2 * WINDOW + 20  # a prompt (even) in the window just loaded
    original = message(page, edited)
    original_mid = original.get_attribute("data-mid")
    press(page, original.get_by_role("button", name="Edit"))
    box = page.locator("#prompt")
    expect(box).to_have_value(text_of(edited))
    box.fill("/echo an edit far up")
    press(page, page.locator("#send"))
    answer = page.locator("article.msg-assistant").last
    expect(answer).to_have_attribute("data-status", "complete")
    expect(answer.locator(".body")).to_have_text("an edit far up")
    assert numbers(page) == list(range(LONG - 2 * WINDOW, edited))
    new_prompt = page.locator("article.msg-user").last
    expect(new_prompt.locator(".version-count")).to_have_text("2 / 2")

    # The arrows on that loaded-earlier message: back to the original and its long branch,
    # with the switched message kept in place, then forward to the edit again.
    where = top(new_prompt)
    press(page, new_prompt.get_by_role("button", name="Previous version"))
    switched = page.locator(f"#msg-{original_mid}")
    expect(switched.locator(".version-count")).to_have_text("1 / 2")
    shown = numbers(page)
    assert shown == list(range(shown[0], LONG)) and shown[0] <= edited, shown
    # versions.js keeps the switched message where the arrows were; on the iPhone profile it
    # lands ~23 px off (the layout settles after it places it), so: on screen, near there.
    expect(switched).to_be_in_viewport()
    assert abs(top(switched) - where) <= 40, (top(switched), where)
    expect(page.locator("#announcer")).to_have_text("Showing version 1 of 2.")
    press(page, switched.get_by_role("button", name="Next version"))
    expect(page.locator("article.msg-user").last.locator(".version-count")).to_have_text("2 / 2")
    expect(page.locator("article.msg-assistant").last.locator(".body")).to_have_text(
        "an edit far up"
    )
    assert numbers(page)[-1] == edited - 1
    assert run_axe(page) == []
    assert errors == []
    context.close()


@pytest.fixture(scope="module")
def small_windows(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Windows of 10: an edit five windows up is past what a switch shows in place (four)."""
    database_url = migrated_sqlite(tmp_path_factory.mktemp("paging-small"))
    with running_chatsite(database_url=database_url, CHAT_THREAD_WINDOW="10") as base:
        yield base, database_url


@pytest.mark.parametrize("device", ["desktop", "android"])
def test_switching_to_a_version_whose_branch_goes_on_far_shows_its_latest_messages(
    browser: Browser, small_windows: tuple[str, str], device: str
) -> None:
    base, database_url = small_windows
    username = unique_name("farpager")
    context = signed_in_context(browser, base, username, **DEVICES[device])
    conversation = seed(database_url, username)
    page = open_chat(context, f"/c/{conversation}/")
    errors = watch_for_errors(page)
    for loaded in range(2, 7):  # five more windows of 10: messages 9,940 to 9,999
        scroll_to_top(page)
        press(page, page.get_by_role("button", name="Load earlier messages"))
        expect(page.locator("#messages > article")).to_have_count(10 * loaded)
    assert numbers(page) == list(range(LONG - 60, LONG))
    edited = LONG - 56  # a prompt 56 messages above the end: more than four windows of 10
    press(page, message(page, edited).get_by_role("button", name="Edit"))
    page.locator("#prompt").fill("/echo far edit")
    press(page, page.locator("#send"))
    expect(page.locator("article.msg-assistant").last.locator(".body")).to_have_text("far edit")
    new_prompt = page.locator("article.msg-user").last
    press(page, new_prompt.get_by_role("button", name="Previous version"))
    # The original branch, from its latest message: the end of the thread is on screen.
    expect(message(page, LONG - 1)).to_be_in_viewport()
    assert numbers(page) == list(range(LONG - 10, LONG))
    expect(page.locator("#announcer")).to_have_text(
        "Showing the other version: the latest messages of its branch."
    )
    expect(page.locator("#messages")).to_be_focused()
    # And "Load earlier messages" still leads up to it, with its arrows.
    for _ in range(5):
        scroll_to_top(page)
        press(page, page.get_by_role("button", name="Load earlier messages"))
    expect(message(page, edited).locator(".version-count")).to_have_text("1 / 2")
    assert errors == []
    context.close()

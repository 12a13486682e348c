"""A refused resume (the user's answers were sent again too often: CHAT_RESUME_RATE) never
leaves a tab stuck and loses nothing: the page says why, keeps what it shows, asks again by
itself after the frame's `retry_after`, and then shows the whole answer live to its end. A
refused handshake (CHAT_SOCKET_RATE) reconnects by itself, no sooner than its `retry_after`.

The answer is held mid-way by a real TCP hop in front of the demo model
(tests/held_upstream.py), so it is streaming for as long as the test needs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from playwright.sync_api import Browser, WebSocket, expect

from chat.demo_upstream.answers import tokenize
from tests.browser.browsing import (
    DEVICES,
    PHONES,
    is_touch,
    open_chat,
    send,
    signed_in_context,
    source_text,
    wait_for_answer,
    watch_for_errors,
)
from tests.demo_server import running_demo_server
from tests.held_upstream import held_answers
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser

HEADINGS = 300
LONG = "# h\n" * HEADINGS + "The end."
HEADINGS_SHOWN = """
([mid, count]) => document.querySelectorAll(`#msg-${mid} > .body h1`).length >= count
"""


@pytest.mark.parametrize("device", ["desktop", PHONES[0]])
def test_a_refused_resume_is_asked_again_by_the_page_and_the_answer_ends_whole(
    browser: Browser, device: str
) -> None:
    with (
        running_demo_server() as demo,
        held_answers(demo, len(tokenize(LONG)) - 8) as hop,
        running_chatsite(LLM_BASE_URL=hop.url, CHAT_RESUME_RATE="1 per 4 seconds") as base,
    ):
        context = signed_in_context(browser, base, **DEVICES[device])
        page = open_chat(context)
        hop.arm()
        box = page.locator("#prompt")
        if device == "desktop":
            box.click()
            page.keyboard.insert_text("/echo " + LONG)
            box.press("Enter")
        else:
            send(page, "/echo " + LONG)
        answer = wait_for_answer(page, 1)
        hop.wait_held(1)
        mid = answer.get_attribute("data-mid")
        page.wait_for_function(HEADINGS_SHOWN, arg=[mid, HEADINGS - 10])

        page.reload()  # resumes the answer: the one resume the rate allows now
        wait_for_answer(page, 1)
        page.wait_for_function(HEADINGS_SHOWN, arg=[mid, HEADINGS - 10], timeout=20_000)
        frames: list[tuple[str, dict[str, Any]]] = []
        closes: list[int] = []

        def watch(ws: WebSocket) -> None:
            ws.on("framesent", lambda raw: frames.append(("sent", json.loads(raw))))
            ws.on(
                "framereceived",
                lambda raw: (
                    frames.append(("got", json.loads(raw)))
                    if isinstance(raw, str) and raw.startswith("{")
                    else None
                ),
            )
            ws.on("close", lambda _ws: closes.append(1))

        page.on("websocket", watch)
        page.reload()  # and again at once: this resume is refused
        errors = watch_for_errors(page)
        answer = wait_for_answer(page, 1)
        alert = page.locator('#alerts .alert[data-code="resume_limited"]')
        expect(alert).to_contain_text("goes on by itself")
        expect(alert.locator(".countdown")).to_have_count(0)  # nothing for the user to send
        expect(answer).to_have_attribute("data-status", "streaming")  # not failed, not lost
        refusal = next(f for way, f in frames if way == "got" and f.get("type") == "error")
        assert refusal["code"] == "rate_limited" and refusal["mid"] == mid

        # The page asks again by itself once `retry_after` has passed, on the same socket,
        # and this time the replay comes.
        def resumes() -> list[dict[str, Any]]:
            return [f for way, f in frames if way == "sent" and f.get("type") == "resume"]

        for _ in range(100):
            if len(resumes()) >= 2:
                break
            page.wait_for_timeout(100)
        assert len(resumes()) == 2 and all(f["mid"] == mid for f in resumes()), frames
        expect(alert).to_have_count(0)  # its retry took the alert away
        replayed = lambda: [  # noqa: E731
            f for way, f in frames if way == "got" and f.get("type") == "blocks"
        ]
        for _ in range(100):
            if replayed():
                break
            page.wait_for_timeout(100)
        assert replayed(), frames
        page.wait_for_function(HEADINGS_SHOWN, arg=[mid, HEADINGS - 10], timeout=20_000)
        hop.release()
        expect(answer).to_have_attribute("data-status", "complete", timeout=20_000)
        expect(answer.locator(".body h1")).to_have_count(HEADINGS)
        assert source_text(answer) == LONG
        assert closes == []  # one socket throughout: nothing reconnected to get it
        assert errors == []
        context.close()


@pytest.mark.parametrize("device", ["desktop", PHONES[0]])
def test_a_refused_handshake_reconnects_by_itself_after_its_wait(
    browser: Browser, device: str
) -> None:
    """Over CHAT_SOCKET_RATE the tab is told why (no countdown: there is nothing to send),
    closed with 4429, and reconnects by itself no sooner than the frame's `retry_after`."""
    with running_chatsite(CHAT_SOCKET_RATE="2 per 10 seconds") as base:
        context = signed_in_context(browser, base, **DEVICES[device])
        page = open_chat(context)  # the first handshake
        send(page, "/echo kept")
        expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
        page.reload()  # the second
        expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
        refused: list[float] = []
        opened: list[float] = []

        def watch(ws: WebSocket) -> None:
            opened.append(time.monotonic())
            ws.on(
                "framereceived",
                lambda raw: (
                    refused.append(time.monotonic())
                    if isinstance(raw, str) and '"rate_limited"' in raw
                    else None
                ),
            )

        page.on("websocket", watch)
        page.reload()  # the third, within the window: refused
        errors = watch_for_errors(page)
        alert = page.locator('#alerts .alert[data-code="rate_limited"]')
        expect(alert).to_contain_text("connects again by itself")
        expect(alert.locator(".countdown")).to_have_count(0)
        expect(page.locator("#connection")).to_have_attribute(
            "data-state", "connected", timeout=20_000
        )
        assert refused and len(opened) >= 2
        # It waited for the window instead of retrying at once (the first retry's backoff is
        # under half a second): the socket that got in opened at least a second later.
        assert opened[-1] - refused[0] >= 1.0, (refused, opened)
        answer = wait_for_answer(page, 1)  # the page and its answer are all there
        expect(answer).to_have_attribute("data-status", "complete")
        assert source_text(answer) == "kept"
        assert errors == []
        context.close()


@pytest.mark.parametrize("device", ["desktop", PHONES[0]])
def test_stop_while_a_resume_is_refused_ends_with_the_saved_answer(
    browser: Browser, device: str
) -> None:
    """The hostile review: with the answer's resume refused, Stop (pressed twice, since the
    first seemed to do nothing: this tab did not follow the answer) got a `done` and the tab
    showed the answer stopped with no text at all, for good, under an alert that never went.
    Now a `done` for an answer this tab has not seen whole asks for the saved answer."""
    with (
        running_demo_server() as demo,
        held_answers(demo, len(tokenize(LONG)) - 8) as hop,
        running_chatsite(LLM_BASE_URL=hop.url, CHAT_RESUME_RATE="1 per 5 seconds") as base,
    ):
        context = signed_in_context(browser, base, **DEVICES[device])
        page = open_chat(context)
        hop.arm()
        send(page, "/echo " + LONG)
        answer = wait_for_answer(page, 1)
        hop.wait_held(1)
        mid = answer.get_attribute("data-mid")
        page.wait_for_function(HEADINGS_SHOWN, arg=[mid, HEADINGS - 10])
        page.reload()  # the one resume the rate allows
        page.wait_for_function(HEADINGS_SHOWN, arg=[mid, HEADINGS - 10], timeout=20_000)
        page.reload()  # refused
        errors = watch_for_errors(page)
        answer = wait_for_answer(page, 1)
        alert = page.locator('#alerts .alert[data-code="resume_limited"]')
        expect(alert).to_contain_text("goes on by itself")
        stop = page.locator("#stop")
        for _ in range(2):  # the second Stop of a stopped answer gets its `done`
            if is_touch(page):
                stop.tap()
            else:
                stop.click()
            page.wait_for_timeout(300)
        expect(answer).to_have_attribute("data-status", "stopped", timeout=20_000)
        expect(answer.locator(".body h1").first).to_be_visible()
        text = source_text(answer)
        assert text and LONG.startswith(text), text[:80]
        expect(alert).to_have_count(0)
        assert errors == []
        context.close()

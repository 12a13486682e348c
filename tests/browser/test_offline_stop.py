"""Stop pressed while the connection is down: kept, sent when the socket is back (before the
resume), and the answer ends stopped. It used to be dropped, and the answer ran to its end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    DEVICES,
    Frames,
    answers,
    long_text,
    press,
    send,
    signed_in_context,
    source_text,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser

LENGTH = 2000


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # 2,000 tokens at 40 a second: still streaming long after the test has pressed Stop.
    with running_chatsite(DEMO_TOKENS_PER_SECOND="40") as base:
        yield base


@pytest.mark.parametrize("device", list(DEVICES))
def test_stop_pressed_while_offline_is_sent_on_reconnect_and_the_answer_ends_stopped(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = context.new_page()
    frames = Frames(page)
    errors = watch_for_errors(page)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, f"/long {LENGTH}")
    answer = wait_for_answer(page, 1)
    page.wait_for_function(
        "(el) => el.querySelector('.body').textContent.length > 40", arg=answer.element_handle()
    )
    mid = answer.get_attribute("data-mid")

    context.set_offline(True)
    expect(page.locator("#connection")).to_have_attribute("data-state", "offline")
    stop = page.get_by_role("button", name="Stop")
    press(page, stop)
    expect(page.locator("#composer-status")).to_have_text(
        "Offline. This answer will stop when reconnected."
    )
    expect(answer).to_have_attribute("data-status", "streaming")
    assert frames.of_type("stop", sent=True) == []  # nothing could go

    context.set_offline(False)
    expect(answer).to_have_attribute("data-status", "stopped")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    # On the new socket the stop went first, before the answer was asked for again.
    after_reconnect = [f for f in frames.sent if f.get("mid") == mid][-2:]
    assert [f["type"] for f in after_reconnect] == ["stop", "resume"]
    text = source_text(answer)
    whole = long_text(LENGTH)
    assert whole.startswith(text)
    assert len(text) < len(whole)
    expect(page.locator("#composer-status")).to_have_text("")

    page.reload()  # the server kept it stopped
    expect(answers(page)).to_have_count(1)
    expect(answers(page).first).to_have_attribute("data-status", "stopped")
    assert errors == []
    context.close()

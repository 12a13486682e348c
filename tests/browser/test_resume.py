"""No answer is lost to the network: offline mid-answer, a reload mid-answer, a second tab."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from playwright.sync_api import Browser, Locator, Page, WebSocket, expect

from chat.demo_upstream.answers import tokenize
from tests.browser.browsing import (
    DEVICES,
    PHONES,
    long_text,
    open_chat,
    send,
    signed_in_context,
    source_text,
    streamed_text,
    wait_for_answer,
    watch_for_errors,
)
from tests.demo_server import running_demo_server
from tests.held_upstream import held_answers
from tests.servers import free_port, migrated_sqlite, running_chatsite
from tests.test_reliability_restart import daphne_pid

REDIS_URL = "redis://127.0.0.1:6379/0"

pytestmark = pytest.mark.browser

TOKENS = 400  # about 4 s at 100 tokens/s: long enough to break the connection in the middle


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite(DEMO_TOKENS_PER_SECOND="100", DEMO_TTFB_MS="0") as base:
        yield base


def wait_for_some_text(page: Page, answer_index: int = 0, chars: int = 40) -> None:
    page.wait_for_function(
        """([i, chars]) => {
            const a = document.querySelectorAll('article.msg-assistant')[i];
            return a && a.querySelector('.body').textContent.length > chars;
        }""",
        arg=[answer_index, chars],
    )


def assert_shown_exactly_once(page: Page, answer: Locator) -> None:
    """The answer completed, and while it streamed it showed every character once, in order."""
    expect(answer).to_have_attribute("data-status", "complete", timeout=20_000)
    whole = long_text(TOKENS)
    assert source_text(answer) == whole  # the server saved all of it
    mid = answer.get_attribute("data-mid") or ""
    # What the answer showed while it streamed (rendered block by block, so compared word by
    # word): the answer's beginning, with no gap and no repeat; at the end, all of it.
    streamed = (streamed_text(page, mid) or "").split()
    assert streamed and streamed == whole.split()[: len(streamed)]
    assert answer.locator(".body").evaluate("b => b.textContent").split() == whole.split()


def test_an_answer_survives_going_offline_and_back_mid_stream(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = context.new_page()
    sockets: list[WebSocket] = []
    page.on("websocket", lambda ws: sockets.append(ws))
    errors = watch_for_errors(page)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")

    send(page, f"/long {TOKENS}")
    answer = wait_for_answer(page, 1)
    wait_for_some_text(page)
    context.set_offline(True)
    expect(page.locator("#connection")).to_have_attribute("data-state", "offline")
    expect(page.locator("#connection")).to_contain_text("Offline")
    shown = answer.locator(".body").evaluate("b => b.textContent.length")
    time.sleep(0.8)  # the turn goes on without us meanwhile
    context.set_offline(False)

    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    # The answer was still streaming when we came back: the rest came by `resume` on a new
    # socket, not as the final HTML alone.
    assert len(sockets) >= 2
    page.wait_for_function(
        "([el, n]) => el.dataset.status !== 'streaming'"
        " || el.querySelector('.body').textContent.length > n",
        arg=[answer.element_handle(), shown],
    )
    assert_shown_exactly_once(page, answer)
    assert errors == []
    context.close()


def test_an_answer_survives_a_reload_mid_stream(browser: Browser, server: str) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, f"/long {TOKENS}")
    wait_for_answer(page, 1)
    wait_for_some_text(page)

    page.reload()
    answer = wait_for_answer(page, 1)
    # The reloaded page shows the answer still streaming and follows it to the end.
    expect(answer).to_have_attribute("data-status", "streaming")
    expect(page.locator("#stop")).to_be_visible()
    assert_shown_exactly_once(page, answer)
    assert errors == []
    context.close()


def test_a_second_tab_on_the_conversation_sees_the_answer_live(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    first = open_chat(context)
    send(first, "/echo start")
    expect(wait_for_answer(first, 1)).to_have_attribute("data-status", "complete")
    second = open_chat(context, first.url)
    errors = watch_for_errors(second)

    send(first, f"/long {TOKENS}")
    # The other tab gets the new exchange and streams the answer as it is written.
    answer = wait_for_answer(second, 2)
    expect(second.locator("article.msg-user .body").nth(1)).to_have_text(f"/long {TOKENS}")
    wait_for_some_text(second, answer_index=1)
    expect(answer).to_have_attribute("data-status", "streaming")
    assert_shown_exactly_once(second, answer)
    assert_shown_exactly_once(first, wait_for_answer(first, 2))
    assert errors == []
    context.close()


def test_a_tab_whose_server_crashed_mid_answer_shows_it_failed_with_its_text_and_works(
    browser: Browser, tmp_path: Path
) -> None:
    # The review's stuck tab (issue 13, finding 7): after a SIGKILL and a restart the answer
    # stayed `streaming`, Stop did nothing and the box stayed disabled until a reload.
    port = free_port()
    database = migrated_sqlite(tmp_path)
    prefix = f"test:{uuid.uuid4().hex[:10]}:"
    env = {
        "REDIS_URL": REDIS_URL,  # the stream log outlives the process
        "CHAT_REDIS_PREFIX": prefix,
        "CHAT_INSTANCE_ID": "crashed",
        "DEMO_TOKENS_PER_SECOND": "200",
        "DEMO_TTFB_MS": "0",
        "CHAT_CHECKPOINT_SECONDS": "2",
    }
    try:
        with running_chatsite(database_url=database, port=port, **env) as base:
            context = signed_in_context(browser, base)
            page = open_chat(context)
            errors = watch_for_errors(page)
            send(page, "/long 3000")
            answer = wait_for_answer(page, 1)
            wait_for_some_text(page, chars=1500)
            os.kill(daphne_pid(port), signal.SIGKILL)
            expect(page.locator("#connection")).to_have_attribute("data-state", "reconnecting")
            shown = answer.locator(".body").evaluate("b => b.textContent")
        # The same instance comes back on the same address; the tab reconnects by itself.
        with running_chatsite(database_url=database, port=port, **env):
            expect(answer).to_have_attribute("data-status", "failed", timeout=40_000)
            expect(answer.locator(".note.error")).to_contain_text("interrupted")
            # Everything the tab showed is still there (and maybe the little it missed). It
            # showed the answer rendered (paragraphs, not blank lines): compared word by word,
            # its last word perhaps half written.
            words, saved = shown.split(), source_text(answer).split()
            assert words[:-1] == saved[: len(words) - 1]
            assert saved[len(words) - 1].startswith(words[-1])
            assert (
                answer.locator(".body").evaluate("b => b.textContent").startswith(shown.split()[0])
            )
            expect(page.locator("#stop")).to_be_hidden()
            expect(answer.locator("button.retry")).to_be_visible()
            # The box works: the next prompt is sent and answered.
            send(page, "/echo back after the crash")
            second = wait_for_answer(page, 2)
            expect(second).to_have_attribute("data-status", "complete", timeout=20_000)
            expect(second.locator(".body")).to_have_text("back after the crash")
            assert errors == []
            context.close()
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()


# An answer of thousands of one-line headings (tests/test_resume_replay.py): resuming it replayed
# one frame per block, and the outbox's cap closed the tab with 4408 on every resume.
HEADINGS = 2600
LONG = "# h\n" * HEADINGS + "The end."
HEADINGS_SHOWN = """
([mid, count]) => document.querySelectorAll(`#msg-${mid} > .body h1`).length >= count
"""


@pytest.mark.parametrize("device", ["desktop", PHONES[0]])
def test_a_reload_mid_answer_of_thousands_of_blocks_shows_them_all_and_goes_on(
    browser: Browser, device: str
) -> None:
    with (
        running_demo_server() as demo,
        held_answers(demo, len(tokenize(LONG)) - 8) as hop,
        # 5,200 tokens: over the default cap of one answer (4,096).
        running_chatsite(LLM_BASE_URL=hop.url, CHAT_RESERVE_TOKENS="8192") as base,
    ):
        context = signed_in_context(browser, base, **DEVICES[device])
        page = open_chat(context)
        hop.arm()
        # Pasted, then sent (typing 2,600 lines with Shift+Enter takes minutes).
        box = page.locator("#prompt")
        expect(box).to_be_editable(timeout=60_000)
        if device == "desktop":
            box.click()
            page.keyboard.insert_text("/echo " + LONG)
            box.press("Enter")
        else:
            send(page, "/echo " + LONG)  # a tap, the text put in, a tap on Send
        answer = wait_for_answer(page, 1)
        hop.wait_held(1)
        mid = answer.get_attribute("data-mid")
        page.wait_for_function(HEADINGS_SHOWN, arg=[mid, HEADINGS - 10])

        page.reload()  # the page resumes the answer from its start
        errors = watch_for_errors(page)
        closes = []
        page.on("websocket", lambda ws: ws.on("close", lambda _ws: closes.append(1)))
        answer = wait_for_answer(page, 1)
        page.wait_for_function(HEADINGS_SHOWN, arg=[mid, HEADINGS - 10], timeout=20_000)
        expect(answer).to_have_attribute("data-status", "streaming")
        hop.release()
        expect(answer).to_have_attribute("data-status", "complete", timeout=20_000)
        expect(answer.locator(".body h1")).to_have_count(HEADINGS)
        expect(answer.locator(".body > p")).to_have_text("The end.")
        assert source_text(answer) == LONG
        assert closes == []  # never cut as a slow reader: one socket throughout
        assert errors == []
        context.close()

"""The chat in a real browser: sign up, ask, watch the answer stream, stop, retry, the sidebar."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    PASSWORD,
    answers,
    long_text,
    new_context,
    open_chat,
    send,
    signed_in_context,
    source_text,
    statuses,
    unique_name,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser

MARKDOWN = (
    "Here is **bold** text, `inline code` and a list:\n\n- first item\n- second item\n\n"
    + " ".join(["The answer keeps going so that it streams for a while."] * 6)
)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # 50 tokens/s: slow enough to watch an answer stream and to stop a long one mid-way.
    with running_chatsite(DEMO_TOKENS_PER_SECOND="50", DEMO_TTFB_MS="0") as base:
        yield base


def test_a_newcomer_signs_up_and_watches_the_answer_think_stream_and_render(
    browser: Browser, server: str
) -> None:
    context = new_context(browser, server)
    page = context.new_page()
    errors = watch_for_errors(page)
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))
    page.get_by_role("link", name="Create an account").click()
    page.fill("#id_username", unique_name("newcomer"))
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.get_by_role("button", name="Sign up").click()
    expect(page).to_have_url(f"{server}/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    # The first-run page says what answers; how to point at a real model is for staff only.
    empty = page.locator("#empty-state")
    expect(empty).to_contain_text("built-in demo model")
    expect(empty).not_to_contain_text("LLM_BASE_URL")
    expect(page.locator("#prompt")).to_be_focused()

    send(page, "/stall 1 /echo " + MARKDOWN)
    answer = wait_for_answer(page, 1)
    expect(page.locator("article.msg-user .body")).to_have_text("/stall 1 /echo " + MARKDOWN)
    # Before the first token: the thinking state, and the box waits with a visible reason.
    expect(answer).to_have_attribute("data-status", "streaming")
    assert answer.locator(".body").evaluate("b => b.textContent") == ""
    thinking = answer.locator(".body").evaluate("b => getComputedStyle(b, '::before').content")
    assert "Thinking" in thinking
    expect(page.locator("#prompt")).to_be_editable()  # the next question can be typed
    expect(page.locator("#send")).to_be_disabled()
    expect(page.locator("#composer-status")).to_contain_text("Esc stops")
    expect(page.locator("#stop")).to_be_visible()
    # Then the text streams in, formatted as it comes (never the raw markdown) ...
    page.wait_for_function(
        """() => {
            const a = document.querySelector('article.msg-assistant');
            return a.dataset.status === 'streaming' && a.querySelector('.body strong');
        }"""
    )
    expect(answer.locator(".body")).to_contain_text("Here is bold")
    assert "**" not in answer.locator(".body").inner_text()
    # ... and ends rendered from markdown.
    expect(answer).to_have_attribute("data-status", "complete")
    expect(answer.locator(".body strong")).to_have_text("bold")
    expect(answer.locator(".body code").first).to_have_text("inline code")
    expect(answer.locator(".body li")).to_have_count(2)
    assert "**" not in answer.locator(".body").inner_text()
    assert statuses(page, answer.get_attribute("data-mid") or "") == ["streaming", "complete"]
    # The page became the conversation's page, first in the sidebar, titled by the prompt.
    expect(page).to_have_url(re.compile(r"/c/[0-9a-f-]{36}/$"))
    conversation = page.url.rstrip("/").rsplit("/", 1)[1]
    first = page.locator("#conversation-list > li.conv").first
    expect(first).to_have_id(f"conv-{conversation}")
    expect(first).to_have_class(re.compile(r"\bcurrent\b"))
    expect(page.locator("#chat-title")).to_have_text(re.compile(r"^/stall 1 /echo Here is"))
    expect(page.locator("#prompt")).to_be_enabled()
    expect(page.locator("#prompt")).to_be_focused()
    expect(page.locator("#stop")).to_be_hidden()
    assert errors == []
    context.close()


def test_shift_enter_makes_a_new_line_and_enter_sends(browser: Browser, server: str) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    box = page.locator("#prompt")
    box.click()
    box.press_sequentially("/echo line one")
    box.press("Shift+Enter")
    box.press_sequentially("line two")
    expect(box).to_have_value("/echo line one\nline two")
    expect(answers(page)).to_have_count(0)  # Shift+Enter did not send
    box.press("Enter")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")
    assert source_text(answer) == "line one\nline two"
    expect(box).to_have_value("")
    context.close()


def test_stop_and_esc_keep_what_was_said_and_a_reload_finds_every_answer_saved(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    errors = watch_for_errors(page)
    whole = long_text(3000)

    send(page, "/echo first answer")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")

    kept: list[str] = []
    for how in ("button", "escape"):
        send(page, "/long 3000")
        answer = wait_for_answer(page, len(kept) + 2)
        page.wait_for_function(
            "(el) => el.querySelector('.body').textContent.length > 80", arg=answer.element_handle()
        )
        if how == "button":
            page.get_by_role("button", name="Stop").click()
        else:
            page.keyboard.press("Escape")
        expect(answer).to_have_attribute("data-status", "stopped")
        expect(answer.locator(".msg-footer")).to_contain_text("Stopped")
        text = source_text(answer)
        # What was said so far is kept: a real part of the answer, far from all of it.
        assert 80 <= len(text) < len(whole) // 2
        assert whole.startswith(text)
        assert answer.locator(".body").inner_text().split()[:5] == text.split()[:5]
        expect(page.locator("#prompt")).to_be_enabled()
        expect(page.locator("#prompt")).to_be_focused()
        kept.append(text)

    page.reload()
    expect(answers(page)).to_have_count(3)
    saved = answers(page)
    expect(saved.nth(0)).to_have_attribute("data-status", "complete")
    assert source_text(saved.nth(0)) == "first answer"
    for i, text in enumerate(kept, start=1):
        expect(saved.nth(i)).to_have_attribute("data-status", "stopped")
        assert source_text(saved.nth(i)) == text
    assert errors == []
    context.close()


def test_a_failed_answer_says_so_and_retry_asks_again_without_touching_the_box(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    send(page, "/fail 500")
    failed = wait_for_answer(page, 1)
    expect(failed).to_have_attribute("data-status", "failed")
    expect(failed.locator(".note.error")).to_be_visible()
    page.locator("#prompt").fill("a draft I am still writing")
    failed_mid = failed.get_attribute("data-mid") or ""
    failed.get_by_role("button", name="Retry").click()
    # The same prompt is asked again as a new version of the answer (tests/browser/
    # test_versions.py follows the versions); the draft in the box is left alone.
    retried = wait_for_answer(page, 1)
    expect(retried).not_to_have_attribute("data-mid", failed_mid)
    expect(retried).to_have_attribute("data-status", "failed")
    expect(page.locator("article.msg-user .body")).to_have_text(["/fail 500"])
    expect(page.locator("#prompt")).to_have_value("a draft I am still writing")
    context.close()


def test_the_sidebar_lists_renames_and_deletes_conversations(browser: Browser, server: str) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    errors = watch_for_errors(page)
    page.on("dialog", lambda dialog: dialog.accept())  # hx-confirm asks before deleting

    send(page, "/echo alpha")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    alpha = page.url
    page.keyboard.press("Control+Shift+O")  # a new chat
    expect(page).to_have_url(f"{server}/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, "/echo beta")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    titles = page.locator("#conversation-list > li.conv > a")
    expect(titles).to_have_text(["/echo beta", "/echo alpha"])

    # Writing in an older conversation moves it to the top.
    page.get_by_role("link", name="/echo alpha").click()
    expect(page).to_have_url(alpha)
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, "/echo again")
    expect(wait_for_answer(page, 2)).to_have_attribute("data-status", "complete")
    expect(titles).to_have_text(["/echo alpha", "/echo beta"])
    expect(page.locator("#conversation-list > li.current > a")).to_have_text("/echo alpha")

    # Rename the open conversation: the sidebar and the page title follow (htmx + CSRF).
    current = page.locator("#conversation-list > li.current")
    current.locator("summary").click()
    current.get_by_label("New title").fill("Renamed in the browser")
    with page.expect_request(re.compile(r"/rename/$")) as renamed:
        current.get_by_role("button", name="Rename").click()
    # The token comes from hx-headers on <body> (Django masks it, so it differs from the cookie).
    assert len(renamed.value.headers.get("x-csrftoken", "")) == 64
    expect(titles.first).to_have_text("Renamed in the browser")
    expect(page.locator("#chat-title")).to_have_text("Renamed in the browser")
    expect(page).to_have_title(re.compile("^Renamed in the browser"))
    expect(page.locator("#prompt")).to_be_focused()

    # Delete the other one: it leaves the list and stays gone after a reload.
    other = page.locator("#conversation-list > li.conv").nth(1)
    other.locator("summary").click()
    other.get_by_role("button", name="Delete").click()
    expect(titles).to_have_text(["Renamed in the browser"])
    page.reload()
    expect(titles).to_have_text(["Renamed in the browser"])

    # Delete the open one: back to a new chat.
    current = page.locator("#conversation-list > li.current")
    current.locator("summary").click()
    current.get_by_role("button", name="Delete").click()
    expect(page).to_have_url(f"{server}/")
    expect(page.locator("#conversation-list li.empty")).to_be_visible()
    assert errors == []
    context.close()


def test_someone_elses_conversation_is_not_found(browser: Browser, server: str) -> None:
    alice = signed_in_context(browser, server)
    page = open_chat(alice)
    send(page, "/echo private")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    url = page.url
    alice.close()

    bob = signed_in_context(browser, server)
    response = bob.new_page().goto(url)
    assert response is not None
    assert response.status == 404
    bob.close()

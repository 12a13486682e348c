"""Edit and resend, regenerate, retry and the "2 / 3" version arrows in a browser; the meter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, WebSocket, expect

from tests.browser.browsing import (
    DEVICES,
    answers,
    open_chat,
    press,
    run_axe,
    send,
    signed_in_context,
    type_prompt,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser

CLIPBOARD = ["clipboard-read", "clipboard-write"]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # A daily quota, so that done frames carry the server's count of tokens left.
    with running_chatsite(CHAT_DAILY_TOKENS="50000") as base:
        yield base


def thread(page: Page) -> Locator:
    """The bodies of the messages on show, in order."""
    return page.locator("#messages > article > .body")


def prompts(page: Page) -> Locator:
    return page.locator("article.msg-user")


def version(message: Locator) -> Locator:
    return message.locator(".version-count")


def ask(page: Page, text: str, count: int) -> Locator:
    send(page, text)
    answer = wait_for_answer(page, count)
    expect(answer).not_to_have_attribute("data-status", "streaming")
    return answer


def copied(page: Page, answer: Locator) -> str:
    answer.get_by_role("button", name="Copy answer").click()
    expect(answer.get_by_role("button", name="Copy answer")).to_have_text("Copied")
    text: str = page.evaluate("() => navigator.clipboard.readText()")
    return text


@pytest.mark.parametrize("device", ["desktop", "android"])
def test_the_hint_under_the_box_names_save_and_send_while_editing(
    browser: Browser, server: str, device: str
) -> None:
    # The new user's review, on a phone: the hint said "Send button sends" while the button
    # read "Save & send".
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    ask(page, "/echo one", 1)
    keys, send_button = page.locator("#composer-keys"), page.locator("#send")
    plain = keys.text_content()
    press(page, prompts(page).first.get_by_role("button", name="Edit"))
    expect(send_button).to_have_text("Save & send")
    expect(keys).to_contain_text("Save & send" if device != "desktop" else "saves & sends")
    press(page, page.get_by_role("button", name="Cancel"))
    expect(send_button).to_have_text("Send")
    expect(keys).to_have_text(plain or "")
    context.close()


def test_editing_an_earlier_prompt_shows_the_new_branch_and_the_arrows_switch_back(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server, permissions=CLIPBOARD)
    page = open_chat(context)
    errors = watch_for_errors(page)
    ask(page, "/echo one", 1)
    ask(page, "/echo two", 2)
    box, editing = page.locator("#prompt"), page.locator("#editing")
    send_button = page.locator("#send")
    box.fill("a draft I am still writing")

    # Edit puts the prompt in the box, says so, and Esc gives the draft back.
    prompts(page).first.get_by_role("button", name="Edit").click()
    expect(box).to_have_value("/echo one")
    expect(box).to_be_focused()
    expect(editing).to_be_visible()
    expect(editing).to_contain_text("Editing an earlier message — Esc or Cancel to stop editing")
    expect(send_button).to_have_text("Save & send")
    page.keyboard.press("Escape")
    expect(editing).to_be_hidden()
    expect(send_button).to_have_text("Send")
    expect(box).to_have_value("a draft I am still writing")

    # Save & send: the conversation goes on from the edited prompt, on a new branch.
    prompts(page).first.get_by_role("button", name="Edit").click()
    box.fill("/echo uno")
    box.press("Enter")
    expect(thread(page)).to_have_text(["/echo uno", "uno"])
    expect(answers(page).first).to_have_attribute("data-status", "complete")
    expect(version(prompts(page).first)).to_have_text("2 / 2")
    expect(editing).to_be_hidden()
    expect(box).to_have_value("a draft I am still writing")  # the draft comes back
    assert copied(page, answers(page).first) == "uno"

    # The arrows switch back: the old prompt, its answer and what followed reappear.
    prompts(page).first.get_by_role("button", name="Previous version").click()
    expect(thread(page)).to_have_text(["/echo one", "one", "/echo two", "two"])
    first = prompts(page).first
    expect(version(first)).to_have_text("1 / 2")
    expect(first.get_by_role("button", name="Previous version")).to_be_disabled()
    expect(first.get_by_role("button", name="Next version")).to_be_focused()
    expect(page.locator("#announcer")).to_have_text("Showing version 1 of 2.")
    assert copied(page, answers(page).first) == "one"  # copy works on every version

    # An edit the server refuses (its prompt left the branch on show) keeps the text and mode.
    prompts(page).nth(1).get_by_role("button", name="Edit").click()
    first.get_by_role("button", name="Next version").click()
    expect(thread(page)).to_have_text(["/echo uno", "uno"])
    box.fill("/echo dos")
    box.press("Enter")
    expect(page.locator("#alerts .alert")).to_have_attribute("data-code", "not_found")
    expect(box).to_have_value("/echo dos")
    expect(editing).to_be_visible()
    assert run_axe(page) == []  # arrows, Edit, Regenerate and the editing line included
    editing.get_by_role("button", name="Cancel").click()
    expect(box).to_have_value("a draft I am still writing")
    expect(thread(page)).to_have_text(["/echo uno", "uno"])

    # The branch on show is saved: a reload shows it, and the old one is still a click away.
    page.reload()
    expect(thread(page)).to_have_text(["/echo uno", "uno"])
    prompts(page).first.get_by_role("button", name="Previous version").click()
    expect(thread(page)).to_have_text(["/echo one", "one", "/echo two", "two"])
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_editing_note_names_the_way_out_this_device_has(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    ask(page, "/echo one", 1)
    type_prompt(page, "a draft")
    editing = page.locator("#editing")
    press(page, prompts(page).first.get_by_role("button", name="Edit"))
    expect(editing).to_be_visible()
    if device == "desktop":
        expect(editing).to_contain_text(
            "Editing an earlier message — Esc or Cancel to stop editing"
        )
        page.keyboard.press("Escape")
    else:
        # A phone's on-screen keyboard has no Esc key: the note says what there is to tap.
        expect(editing).to_contain_text("Editing an earlier message — Tap Cancel to stop editing")
        expect(editing).not_to_contain_text("Esc")
        press(page, editing.get_by_role("button", name="Cancel"))
    expect(editing).to_be_hidden()
    expect(page.locator("#prompt")).to_have_value("a draft")
    assert errors == []
    context.close()


def test_regenerate_adds_a_version_of_the_last_answer_that_other_tabs_follow(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    errors = watch_for_errors(page)
    ask(page, "/echo same", 1)
    # Half a second before the first token: the other tab hears of it while it streams.
    old = ask(page, "/stall 0.5 /echo again", 2)
    old_mid = old.get_attribute("data-mid")
    expect(answers(page).first.get_by_role("button", name="Regenerate")).to_have_count(0)
    other = open_chat(context, page.url)
    other_errors = watch_for_errors(other)

    old.get_by_role("button", name="Regenerate").click()
    expect(answers(page).nth(1)).not_to_have_attribute("data-mid", old_mid or "")
    new = answers(page).nth(1)
    new_mid = new.get_attribute("data-mid") or ""
    expect(new).to_have_attribute("data-status", "complete")
    expect(new.locator(".body")).to_have_text("again")
    # A version of the answer, not another exchange; the arrows survive the final HTML.
    expect(thread(page)).to_have_text(["/echo same", "same", "/stall 0.5 /echo again", "again"])
    expect(version(new)).to_have_text("2 / 2")
    expect(new.get_by_role("button", name="Regenerate")).to_be_visible()

    # The other tab shows the new thread and follows the answer to its end.
    followed = answers(other).nth(1)
    expect(followed).to_have_attribute("data-mid", new_mid)
    expect(followed).to_have_attribute("data-status", "complete")
    expect(followed.locator(".body")).to_have_text("again")
    expect(version(followed)).to_have_text("2 / 2")

    # Both versions stay reachable.
    new.get_by_role("button", name="Previous version").click()
    expect(answers(page).nth(1)).to_have_attribute("data-mid", old_mid or "")
    expect(version(answers(page).nth(1))).to_have_text("1 / 2")
    expect(answers(page).nth(1).get_by_role("button", name="Next version")).to_be_focused()
    page.keyboard.press("Enter")
    expect(answers(page).nth(1)).to_have_attribute("data-mid", new_mid)
    expect(version(answers(page).nth(1))).to_have_text("2 / 2")
    assert errors == [] and other_errors == []
    context.close()


def test_retry_on_a_failed_answer_adds_a_version_instead_of_asking_again(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    failed = ask(page, "/fail 500", 1)
    expect(failed).to_have_attribute("data-status", "failed")
    failed_mid = failed.get_attribute("data-mid") or ""
    page.locator("#prompt").fill("a draft I am still writing")

    failed.get_by_role("button", name="Retry").click()
    retried = answers(page).first
    expect(retried).not_to_have_attribute("data-mid", failed_mid)
    expect(retried).to_have_attribute("data-status", "failed")
    expect(version(retried)).to_have_text("2 / 2")
    # The prompt was not repeated in the thread, and the draft in the box was left alone.
    expect(prompts(page)).to_have_count(1)
    expect(answers(page)).to_have_count(1)
    expect(page.locator("#prompt")).to_have_value("a draft I am still writing")
    retried.get_by_role("button", name="Previous version").click()
    expect(answers(page).first).to_have_attribute("data-mid", failed_mid)
    expect(version(answers(page).first)).to_have_text("1 / 2")
    context.close()


def test_the_usage_meter_shows_the_servers_count_from_the_done_frame(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = context.new_page()
    received: list[str | bytes] = []

    def record(socket: WebSocket) -> None:
        # A plain function: Playwright tags its handlers, which a builtin method cannot take.
        socket.on("framereceived", lambda payload: received.append(payload))

    page.on("websocket", record)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    meter = page.locator("#usage-meter")
    expect(meter).to_have_text("50,000 tokens left today")

    # Another tab spends tokens; this page is not told, so its own estimate falls behind.
    other = open_chat(context)
    ask(other, "/long 200", 1)
    expect(meter).to_have_text("50,000 tokens left today")

    answer = ask(page, "/echo hello", 1)
    mid = answer.get_attribute("data-mid")
    expect(meter).not_to_have_text("50,000 tokens left today")
    done = _done_frame(page, received, mid or "")
    left = done["tokens_left"]
    expect(meter).to_have_text(f"{left:,} tokens left today")
    usage = done["usage"]
    # The exact count includes the other tab's answer: the estimate would show more.
    assert left < 50_000 - usage["prompt_tokens"] - usage["completion_tokens"]
    context.close()


def _done_frame(page: Page, received: list[str | bytes], mid: str) -> dict[str, Any]:
    for _ in range(50):  # frames reach this list as Playwright reports them
        for payload in received:
            if isinstance(payload, str) and payload.startswith("{"):
                frame: dict[str, Any] = json.loads(payload)
                if frame.get("type") == "done" and frame.get("mid") == mid:
                    return frame
        page.wait_for_timeout(20)
    raise AssertionError(f"no done frame for {mid}")

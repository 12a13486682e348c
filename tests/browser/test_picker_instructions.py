"""The model picker and the instructions, used as a person uses them, on a desktop and on
phones (issue 17.1 and 17.2): pick a model and see it on the answer; write custom instructions
and a conversation's system prompt and see them reach the model (a recording upstream)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    DEVICES,
    Frames,
    chatsite_with_database,
    is_touch,
    open_chat,
    open_system_prompt,
    press,
    send,
    signed_in_context,
    wait_for_answer,
    watch_for_errors,
)
from tests.demo_server import running_demo_server
from tests.recording_upstream import Recorded, recording_upstream

pytestmark = pytest.mark.browser

# As an admin would set it up in the admin: the full demo model is pickable on phones too.
SETUP = (
    "from chat.models import PickableModel\n"
    "PickableModel.objects.create(model='demo-full', label='Big demo', phones=True)\n"
)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Recorded]]:
    with (
        running_demo_server() as demo,
        recording_upstream(demo) as (url, recorded),
        chatsite_with_database(SETUP, LLM_BASE_URL=url) as (base, _),
    ):
        yield base, recorded


def pick(page: Page, label: str) -> None:
    """Choose a model in the composer's picker (a tap or a click on it first)."""
    picker = page.get_by_label("Model", exact=True)
    expect(picker).to_be_visible()
    press(page, picker)
    picker.select_option(label=label)


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_picked_model_answers_and_is_shown_on_the_answer(
    browser: Browser, server: tuple[str, Recorded], device: str
) -> None:
    base, recorded = server
    context = signed_in_context(browser, base, **DEVICES[device])
    page = context.new_page()
    errors = watch_for_errors(page)
    frames = Frames(page)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    ready = frames.of_type("ready")[-1]
    default = ready["models"][0]["id"]
    # The other model than the device's default: lite on a desktop, the full one on a phone.
    other = next(m for m in ready["models"] if m["id"] != default)
    badge = page.locator("#tier-badge")
    expect(badge).not_to_contain_text("picked")
    pick(page, other["label"])
    # The badge under the box names what will answer now, not the device's default.
    expect(badge).to_contain_text(f"{other['label']} · picked")
    send(page, "/echo which model?")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")
    expect(answer.locator(".meta .model")).to_have_text(other["id"])
    # Its details line says it was picked: not "<model> · <the device's> tier", which named a
    # tier whose default did not answer (from a review).
    picked_details = f"{other['id']} · picked · "
    expect(answer.locator(".answer-details")).to_contain_text(picked_details)
    expect(answer.locator(".answer-details")).not_to_contain_text("tier")
    assert frames.of_type("prompt", sent=True)[-1]["model"] == other["id"]
    # The answer's request went to the picked model (the title request after it goes to the
    # lite model whatever was picked: it is not the answer's).
    answered = [
        r["model"]
        for r in recorded.snapshot()
        if not str(r["messages"][0].get("content", "")).startswith("Write a short title")
    ]
    assert answered[-1] == other["id"]
    # The pick stays with the conversation: after a reload it is still selected.
    page.reload()
    expect(page.get_by_label("Model", exact=True)).to_have_value(other["id"])
    expect(badge).to_contain_text(f"{other['label']} · picked")
    answer = wait_for_answer(page, 1)
    expect(answer.locator(".answer-details")).to_contain_text(picked_details)  # as it was live
    pick(page, ready["models"][0]["label"])  # back to the default: the badge says the tier
    expect(badge).not_to_contain_text("picked")
    # The tier's default answers the next prompt, and its details name the tier.
    send(page, "/echo and now?")
    answer = wait_for_answer(page, 2)
    expect(answer).to_have_attribute("data-status", "complete")
    tier_details = f"{default} · {ready['tier']} tier · "
    expect(answer.locator(".answer-details")).to_contain_text(tier_details)
    page.reload()
    expect(wait_for_answer(page, 2).locator(".answer-details")).to_contain_text(tier_details)
    expect(page.locator("article.msg-assistant .answer-details").first).to_contain_text(
        picked_details
    )
    assert errors == []
    context.close()


def open_settings(page: Page) -> None:
    if is_touch(page):
        press(page, page.get_by_role("button", name="Open the conversation list"))
    press(page, page.get_by_role("link", name="Settings"))
    expect(page.get_by_role("heading", name="Settings")).to_be_visible()


@pytest.mark.parametrize("device", list(DEVICES))
def test_instructions_and_a_system_prompt_reach_the_model(
    browser: Browser, server: tuple[str, Recorded], device: str
) -> None:
    base, recorded = server
    context = signed_in_context(browser, base, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    open_settings(page)
    box = page.get_by_label("Custom instructions")
    press(page, box)
    page.keyboard.insert_text(f"Answer like a pirate ({device}).")
    press(page, page.get_by_role("button", name="Save"))
    expect(page.get_by_role("status")).to_have_text("Saved. New answers follow these instructions.")
    press(page, page.get_by_role("link", name="← Back to the chat"))
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")

    send(page, "/echo-system")
    first = wait_for_answer(page, 1)
    expect(first).to_have_attribute("data-status", "complete")
    expect(first.locator(".body")).to_have_text(f"Answer like a pirate ({device}).")

    # The conversation's own system prompt, under ⚙ in its header (the page of the chat).
    page.wait_for_url("**/c/*/")
    open_system_prompt(page)
    prompt_box = page.get_by_label("System prompt for this conversation")
    press(page, prompt_box)
    page.keyboard.insert_text("Keep it short.")
    press(page, page.locator("#conversation-settings").get_by_role("button", name="Save"))
    expect(page.locator("#conversation-settings .saved")).to_have_text("Saved.")
    press(page, page.locator("#chat-title"))  # close it (a tap elsewhere)

    send(page, "/echo-system")
    second = wait_for_answer(page, 2)
    expect(second).to_have_attribute("data-status", "complete")
    expected = f"Answer like a pirate ({device}).\n\nKeep it short."
    assert recorded.snapshot()[-1]["messages"][0] == {"role": "system", "content": expected}
    expect(second.locator(".body")).to_contain_text("Keep it short.")
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_pick_sticks_to_its_conversation_as_soon_as_it_is_made(
    browser: Browser, server: tuple[str, Recorded], device: str
) -> None:
    """New-user review: a pick was forgotten on reload until a message was sent, and switching
    back to the default without sending still showed the old pick next time. And the badge's
    popover spoke of the device's tier as if nothing were picked."""
    base, _ = server
    context = signed_in_context(browser, base, **DEVICES[device])
    page = context.new_page()
    errors = watch_for_errors(page)
    frames = Frames(page)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    ready = frames.of_type("ready")[-1]
    default = ready["models"][0]
    other = next(m for m in ready["models"] if m["id"] != default["id"])
    picker = page.get_by_label("Model", exact=True)
    badge = page.locator("#tier-badge")

    # A new chat: the pick survives a reload before anything is sent.
    pick(page, other["label"])
    page.reload()
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    expect(picker).to_have_value(other["id"])
    expect(badge).to_contain_text(f"{other['label']} · picked")

    # The popover says what answers and how to go back, not the default's pitch or its switch.
    press(page, badge)
    info = page.locator("#tier-info")
    expect(info).to_be_visible()
    expect(info).to_contain_text(f"You picked {other['label']} for this conversation")
    expect(info).to_contain_text("Chosen because this looks like a")
    expect(info).not_to_contain_text("gives the best answers")
    expect(info).not_to_contain_text("smaller and faster")
    expect(info.locator("#tier-choice")).to_be_hidden()
    expect(info).not_to_contain_text("Why:")
    press(page, info.get_by_role("button", name="Close"))

    send(page, "/echo picked first")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")
    expect(answer.locator(".meta .model")).to_have_text(other["id"])
    page.wait_for_url("**/c/*/")
    conversation = page.url

    # In that conversation: back to the default, sent nowhere, then away and back.
    pick(page, default["label"])
    expect(badge).not_to_contain_text("picked")
    page.goto("/")  # a new chat starts from the device's default again
    expect(picker).to_have_value(default["id"])
    page.goto(conversation)
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    expect(picker).to_have_value(default["id"])
    expect(badge).not_to_contain_text("picked")
    press(page, badge)
    expect(info).to_be_visible()
    expect(info).not_to_contain_text("You picked")
    expect(info.locator("#tier-choice")).to_have_count(1)
    assert frames.of_type("prompt", sent=True)[-1]["text"] == "/echo picked first"
    assert errors == []
    context.close()

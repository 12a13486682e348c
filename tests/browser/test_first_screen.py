"""The first screen of a new chat, as a new user meets it on a desktop and on phones: written for
them (starter prompts that work), operator notes only where they belong, and its heading in view."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    DEVICES,
    chatsite_with_database,
    manage_shell,
    open_chat,
    press,
    signed_in_context,
    unique_name,
    wait_for_answer,
    watch_for_errors,
)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, str]]:
    with chatsite_with_database() as server:
        yield server


def make_staff(database_url: str, username: str) -> None:
    manage_shell(
        database_url,
        "from django.contrib.auth import get_user_model\n"
        f"get_user_model().objects.filter(username={username!r}).update(is_staff=True)\n",
    )


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_first_screen_opens_at_its_heading_and_a_starter_prompt_asks_it(
    browser: Browser, server: tuple[str, str], device: str
) -> None:
    base, _ = server
    context = signed_in_context(browser, base, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    heading = page.get_by_role("heading", name="What can I help with?")
    expect(heading).to_be_in_viewport()
    # Not scrolled past it (on a phone the first screen is taller than the screen).
    assert page.locator("#messages").evaluate("m => m.scrollTop") == 0
    starters = page.get_by_role("list", name="Starter prompts").get_by_role("button")
    expect(starters).to_have_count(4)

    starter = starters.nth(1)
    prompt = starter.get_attribute("data-prompt") or ""
    assert prompt.startswith("Write a Python function")
    press(page, starter)
    answer = wait_for_answer(page, 1)
    expect(page.locator("article.msg-user .body")).to_have_text(prompt)
    expect(answer).to_have_attribute("data-status", "complete")
    expect(page.locator("#empty-state")).to_have_count(0)
    assert errors == []
    context.close()


def test_the_first_screen_speaks_to_users_and_keeps_operator_notes_for_staff(
    browser: Browser, server: tuple[str, str]
) -> None:
    base, database_url = server
    context = signed_in_context(browser, base)
    page = open_chat(context)
    empty = page.locator("#empty-state")
    # The demo model answers here: everyone is told, with what it can do.
    expect(empty).to_contain_text("built-in demo model")
    expect(empty).to_contain_text("/long 300")
    # How to configure the server is for the people who run it.
    expect(empty).not_to_contain_text("LLM_BASE_URL")
    expect(empty).not_to_contain_text("docs/")
    context.close()

    staff = unique_name("staff")
    context = signed_in_context(browser, base, username=staff)
    make_staff(database_url, staff)
    page = open_chat(context)
    expect(page.locator("#empty-state")).to_contain_text("LLM_BASE_URL")
    expect(page.locator("#empty-state")).to_contain_text("docs/configuration.md")
    context.close()


def test_with_a_real_model_the_first_screen_does_not_speak_of_the_demo(browser: Browser) -> None:
    # A real model is configured (the admin's model map names it). It is never asked here:
    # the first screen is all this test reads.
    real_model = (
        "from chat.models import ModelTier\n"
        "ModelTier.objects.filter(tier='full').update(model='llama-3.1-8b-instruct')\n"
    )
    with chatsite_with_database(real_model) as (base, database_url):
        staff = unique_name("staff")
        context = signed_in_context(browser, base, username=staff)
        make_staff(database_url, staff)
        page = open_chat(context)
        expect(page.locator("#tier-badge")).to_have_text("Full model · llama-3.1-8b-instruct")
        empty = page.locator("#empty-state")
        expect(empty.get_by_role("heading", name="What can I help with?")).to_be_visible()
        expect(empty).not_to_contain_text("demo")
        expect(empty).not_to_contain_text("LLM_BASE_URL")
        context.close()


@pytest.mark.parametrize("device", ["desktop", "android"])
def test_without_javascript_the_page_says_it_needs_it(
    browser: Browser, server: tuple[str, str], device: str
) -> None:
    base, _ = server
    context = signed_in_context(browser, base, java_script_enabled=False, **DEVICES[device])
    page = context.new_page()
    page.goto("/")
    notice = page.locator(".noscript")
    expect(notice).to_be_visible()
    expect(notice).to_contain_text("needs JavaScript")
    context.close()


@pytest.mark.parametrize("device", ["desktop", "android"])
def test_a_starter_pressed_offline_is_kept_in_the_box_to_send_later(
    browser: Browser, server: tuple[str, str], device: str
) -> None:
    base, _ = server
    context = signed_in_context(browser, base, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    context.set_offline(True)
    expect(page.locator("#connection")).to_have_attribute("data-state", "offline")
    starter = page.get_by_role("list", name="Starter prompts").get_by_role("button").first
    prompt = starter.get_attribute("data-prompt") or ""
    press(page, starter)
    expect(page.locator("#alerts .alert")).to_contain_text("Not connected right now")
    expect(page.locator("#prompt")).to_have_value(prompt)

    context.set_offline(False)
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    press(page, page.get_by_role("button", name="Send"))
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    expect(page.locator("article.msg-user .body")).to_have_text(prompt)
    expect(page.locator("#prompt")).to_have_value("")
    assert errors == []
    context.close()


# The starters' rows (buttons grouped by their top edge) and whether any runs past the screen.
STARTER_ROWS = """() => {
  const width = document.documentElement.clientWidth;
  const rows = new Map();
  let overflow = document.documentElement.scrollWidth > width;
  for (const button of document.querySelectorAll(".starters .starter")) {
    const box = button.getBoundingClientRect();
    const top = Math.round(box.top);
    rows.set(top, (rows.get(top) || 0) + 1);
    if (box.left < 0 || box.right > width + 0.5) overflow = true;
  }
  return {rows: [...rows.values()], overflow};
}"""


@pytest.mark.parametrize(
    ("device", "width"),
    [("desktop", 1280), ("desktop", 1024), ("android", 360), ("iphone", 360)],
)
def test_the_starters_lay_out_in_even_rows_within_the_screen(
    browser: Browser, server: tuple[str, str], device: str, width: int
) -> None:
    # auto-fit laid the four out as 3 + 1 on a desktop: a lone starter on its own row.
    base, _ = server
    options = {**DEVICES[device]}
    if device == "desktop":
        options["viewport"] = {"width": width, "height": 900}
    context = signed_in_context(browser, base, **options)
    page = open_chat(context)
    starters = page.get_by_role("list", name="Starter prompts").get_by_role("button")
    expect(starters).to_have_count(4)
    layout = page.evaluate(STARTER_ROWS)
    assert not layout["overflow"], layout
    assert layout["rows"] in ([2, 2], [4], [1, 1, 1, 1]), layout
    # Each one is still pressed as a person would: the last asks its prompt.
    prompt = starters.last.get_attribute("data-prompt") or ""
    press(page, starters.last)
    expect(page.locator("article.msg-user .body")).to_have_text(prompt)
    context.close()

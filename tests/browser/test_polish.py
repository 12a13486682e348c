"""Everyday polish in a real browser: theme, copy, keyboard, tier badge, usage, phone layout."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, WebSocketRoute, expect

from tests.browser.browsing import (
    PHONE,
    open_chat,
    send,
    signed_in_context,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser

CODE_ANSWER = (
    "Run **this**:\n\n```python\nprint('hello')\nfor i in range(3):\n    print(i)\n```\n\nDone."
)
WIDE_ANSWER = (
    "A very long unbroken word: " + "x" * 300 + "\n\n```text\n" + "y" * 300 + "\n```\n\n"
    "| a | b |\n|---|---|\n| " + "z" * 200 + " | 2 |\n"
)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # The demo model as fast as it goes; no titles: the usage meter's test counts the answers'
    # tokens exactly (a title's tokens are counted after the answer: tests/test_titles.py).
    with running_chatsite(CHAT_TITLES="0") as base:
        yield base


def background(page: Page) -> str:
    color: str = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    return color


def code_colors(page: Page) -> list[str]:
    """The background of the first code block and the colour of its first keyword."""
    colors: list[str] = page.evaluate(
        """() => [getComputedStyle(document.querySelector('pre.code')).backgroundColor,
                  getComputedStyle(document.querySelector('pre.code .k')).color]"""
    )
    return colors


def test_the_theme_follows_the_system_and_the_toggle_wins_and_is_remembered(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server, color_scheme="dark")
    page = open_chat(context)
    send(page, "/echo " + CODE_ANSWER)
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    toggle = page.get_by_role("button", name="Dark theme")
    dark, dark_code = background(page), code_colors(page)
    expect(toggle).to_have_attribute("aria-pressed", "true")  # the system says dark

    toggle.click()
    expect(page.locator("html")).to_have_attribute("data-theme", "light")
    expect(toggle).to_have_attribute("aria-pressed", "false")
    light, light_code = background(page), code_colors(page)
    assert light == "rgb(255, 255, 255)"
    assert light != dark
    # Code highlighting follows the page's theme too, not only the system's setting.
    assert light_code != dark_code

    page.reload()  # the choice is remembered
    expect(page.locator("html")).to_have_attribute("data-theme", "light")
    assert (background(page), code_colors(page)) == (light, light_code)
    expect(page.get_by_role("button", name="Dark theme")).to_have_attribute("aria-pressed", "false")

    page.get_by_role("button", name="Dark theme").click()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    assert (background(page), code_colors(page)) == (dark, dark_code)
    context.close()


def test_copy_buttons_put_the_answers_markdown_and_the_code_on_the_clipboard(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server, permissions=["clipboard-read", "clipboard-write"])
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/echo " + CODE_ANSWER)
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")

    answer.get_by_role("button", name="Copy answer").click()
    expect(answer.get_by_role("button", name="Copy answer")).to_have_text("Copied")
    expect(page.locator("#announcer")).to_have_text("Answer copied to the clipboard.")
    assert page.evaluate("() => navigator.clipboard.readText()") == CODE_ANSWER

    code_button = answer.get_by_role("button", name="Copy code: python")
    code_button.click()
    expect(code_button).to_have_text("Copied")
    assert page.evaluate("() => navigator.clipboard.readText()") == (
        "print('hello')\nfor i in range(3):\n    print(i)\n"
    )
    assert errors == []
    context.close()


def test_keyboard_shortcuts_start_a_new_chat_and_focus_returns_to_the_prompt(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    prompt = page.locator("#prompt")
    expect(prompt).to_be_focused()
    send(page, "/echo hello")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    expect(prompt).to_be_focused()  # after the answer, typing goes on where it was

    page.locator("#messages").click()
    page.keyboard.press("Control+Shift+O")
    expect(page).to_have_url(f"{server}/")
    expect(page.locator("#empty-state")).to_be_visible()
    expect(prompt).to_be_focused()
    # The shortcut is announced on the control that it triggers.
    expect(page.locator("#new-chat")).to_have_attribute("aria-keyshortcuts", "Control+Shift+O")
    expect(page.locator("#stop")).to_have_attribute("aria-keyshortcuts", "Escape")
    # Tab moves on from the prompt, and the control it reaches shows a visible focus ring.
    # Send is disabled (so out of the tab order) until the new page's socket is ready: wait
    # for that, as the Tab would otherwise skip it for the tier badge under load.
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    expect(page.locator("#send")).to_be_enabled()
    page.keyboard.press("Tab")
    focused = page.locator(":focus")
    expect(focused).to_have_id("send")
    ring = focused.evaluate(
        "el => { const s = getComputedStyle(el); return [s.outlineStyle, s.outlineWidth]; }"
    )
    assert ring == ["solid", "3px"]
    context.close()


def test_the_tier_badge_explains_itself_and_follows_the_ready_frame(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = context.new_page()

    # The socket may decide differently from the page (its own handshake headers): stand in
    # for a server whose socket chose the lite model by rewriting its `ready` frame. The rest
    # of the conversation goes through untouched.
    def relay(ws: WebSocketRoute) -> None:
        upstream = ws.connect_to_server()

        def to_page(message: str | bytes) -> None:
            if isinstance(message, str) and message.startswith("{"):
                frame = json.loads(message)
                if frame["type"] == "ready":
                    frame.update(
                        tier="lite",
                        model="demo-lite",
                        reason="data saver is on",
                        why="Chosen because data saver is on.",
                    )
                    # As the server would for the lite tier: its default model first.
                    models = frame.get("models") or []
                    lite = [m for m in models if m["id"] == "demo-lite"] or [
                        {"id": "demo-lite", "label": "demo-lite"}
                    ]
                    frame["models"] = lite + [m for m in models if m["id"] != "demo-lite"]
                    message = json.dumps(frame)
            ws.send(message)

        upstream.on_message(to_page)

    page.route_web_socket(re.compile(r"/ws/chat/$"), relay)
    page.goto("/")
    badge = page.locator("#tier-badge")
    expect(badge).to_have_attribute("data-tier", "lite")
    expect(badge).to_have_text("Lite model · demo-lite")
    expect(badge).to_have_attribute("title", re.compile("data saver is on"))
    # A click (or a tap) opens the explanation, which the badge is described by.
    badge.click()
    info = page.locator("#tier-info")
    expect(info).to_be_visible()
    expect(info).to_contain_text("Chosen because data saver is on.")
    expect(info).to_contain_text("Detected device: desktop.")
    page.keyboard.press("Escape")
    expect(info).to_be_hidden()
    context.close()


def test_the_page_tier_badge_shows_the_reason_before_the_socket_connects(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = context.new_page()
    page.route(re.compile(r"/static/chat/stream\.js"), lambda route: route.abort())
    page.goto("/")
    badge = page.locator("#tier-badge")
    expect(badge).to_have_text("Full model · demo-full")
    expect(badge).to_have_attribute(
        "title", re.compile(r"looks like a desktop or laptop computer\.")
    )
    context.close()


def _too_small(page: Page) -> list[str]:
    found: list[str] = page.evaluate(
        """() => {
            const small = [];
            const controls = document.querySelectorAll(
                "button, a[href], input:not([type=hidden]), textarea, summary, select");
            for (const el of controls) {
                const box = el.getBoundingClientRect();
                if (!box.width || !box.height) continue;
                // Not shown (e.g. inside a closed <details> or a hidden drawer): not a target.
                if (!el.checkVisibility({visibilityProperty: true})) continue;
                if (el.closest(".visually-hidden")) continue;
                // Links inside running text are exempt (WCAG 2.5.8 "inline").
                if (el.matches("a") && el.closest("p, li") && !el.closest("nav")) continue;
                // Rounded: layout in fractions of a pixel measured one 44 px button 43.99998.
                if (Math.round(box.width) < 44 || Math.round(box.height) < 44) {
                    small.push(`${el.outerHTML.slice(0, 80)} ${box.width}x${box.height}`);
                }
            }
            return small;
        }"""
    )
    return found


def test_on_a_phone_the_sidebar_is_a_drawer_targets_are_big_and_nothing_scrolls_sideways(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server, **PHONE)
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/echo " + WIDE_ANSWER)
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    send(page, "/echo " + CODE_ANSWER)
    expect(wait_for_answer(page, 2)).to_have_attribute("data-status", "complete")

    # Phones get the lite model by default, and the badge says so.
    expect(page.locator("#tier-badge")).to_have_attribute("data-tier", "lite")
    # No horizontal scroll, however wide the answer.
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 360
    # The prompt box is on screen.
    box = page.locator("#prompt").bounding_box()
    assert box is not None
    assert box["y"] >= 0
    assert box["y"] + box["height"] <= 740
    # The conversation list is a drawer: closed, out of the way and out of the tab order.
    sidebar = page.locator("#sidebar")
    expect(sidebar).to_be_hidden()
    assert _too_small(page) == []
    opener = page.get_by_role("button", name="Open the conversation list")
    opener.tap()
    expect(sidebar).to_be_visible()
    expect(opener).to_have_attribute("aria-expanded", "true")
    assert page.locator("#main").evaluate("m => m.inert")  # the page behind is out of reach
    page.keyboard.press("Escape")
    expect(sidebar).to_be_hidden()
    expect(opener).to_be_focused()
    opener.tap()
    expect(sidebar).to_be_visible()
    expect(page.locator("#conversation-list > li.current")).to_be_visible()
    assert _too_small(page) == []
    # The open conversation's menu (rename, delete) fits and is easy to hit as well.
    page.locator("#conversation-list > li.current summary").tap()
    current = page.locator("#conversation-list > li.current")
    expect(current.get_by_label("New title")).to_be_visible()
    assert _too_small(page) == []
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 360
    page.locator("#conversation-list > li.current summary").tap()
    page.get_by_role("button", name="Close the conversation list").tap()
    expect(sidebar).to_be_hidden()
    expect(opener).to_be_focused()
    # Tapping outside the open drawer closes it too.
    opener.tap()
    expect(sidebar).to_be_visible()
    page.mouse.click(350, 400)
    expect(sidebar).to_be_hidden()
    assert errors == []
    context.close()


def _tokens_left(page: Page) -> int:
    return int(page.locator("#usage-meter").inner_text().split()[0].replace(",", ""))


def test_the_usage_meter_counts_down_with_each_answer_as_the_server_does(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server)
    page = open_chat(context)
    meter = page.locator("#usage-meter")
    expect(meter).to_have_text("200,000 tokens left today")  # CHAT_DAILY_TOKENS' default
    send(page, "/echo " + CODE_ANSWER)
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    expect(meter).not_to_have_text("200,000 tokens left today")
    shown = _tokens_left(page)
    assert 190_000 < shown < 200_000
    # The page's own arithmetic agrees with the server's count once the turn has settled.
    for _ in range(20):
        page.reload()
        if _tokens_left(page) == shown:
            break
        time.sleep(0.1)
    assert _tokens_left(page) == shown
    context.close()

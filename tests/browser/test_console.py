"""The main flows in two tabs with every console error, uncaught error and CSP violation
collected: there must be none (htmx used to log `htmx:oobErrorNoTarget` in every tab not
showing a conversation that had a new turn, and its settling of `style` broke the CSP)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect

from tests.browser.browsing import (
    DEVICES,
    answers,
    press,
    send,
    signed_in_context,
    source_text,
    wait_for_answer,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser

# CSP violations are reported as events, not always as console messages: record them.
RECORD_CSP_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # Slow enough that Stop finds the answer still streaming.
    with running_chatsite(DEMO_TOKENS_PER_SECOND="100") as base:
        yield base


class Console:
    """Everything a page said went wrong: console errors and warnings, uncaught errors."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def watch(self, page: Page, name: str) -> Page:
        page.on(
            "console",
            lambda m: (
                self.problems.append(f"{name} console.{m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        page.on("pageerror", lambda e: self.problems.append(f"{name} uncaught: {e}"))
        return page

    def csp(self, *pages: Page) -> list[str]:
        found: list[str] = []
        for page in pages:
            found += page.evaluate("() => window.__csp || []")
        return found


def open_tab(context: BrowserContext, console: Console, name: str, path: str = "/") -> Page:
    page = console.watch(context.new_page(), name)
    page.goto(path)
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    return page


@pytest.mark.parametrize("device", ["desktop", "android"])
def test_the_main_flows_in_two_tabs_log_no_error_and_break_no_policy(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    context.add_init_script(RECORD_CSP_VIOLATIONS)
    console = Console()
    one = open_tab(context, console, "one")
    two = open_tab(context, console, "two")  # a new chat: it shows no conversation

    # A new chat in the first tab: the second tab lists it but shows nothing of its turn.
    send(one, "/echo hello from the first tab")
    expect(wait_for_answer(one, 1)).to_have_attribute("data-status", "complete")
    conversation = one.url.removeprefix(server)
    expect(two.locator("#conversation-list > li.conv")).to_have_count(1)
    expect(two.locator("#messages article")).to_have_count(0)

    # The second tab starts a conversation of its own; the first tab does not show it.
    send(two, "/echo a second conversation")
    expect(wait_for_answer(two, 1)).to_have_attribute("data-status", "complete")
    expect(one.locator("#conversation-list > li.conv")).to_have_count(2)
    expect(answers(one)).to_have_count(1)

    # The second tab opens the first conversation; both follow a streaming answer; Stop.
    two.goto(conversation)
    expect(two.locator("#connection")).to_have_attribute("data-state", "connected")
    send(one, "/long 3000")
    streaming = wait_for_answer(one, 2)
    expect(wait_for_answer(two, 2)).to_have_attribute("data-status", "streaming")
    press(one, one.get_by_role("button", name="Stop"))
    expect(streaming).to_have_attribute("data-status", "stopped")
    expect(answers(two).nth(1)).to_have_attribute("data-status", "stopped")

    # An answer that fails, seen in both tabs.
    send(one, "/fail 500")
    failed = wait_for_answer(one, 3)
    expect(failed).to_have_attribute("data-status", "failed")
    expect(answers(two).nth(2)).to_have_attribute("data-status", "failed")

    # An edit: the thread is swapped whole, in both tabs.
    first_prompt = one.locator("article.msg-user").first
    first_prompt.hover()
    press(one, first_prompt.get_by_role("button", name="Edit"))
    box = one.locator("#prompt")
    box.fill("/echo hello, edited")
    press(one, one.get_by_role("button", name="Save & send"))
    expect(one.locator("article.msg-user").first).to_have_text(re.compile("hello, edited"))
    expect(answers(one)).to_have_count(1)
    expect(answers(one).first).to_have_attribute("data-status", "complete")
    expect(two.locator("article.msg-user").first).to_have_text(re.compile("hello, edited"))

    # The tier popover, and a choice made in it (a phone's plan offers none: it says so).
    press(one, one.locator("#tier-badge"))
    info = one.locator("#tier-info")
    expect(info).to_be_visible()
    if device == "desktop":
        press(one, info.get_by_role("button", name="Use the lite model (saves data)"))
    else:
        expect(info).to_contain_text("Your plan keeps this device on the lite model")
        press(one, info.get_by_role("button", name="Close"))
    expect(info).to_be_hidden()
    expect(one.locator("#connection")).to_have_attribute("data-state", "connected")

    # The ⋯ menu: rename, pin.
    if device != "desktop":
        press(one, one.get_by_role("button", name="Open the conversation list"))
    item = one.locator("#conversation-list > li.current")
    press(one, item.locator("summary"))
    title = item.get_by_label("New title")
    title.fill("Renamed")
    press(one, item.get_by_role("button", name="Rename"))
    expect(one.locator("#conversation-list > li.current > a")).to_have_text("Renamed")
    item = one.locator("#conversation-list > li.current")
    press(one, item.locator("summary"))
    press(one, item.get_by_role("button", name="Pin to top"))
    expect(one.locator("#conversation-list > li.current .pinned")).to_have_count(1)

    assert console.problems == []
    assert console.csp(one, two) == []
    context.close()


def stop_streaming(page: Page, answer: Locator) -> None:
    """Stop the answer `answer` once it shows some new text; it ends `stopped`."""
    expect(answer).to_have_attribute("data-status", "streaming")
    page.wait_for_function(
        "(el) => el.querySelector('.body').textContent.length > 40", arg=answer.element_handle()
    )
    press(page, page.get_by_role("button", name="■ Stop"))
    expect(answer).to_have_attribute("data-status", "stopped")


def continue_then_stop(page: Page, answer: Locator) -> None:
    """Press the stopped answer's Continue, let it stream, stop it again."""
    before = len(answer.locator("template.source").evaluate("t => t.content.textContent"))
    press(page, answer.get_by_role("button", name="Continue"))
    expect(answer).to_have_attribute("data-status", "streaming")
    page.wait_for_function(
        "([el, n]) => el.querySelector('.body').textContent.length > n + 40",
        arg=[answer.element_handle(), before],
    )
    press(page, page.get_by_role("button", name="■ Stop"))
    expect(answer).to_have_attribute("data-status", "stopped")


@pytest.mark.parametrize("device", ["desktop", "android"])
def test_continue_in_one_tab_logs_no_error_in_the_other_whatever_it_shows(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    console = Console()
    one = open_tab(context, console, "one")
    send(one, "/long 3000")
    first = wait_for_answer(one, 1)
    stop_streaming(one, first)
    conversation = one.url.removeprefix(server)
    two = open_tab(context, console, "two", conversation)
    mid = first.get_attribute("data-mid")
    assert mid

    # Both tabs show the answer: the second follows its continuation.
    continue_then_stop(one, first)
    expect(answers(two).first).to_have_attribute("data-status", "stopped")
    # The other way round: the second tab continues the first tab's answer.
    continue_then_stop(two, answers(two).first)
    expect(first).to_have_attribute("data-status", "stopped")
    assert console.problems == []

    # The second tab shows another conversation: nothing of the continuation is for it.
    two.goto("/")
    expect(two.locator("#connection")).to_have_attribute("data-state", "connected")
    continue_then_stop(one, first)
    assert console.problems == []

    # The second tab shows another version of the answer (a regeneration's), while the first
    # continues the earlier version.
    press(one, first.get_by_role("button", name="Regenerate"))
    second = one.locator("article.msg-assistant").first
    expect(second).not_to_have_attribute("data-mid", mid)
    stop_streaming(one, second)
    two.goto(conversation)
    expect(two.locator("#connection")).to_have_attribute("data-state", "connected")
    expect(answers(two).first).not_to_have_attribute("data-mid", mid)
    press(one, second.get_by_role("button", name="Previous version"))
    earlier = one.locator(f'article[data-mid="{mid}"]')
    expect(earlier).to_have_attribute("data-status", "stopped")
    continue_then_stop(one, earlier)
    # The second tab keeps its version (htmx used to log `oobErrorNoTarget` for the shell of
    # the continued one); shown again, the earlier version has what the first tab showed.
    expect(answers(two)).to_have_count(1)
    expect(answers(two).first).not_to_have_attribute("data-mid", mid)
    press(two, answers(two).first.get_by_role("button", name="Previous version"))
    shown = two.locator(f'article[data-mid="{mid}"]')
    expect(shown).to_have_attribute("data-status", "stopped")
    assert source_text(shown) == source_text(earlier)

    assert console.problems == []
    context.close()

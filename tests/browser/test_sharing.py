"""Export and share by hand, on a desktop and on phones: download the conversation as Markdown
and as JSON from its "⋯" menu, share it, read the link logged out, stop sharing: not found."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    DEVICES,
    is_touch,
    new_context,
    open_chat,
    press,
    run_axe,
    send,
    signed_in_context,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


def open_menu(page: Page) -> None:
    """The conversation's "⋯" menu in the list (on a phone the list is a drawer)."""
    if is_touch(page) and not page.locator("#sidebar").is_visible():
        press(page, page.get_by_role("button", name="Open the conversation list"))
    menu = page.locator("#conversation-list details.conv-menu").first
    if menu.get_attribute("open") is None:
        press(page, menu.locator("summary"))
    expect(menu.get_by_role("button", name="Share link")).to_be_visible()


@pytest.mark.parametrize("device", list(DEVICES))
def test_export_both_formats_then_share_read_logged_out_and_unshare(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/echo Rainbows are **refracted** sunlight.")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")

    open_menu(page)
    menu = page.locator("#conversation-list details.conv-menu").first
    with page.expect_download() as markdown:
        press(page, menu.get_by_role("link", name="Export as Markdown"))
    assert markdown.value.suggested_filename.endswith(".md")
    text = Path(markdown.value.path()).read_text(encoding="utf-8")
    assert "## You" in text and "Rainbows are **refracted** sunlight." in text

    with page.expect_download() as exported:
        press(page, menu.get_by_role("link", name="Export as JSON"))
    assert exported.value.suggested_filename.endswith(".json")
    document = json.loads(Path(exported.value.path()).read_text(encoding="utf-8"))
    answer = document["conversation"]["messages"][1]
    assert answer["text"] == "Rainbows are **refracted** sunlight."
    assert answer["model"].startswith("demo-") and answer["usage"]["completion_tokens"] > 0

    press(page, menu.get_by_role("button", name="Share link"))
    link = menu.locator(".share-link a")
    expect(link).to_contain_text(f"{server}/s/")
    url = link.inner_text()

    # Someone without an account opens the link.
    stranger = new_context(browser, server, **DEVICES[device])
    reader = stranger.new_page()
    response = reader.goto(url)
    assert response is not None and response.status == 200
    assert response.headers["x-robots-tag"].startswith("noindex")
    expect(reader.get_by_role("heading", level=1)).to_contain_text("Rainbows are")
    expect(reader.locator("article.msg-assistant strong")).to_have_text("refracted")
    expect(reader.get_by_role("link", name="Start your own chat on chatsite")).to_be_visible()
    assert run_axe(reader) == []

    open_menu(page)
    press(page, menu.get_by_role("button", name="Stop sharing"))
    expect(menu.locator(".share-result")).to_contain_text("Sharing stopped")
    response = reader.goto(url)
    assert response is not None and response.status == 404
    stranger.close()
    assert errors == []
    context.close()


def test_copy_link_puts_the_shared_link_on_the_clipboard(browser: Browser, server: str) -> None:
    context = signed_in_context(browser, server)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
    page = open_chat(context)
    send(page, "/echo copy me")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    open_menu(page)
    menu = page.locator("#conversation-list details.conv-menu").first
    press(page, menu.get_by_role("button", name="Share link"))
    url = menu.locator(".share-link a").inner_text()
    press(page, menu.get_by_role("button", name="Copy link"))
    expect(menu.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("() => navigator.clipboard.readText()") == url
    context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_headers_menu_shares_a_chat_just_started(
    browser: Browser, server: str, device: str
) -> None:
    # A new chat: the header's menu arrives with its first exchange (no reload).
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    expect(page.locator("#share-menu")).to_be_hidden()
    send(page, "/echo shared from the header")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    menu = page.locator("#share-menu")
    press(page, menu.get_by_label("Share and export"))
    expect(menu.get_by_role("link", name="Export as Markdown")).to_be_visible()
    press(page, menu.get_by_role("button", name="Share link"))
    url = menu.locator(".share-link a").inner_text()
    assert url.startswith(f"{server}/s/")
    stranger = new_context(browser, server)
    reader = stranger.new_page()
    response = reader.goto(url)
    assert response is not None and response.status == 200
    expect(reader.locator("article.msg-assistant")).to_contain_text("shared from the header")
    press(page, menu.get_by_role("button", name="Stop sharing"))
    expect(menu.locator(".share-result")).to_contain_text("Sharing stopped")
    response = reader.goto(url)
    assert response is not None and response.status == 404
    stranger.close()
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_failed_answer_is_shared_and_exported_with_what_went_wrong(
    browser: Browser, server: str, device: str
) -> None:
    # The owner saw "The model server had a problem…" under the answer: the shared page and the
    # Markdown export say so too, rather than showing an empty answer.
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/fail 502")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "failed")
    note = answer.locator(".note.error").inner_text()
    assert note

    open_menu(page)
    menu = page.locator("#conversation-list details.conv-menu").first
    with page.expect_download() as markdown:
        press(page, menu.get_by_role("link", name="Export as Markdown"))
    text = Path(markdown.value.path()).read_text(encoding="utf-8")
    assert note.rstrip(".") in text

    press(page, menu.get_by_role("button", name="Share link"))
    url = menu.locator(".share-link a").inner_text()
    stranger = new_context(browser, server, **DEVICES[device])
    reader = stranger.new_page()
    response = reader.goto(url)
    assert response is not None and response.status == 200
    shared = reader.locator("article.msg-assistant")
    expect(shared).to_have_attribute("data-status", "failed")
    expect(shared.locator(".note.error")).to_have_text(note)
    expect(shared.locator(".note.error")).to_be_visible()
    assert run_axe(reader) == []
    stranger.close()
    assert errors == []
    context.close()


# The boxes of the open "⋯" menu's controls, top to bottom (hidden ones left out), the empty
# share result's height, and the menu's inner bottom edge (its border box less its border).
MENU_LAYOUT = """(menu) => {
  const box = (el) => el.getBoundingClientRect();
  const controls = [...menu.children].filter(
    (el) => el.tagName !== "SUMMARY" && !el.classList.contains("share-result"));
  const style = getComputedStyle(menu);
  return {
    controls: controls.map((el) => [el.className, box(el).top, box(el).bottom]),
    result: box(menu.querySelector(".share-result")).height,
    inner_bottom: box(menu).bottom - parseFloat(style.borderBottomWidth),
    padding_bottom: parseFloat(style.paddingBottom),
  };
}"""


def live_region(page: Page, selector: str) -> dict[str, object]:
    """The accessibility tree's node of `selector` (Chromium's, over CDP): what a screen
    reader watches. A `display: none` element is in it only as ignored ("notRendered")."""
    cdp = page.context.new_cdp_session(page)
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    [ax] = cdp.send("Accessibility.getPartialAXTree", {"nodeId": node, "fetchRelatives": False})[
        "nodes"
    ]
    props = {p["name"]: p["value"].get("value") for p in ax.get("properties", [])}
    cdp.detach()
    return {"ignored": ax["ignored"], "live": props.get("live")}


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_empty_share_result_leaves_no_gap_and_is_a_live_region_already(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    send(page, "/echo no gap")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    open_menu(page)
    menu = page.locator("#conversation-list details.conv-menu[open]")
    layout = menu.evaluate(MENU_LAYOUT)
    controls = layout["controls"]
    gaps = [below[1] - above[2] for above, below in itertools.pairwise(controls)]
    names = [c[0] for c in controls]
    # Between Share link and the next control: the same space as between any two controls
    # (the empty result below it took 13 px more, reported from a review).
    share = names.index("share")
    assert layout["result"] == 0
    assert gaps[share] == pytest.approx(min(gaps), abs=0.5), (names, gaps)
    assert max(gaps) - min(gaps) <= 0.5, (names, gaps)
    # Under the last control, only the menu's padding.
    space_under = layout["inner_bottom"] - controls[-1][2]
    assert space_under == pytest.approx(layout["padding_bottom"], abs=0.5), layout

    # Empty, the result is still in the accessibility tree as a polite live region, so the
    # link is announced when it arrives into it (a hidden region's change is often not).
    selector = "#conversation-list details.conv-menu[open] .share-result"
    assert live_region(page, selector) == {"ignored": False, "live": "polite"}
    result = menu.locator(".share-result")
    element = result.element_handle()
    press(page, menu.get_by_role("button", name="Share link"))
    expect(result.locator(".share-link a")).to_be_visible()
    # The link arrived in the very element that was watched (swapped inside, not replaced).
    assert page.evaluate("(el) => el.isConnected && el.matches('.share-result')", element)
    assert live_region(page, selector) == {"ignored": False, "live": "polite"}
    context.close()

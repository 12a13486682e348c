"""The conversation list by hand, on a desktop and on phones: the "⋯" menu, pinned conversations
staying first when another tab starts one, and which conversation is open (also in the dark)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Locator, Page, TimeoutError, expect

from tests.browser.browsing import (
    DEVICES,
    PHONES,
    chatsite_with_database,
    is_touch,
    manage_shell,
    open_chat,
    open_system_prompt,
    press,
    send,
    signed_in_context,
    unique_name,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


def new_conversation(page: Page, text: str) -> None:
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, f"/echo {text}")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")


def open_list(page: Page) -> None:
    """On a phone the list is a drawer: open it."""
    if is_touch(page):
        press(page, page.get_by_role("button", name="Open the conversation list"))
        expect(page.locator("#sidebar")).to_be_visible()


@pytest.mark.parametrize("device", list(DEVICES))
def test_one_conversation_menu_opens_at_a_time_and_closes_on_a_click_outside_or_escape(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    new_conversation(page, "first")
    new_conversation(page, "second")
    open_list(page)
    items = page.locator("#conversation-list > li.conv")
    expect(items).to_have_count(2)
    menus = page.locator("#conversation-list details.conv-menu")
    first, second = menus.nth(0), menus.nth(1)

    # (The lower one first; an open menu pushes the rows below it down.)
    press(page, second.locator("summary"))
    expect(second.get_by_label("New title")).to_be_visible()
    # The title field is wide enough to read and edit a title.
    box = second.get_by_label("New title").bounding_box()
    assert box is not None and box["width"] >= 200
    press(page, first.locator("summary"))
    expect(first.get_by_label("New title")).to_be_visible()
    expect(page.locator("details.conv-menu[open]")).to_have_count(1)  # the other one closed

    # A click (a tap) anywhere else closes it.
    press(page, page.locator(".account .who"))
    expect(page.locator("details.conv-menu[open]")).to_have_count(0)

    press(page, first.locator("summary"))
    expect(first).to_have_attribute("open", "")
    page.keyboard.press("Escape")
    expect(page.locator("details.conv-menu[open]")).to_have_count(0)
    if device == "desktop":
        expect(first.locator("summary")).to_be_focused()
    else:
        expect(page.locator("#sidebar")).to_be_visible()  # Escape closed the menu, not the drawer
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_conversation_settings_close_on_a_click_outside_or_escape(
    browser: Browser, server: str, device: str
) -> None:
    """The header's ⚙ opens like the "⋯" menus and closes like them: it used to stay open over
    the messages after Escape, after a tap elsewhere and while the next answers arrived."""
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    new_conversation(page, "settings")
    settings = page.locator("#conversation-settings-menu")
    prompt_box = page.get_by_label("System prompt for this conversation")

    open_system_prompt(page)
    expect(prompt_box).to_be_visible()
    press(page, page.locator("#chat-title"))  # a click (a tap) anywhere else
    expect(prompt_box).to_be_hidden()
    expect(page.locator("details[open]")).to_have_count(0)

    open_system_prompt(page)
    press(page, prompt_box)
    page.keyboard.press("Escape")
    expect(prompt_box).to_be_hidden()
    # Back to the button that opened it: ⚙, or on a phone the header's ⋯.
    opener = settings if settings.locator("summary").is_visible() else page.locator("#share-menu")
    expect(opener.locator("summary")).to_be_focused()
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", ["desktop", "android"])
def test_another_tabs_new_conversation_goes_below_the_pinned_ones(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    one = open_chat(context)
    errors = watch_for_errors(one)
    new_conversation(one, "to be pinned")
    new_conversation(one, "not pinned")
    open_list(one)
    pinned = one.locator("#conversation-list > li.conv").filter(has_text="to be pinned")
    press(one, pinned.locator("summary"))
    press(one, pinned.get_by_role("button", name="Pin to top"))
    titles = one.locator("#conversation-list > li.conv > a")
    expect(titles).to_have_text([re.compile("to be pinned"), re.compile("not pinned")])

    two = open_chat(context)  # another tab starts a conversation
    send(two, "/echo from the other tab")
    expect(wait_for_answer(two, 1)).to_have_attribute("data-status", "complete")
    expect(titles).to_have_text(
        [re.compile("to be pinned"), re.compile("from the other tab"), re.compile("not pinned")]
    )
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_pinned_conversation_s_title_has_no_pin_in_the_header_or_the_tab(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    new_conversation(page, "a title to pin")
    open_list(page)
    entry = page.locator("#conversation-list > li.conv.current")
    press(page, entry.locator("summary"))
    press(page, entry.get_by_role("button", name="Pin to top"))
    expect(entry.locator(".pinned")).to_have_count(1)  # the list shows the pin
    for _ in range(2):  # as pinned, and when the page is opened again
        header = page.locator(".chat-head .title")
        expect(header).to_have_text(re.compile(r"a title to pin$"))
        expect(header).not_to_contain_text("📌")
        assert "📌" not in page.title() and "a title to pin · chatsite" in page.title()
        page.reload()
        expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    assert errors == []
    context.close()


def _contrast(page: Page, a: str, b: str) -> float:
    """WCAG contrast ratio between the backgrounds of two elements."""
    ratio: float = page.evaluate(
        """([a, b]) => {
            const lum = (el) => {
                const [r, g, bl] = getComputedStyle(el).backgroundColor.match(/\\d+/g).map(Number)
                    .map((c) => c / 255).map((c) => c <= 0.03928 ? c / 12.92
                                                      : ((c + 0.055) / 1.055) ** 2.4);
                return 0.2126 * r + 0.7152 * g + 0.0722 * bl;
            };
            const [x, y] = [lum(document.querySelector(a)), lum(document.querySelector(b))];
            return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05);
        }""",
        [a, b],
    )
    return ratio


@pytest.mark.parametrize("device", ["desktop", *PHONES])
def test_in_the_dark_theme_the_open_conversation_stands_out(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, color_scheme="dark", **DEVICES[device])
    page = open_chat(context)
    new_conversation(page, "the open one")
    open_list(page)
    expect(page.locator("#conversation-list > li.current")).to_be_visible()
    assert _contrast(page, "#conversation-list > li.current", "#sidebar") >= 1.3
    # And a bar in the accent colour at its edge.
    marker = page.locator("#conversation-list > li.current").evaluate(
        "el => getComputedStyle(el).boxShadow"
    )
    assert "inset" in marker and "3px" in marker
    context.close()


# More conversations than the list shows at once (written by the shell, as another day's
# chats would be: what this test tries is the list, not how they were written), newest first.
MANY = 20
MAKE_MANY = """
from datetime import timedelta
from django.contrib.auth import get_user_model
from django.utils import timezone
from chat.models import Conversation
user = get_user_model().objects.get(username={name!r})
now = timezone.now()
for i in range({many}):
    c = Conversation.objects.create(user=user, title=f"chat {{i}}")
    Conversation.objects.filter(pk=c.pk).update(updated_at=now - timedelta(minutes=i))
"""

# Whether `el` is wholly inside the list's visible part and is what a tap on its middle hits
# (nothing, such as the account bar or another item's menu, is drawn over it).
SEEN = """(el) => {
  const list = document.getElementById("conversation-list").getBoundingClientRect();
  const box = el.getBoundingClientRect();
  const inside = box.top >= list.top - 0.5 && box.bottom <= list.bottom + 0.5;
  const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
  return inside && hit !== null && (hit === el || el.contains(hit));
}"""


@pytest.fixture(scope="module")
def server_with_database() -> Iterator[tuple[str, str]]:
    with chatsite_with_database() as server:
        yield server


def seen(locator: Locator) -> bool:
    """Whether `locator` is seen whole and on top, within a few seconds (the list scrolls to
    an opened menu once its toggle event has run)."""
    try:
        locator.page.wait_for_function(
            f"(el) => ({SEEN})(el)", arg=locator.element_handle(), timeout=3000
        )
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_menu_opened_near_the_lists_end_is_wholly_in_view_and_covers_no_other_item(
    browser: Browser, server_with_database: tuple[str, str], device: str
) -> None:
    base, database_url = server_with_database
    name = unique_name("menus")
    context = signed_in_context(browser, base, name, **DEVICES[device])
    manage_shell(database_url, MAKE_MANY.format(name=name, many=MANY))
    page = open_chat(context)
    errors = watch_for_errors(page)
    open_list(page)
    items = page.locator("#conversation-list > li.conv")
    expect(items).to_have_count(MANY)
    # The list is longer than its visible part (else this test would try nothing).
    assert page.locator("#conversation-list").evaluate("l => l.scrollHeight > l.clientHeight")

    # Near the end of the list: the one before last (a person scrolls down to it), then the
    # last one's ⋯, which its open menu must not cover, closes it and opens the last one's.
    before_last, last = items.nth(MANY - 2), items.nth(MANY - 1)
    before_last.scroll_into_view_if_needed()
    press(page, before_last.locator("summary"))
    menu = before_last.locator("details.conv-menu")
    expect(menu).to_have_attribute("open", "")
    delete = menu.get_by_role("button", name="Delete")
    expect(delete).to_be_visible()
    assert seen(delete), "Delete is below the list's visible edge or under something"
    assert seen(menu.get_by_label("New title"))

    last.locator("summary").scroll_into_view_if_needed()
    assert seen(last.locator("summary")), "the open menu covers the next item's ⋯"
    press(page, last.locator("summary"))
    expect(page.locator("details.conv-menu[open]")).to_have_count(1)
    menu = last.locator("details.conv-menu")
    expect(menu).to_have_attribute("open", "")
    for control in ("Rename", "Share link", "Delete"):
        assert seen(menu.get_by_role("button", name=control)), control

    # Sharing adds the link and two buttons: the menu grows. Its row stays in view (scrolled
    # to the result, the list took it away on a phone, and with it which conversation was
    # shared), the result under it; Delete is in view, or on a phone a scroll away.
    press(page, menu.get_by_role("button", name="Share link"))
    expect(menu.get_by_role("button", name="Stop sharing")).to_be_visible()
    assert seen(last.get_by_role("link", name="chat 19")), "the shared row left the view"
    for control in ("Copy link", "Stop sharing"):
        assert seen(menu.get_by_role("button", name=control)), control
    delete = menu.get_by_role("button", name="Delete")
    delete.scroll_into_view_if_needed()
    assert seen(delete)
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_deleting_the_open_conversation_leaves_no_way_back_to_it(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    page.on("dialog", lambda dialog: dialog.accept())  # hx-confirm asks before deleting
    new_conversation(page, "kept")
    kept = page.url
    new_conversation(page, "doomed")

    open_list(page)
    current = page.locator("#conversation-list > li.current")
    expect(current.locator("a[aria-current]")).to_have_text("/echo doomed")
    press(page, current.locator("summary"))
    press(page, current.get_by_role("button", name="Delete"))
    # A new chat, at the new chat's address: a reload stays there.
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.locator("#empty-state")).to_be_visible()
    expect(page.locator("#chat-title")).to_have_text("New chat")
    page.reload()
    expect(page.locator("#empty-state")).to_be_visible()
    # Back goes to the conversation before it, not to the deleted one's 404 (the new chat
    # took the deleted one's place in the history instead of being added after it).
    response = page.go_back()
    assert response is not None and response.status == 200, response and response.status
    expect(page).to_have_url(kept)
    expect(page.locator("article.msg-user .body")).to_have_text(["/echo kept"])
    assert errors == []
    context.close()

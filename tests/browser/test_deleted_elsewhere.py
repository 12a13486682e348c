"""A conversation deleted in one tab, seen from the user's other tabs (the same browser, or
another one logged in as the same user), on a desktop and on phones: it leaves their lists, and
a tab that shows it becomes a new chat that says why and keeps what was typed in its box."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.browser.browsing import (
    DESKTOP,
    DEVICES,
    PASSWORD,
    is_touch,
    new_context,
    open_chat,
    press,
    send,
    signed_in_context,
    type_prompt,
    unique_name,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser

DRAFT = "What about the return train on Sunday?"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


def logged_in_context(browser: Browser, base: str, username: str) -> BrowserContext:
    """Another browser (its own session) of an existing user, logged in through the real form."""
    with httpx.Client(base_url=base, follow_redirects=True, timeout=10) as client:
        client.get("/accounts/login/")
        response = client.post(
            "/accounts/login/",
            data={
                "username": username,
                "password": PASSWORD,
                "csrfmiddlewaretoken": client.cookies["csrftoken"],
            },
        )
        response.raise_for_status()
        session = client.cookies["sessionid"]
    context = new_context(browser, base, **DESKTOP)
    context.add_cookies([{"name": "sessionid", "value": session, "url": base}])
    return context


def new_conversation(page: Page, text: str) -> str:
    """Start a conversation from the new chat page; its id."""
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, f"/echo {text}")
    expect(wait_for_answer(page, 1)).to_have_attribute("data-status", "complete")
    match = re.search(r"/c/([^/]+)/$", page.url)
    assert match, page.url
    return match.group(1)


def delete_from_list(page: Page, conversation: str) -> None:
    """Delete a conversation from the list's "⋯" menu, as its user would (on a phone the list
    is a drawer)."""
    page.once("dialog", lambda dialog: dialog.accept())  # hx-confirm asks first
    if is_touch(page):
        press(page, page.get_by_role("button", name="Open the conversation list"))
    item = page.locator(f"#conv-{conversation}")
    press(page, item.locator("summary"))
    press(page, item.get_by_role("button", name="Delete"))
    expect(item).to_have_count(0)


@pytest.mark.parametrize("elsewhere", ["tab", "browser"])
@pytest.mark.parametrize("device", list(DEVICES))
def test_a_conversation_deleted_elsewhere_leaves_every_tab_and_the_typed_text_stays(
    browser: Browser, server: str, device: str, elsewhere: str
) -> None:
    username = unique_name()
    context = signed_in_context(browser, server, username, **DEVICES[device])
    reader = open_chat(context)
    errors = watch_for_errors(reader)
    other = new_conversation(reader, "other plans")
    doomed = new_conversation(reader, "trip plans")
    # A second tab of the reader's, on the other conversation.
    beside = open_chat(context, f"/c/{other}/")
    # The reader, on the doomed conversation, starts typing the next question.
    type_prompt(reader, DRAFT)

    deleter_context = (
        context if elsewhere == "tab" else logged_in_context(browser, server, username)
    )
    deleter = open_chat(deleter_context, f"/c/{other}/")
    delete_from_list(deleter, doomed)
    # The tab that deleted it was not showing it: it stays where it was, and says nothing.
    expect(deleter).to_have_url(re.compile(rf"/c/{other}/$"))
    expect(deleter.locator("#alerts .alert")).to_have_count(0)

    # The reader's tab: a new chat in place of the deleted one, saying why, the text kept.
    expect(reader).to_have_url(re.compile(r"/$"))
    expect(reader.locator("#empty-state")).to_be_visible()
    expect(reader.locator("#chat-title")).to_have_text("New chat")
    alert = reader.locator("#alerts .alert")
    expect(alert).to_have_attribute("data-code", "conversation_deleted")
    expect(alert).to_contain_text("“/echo trip plans” was deleted in another tab or window")
    expect(alert).to_be_visible()
    expect(reader.locator("#prompt")).to_have_value(DRAFT)
    expect(reader.locator(f"#conv-{doomed}")).to_have_count(0)
    expect(reader.locator(f"#conv-{other}")).to_have_count(1)
    expect(reader.locator("#connection")).to_have_attribute("data-state", "connected")
    reader.screenshot(path=f"/tmp/u1-deleted-{device}-{elsewhere}.png")
    # What was typed goes as the first prompt of a new conversation, and is answered.
    if is_touch(reader):
        press(reader, reader.locator("#send"))
    else:
        reader.locator("#prompt").press("Enter")
    expect(wait_for_answer(reader, 1)).to_have_attribute("data-status", "complete")
    expect(reader.locator("article.msg-user .body")).to_have_text([DRAFT])
    expect(reader).to_have_url(re.compile(r"/c/[^/]+/$"))
    assert f"/c/{doomed}/" not in reader.url
    # A reload shows the new conversation, without the notice again.
    reader.reload()
    expect(reader.locator("#connection")).to_have_attribute("data-state", "connected")
    expect(reader.locator("#alerts .alert")).to_have_count(0)

    # The tab beside it, on another conversation, only lost the list entry.
    expect(beside.locator(f"#conv-{doomed}")).to_have_count(0)
    expect(beside).to_have_url(re.compile(rf"/c/{other}/$"))
    expect(beside.locator("#alerts .alert")).to_have_count(0)
    expect(beside.locator("article.msg-user .body")).to_have_text(["/echo other plans"])
    assert errors == []
    if deleter_context is not context:
        deleter_context.close()
    context.close()

"""Feedback by hand, on a desktop and on phones: 👎 on an answer, say what was wrong, find it
again after a reload, change it to 👍; and an admin finds the comment in the admin."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    DEVICES,
    PASSWORD,
    chatsite_with_superuser,
    new_context,
    open_chat,
    press,
    run_axe,
    send,
    signed_in_context,
    unique_name,
    wait_for_answer,
    watch_for_errors,
)

pytestmark = pytest.mark.browser
ADMIN = "feedback-admin"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with chatsite_with_superuser(ADMIN, PASSWORD) as base:
        yield base


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_thumbs_down_with_a_comment_reaches_the_admin(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/echo The capital of Australia is Sydney.")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")

    press(page, answer.get_by_role("button", name="Bad answer"))
    expect(answer.get_by_role("button", name="Bad answer")).to_have_attribute(
        "aria-pressed", "true"
    )
    box = answer.get_by_label("What was wrong with this answer? (optional)")
    expect(box).to_be_focused()  # ready to type, as the comment is what a 👎 is for
    assert run_axe(page) == []  # the pressed buttons and the comment box, as a reader meets them
    comment = f"Canberra is the capital ({device} {unique_name('c')})"
    page.keyboard.type(comment)
    press(page, answer.get_by_role("button", name="Send feedback"))
    expect(answer.get_by_role("status")).to_have_text("Thanks, your feedback was sent.")
    # Sent: the form closes (no box, no second Send feedback); the thanks and the vote stay.
    expect(answer.get_by_label("What was wrong with this answer? (optional)")).to_have_count(0)
    expect(answer.get_by_role("button", name="Send feedback")).to_have_count(0)
    expect(answer.get_by_role("button", name="Bad answer")).to_have_attribute(
        "aria-pressed", "true"
    )

    # Still there when the conversation is opened again: the vote and its thanks, the box
    # closed (it was sent); 👎 again opens it with the comment, to change it.
    page.reload()
    answer = wait_for_answer(page, 1)
    expect(answer.get_by_role("button", name="Bad answer")).to_have_attribute(
        "aria-pressed", "true"
    )
    expect(answer.get_by_role("status")).to_have_text("Thanks for your feedback.")
    expect(answer.get_by_label("What was wrong with this answer? (optional)")).to_have_count(0)
    press(page, answer.get_by_role("button", name="Bad answer"))
    expect(answer.get_by_label("What was wrong with this answer? (optional)")).to_have_value(
        comment
    )
    press(page, answer.get_by_role("button", name="Send feedback"))
    expect(answer.get_by_role("status")).to_have_text("Thanks, your feedback was sent.")

    # An admin finds it, with the answer's model, and follows the link to the conversation.
    admin = new_context(browser, server)
    admin_page = admin.new_page()
    admin_page.goto("/admin/")
    admin_page.fill("#id_username", ADMIN)
    admin_page.fill("#id_password", PASSWORD)
    admin_page.get_by_role("button", name="Log in").click()
    expect(admin_page.locator("#feedback-by-model")).to_contain_text("demo-")
    admin_page.get_by_role("link", name="Feedback", exact=True).first.click()
    admin_page.locator("#changelist-filter").get_by_role("link", name="👎 Bad").click()
    row = admin_page.locator("#result_list tbody tr", has_text=comment)
    expect(row).to_have_count(1)
    expect(row).to_contain_text("demo-")
    row.get_by_role("link", name="The capital of Australia is Sydney.").click()
    expect(admin_page.locator("h1, h2").first).to_be_visible()
    assert "/admin/chat/conversation/" in admin_page.url
    admin.close()

    # Changing one's mind: a 👍 replaces the 👎 (and its comment box goes away).
    press(page, answer.get_by_role("button", name="Good answer"))
    expect(answer.get_by_role("button", name="Good answer")).to_have_attribute(
        "aria-pressed", "true"
    )
    expect(answer.get_by_role("button", name="Bad answer")).to_have_attribute(
        "aria-pressed", "false"
    )
    expect(answer.get_by_label("What was wrong with this answer? (optional)")).to_have_count(0)
    assert errors == []
    context.close()

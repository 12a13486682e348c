"""The model-tier choice in the badge's popover, used as a person uses it: it changes the tier
and nothing else (it used to submit the composer and send whatever was in the box)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.browsing import (
    DEVICES,
    PHONES,
    Frames,
    answers,
    chatsite_with_database,
    manage_shell,
    press,
    signed_in_context,
    type_prompt,
    unique_name,
)

pytestmark = pytest.mark.browser

DRAFT = "a question I have not finished"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, str]]:
    """A server and its database (the tests give some users a plan that allows full)."""
    with chatsite_with_database() as server:
        yield server


def allow_full_on_phones(database_url: str, username: str) -> None:
    """Put the user on a plan that lets them choose the full model on a phone (as an admin
    would in the admin; the admin's own controls are tested elsewhere)."""
    manage_shell(
        database_url,
        "from django.contrib.auth import get_user_model\n"
        "from chat.models import Plan, Quota\n"
        "plan, _ = Plan.objects.get_or_create(name='Full on phones', "
        "defaults={'allow_full_on_mobile': True})\n"
        f"user = get_user_model().objects.get(username={username!r})\n"
        "Quota.objects.update_or_create(user=user, defaults={'plan': plan})\n",
    )


def open_watching_frames(page: Page) -> Frames:
    frames = Frames(page)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    return frames


def choose(page: Page, frames: Frames, button: str, tier: str) -> None:
    """Open the badge, press the choice; the badge and a fresh `ready` frame show `tier`."""
    readies = len(frames.of_type("ready"))
    press(page, page.locator("#tier-badge"))
    info = page.locator("#tier-info")
    expect(info).to_be_visible()
    press(page, info.get_by_role("button", name=button))
    badge = page.locator("#tier-badge")
    expect(badge).to_have_attribute("data-tier", tier)
    expect(badge).to_have_text(re.compile(rf"^{tier.capitalize()} model · demo-{tier}$"))
    expect(info).to_be_hidden()
    # The socket reconnected with the choice in its handshake: the next `ready` says so.
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    new = frames.of_type("ready")[readies:]
    assert new, "no ready frame after the choice"
    assert new[-1]["tier"] == tier
    assert new[-1]["model"] == f"demo-{tier}"


def nothing_was_sent(page: Page, frames: Frames) -> None:
    expect(page.locator("#prompt")).to_have_value(DRAFT)
    expect(answers(page)).to_have_count(0)
    expect(page.locator("#messages article")).to_have_count(0)
    assert frames.of_type("prompt", sent=True) == []


@pytest.mark.parametrize("device", ["desktop"])
def test_choosing_the_lite_model_changes_the_tier_and_sends_nothing(
    browser: Browser, server: tuple[str, str], device: str
) -> None:
    base, _ = server
    context = signed_in_context(browser, base, **DEVICES[device])
    page = context.new_page()
    frames = open_watching_frames(page)
    expect(page.locator("#tier-badge")).to_have_attribute("data-tier", "full")
    type_prompt(page, DRAFT)

    choose(page, frames, "Use the lite model (saves data)", "lite")
    nothing_was_sent(page, frames)
    press(page, page.locator("#tier-badge"))
    expect(page.locator("#tier-info")).to_contain_text("Chosen by you on this device.")
    # The choice is remembered for this device, and can be undone the same way.
    page.keyboard.press("Escape")
    page.reload()
    expect(page.locator("#tier-badge")).to_have_attribute("data-tier", "lite")
    page.locator("#prompt").fill(DRAFT)
    choose(page, frames, "Back to the automatic choice", "full")
    nothing_was_sent(page, frames)
    context.close()


@pytest.mark.parametrize("device", PHONES)
def test_on_a_phone_whose_plan_allows_it_choosing_full_works_and_sends_nothing(
    browser: Browser, server: tuple[str, str], device: str
) -> None:
    base, database_url = server
    username = unique_name("phone")
    context = signed_in_context(browser, base, username=username, **DEVICES[device])
    allow_full_on_phones(database_url, username)
    page = context.new_page()
    frames = open_watching_frames(page)
    expect(page.locator("#tier-badge")).to_have_attribute("data-tier", "lite")  # a phone
    type_prompt(page, DRAFT)

    choose(page, frames, "Use the full model on this device", "full")
    nothing_was_sent(page, frames)
    choose(page, frames, "Back to the automatic choice", "lite")
    nothing_was_sent(page, frames)
    context.close()


@pytest.mark.parametrize("device", PHONES)
def test_on_a_phone_whose_plan_forbids_full_the_popover_says_so(
    browser: Browser, server: tuple[str, str], device: str
) -> None:
    base, _ = server
    context = signed_in_context(browser, base, **DEVICES[device])
    page = context.new_page()
    frames = open_watching_frames(page)
    type_prompt(page, DRAFT)
    press(page, page.locator("#tier-badge"))
    info = page.locator("#tier-info")
    expect(info).to_be_visible()
    expect(info).to_contain_text("Your plan keeps this device on the lite model")
    expect(info.get_by_role("button", name=re.compile("full model"))).to_have_count(0)
    # The device is named once, not as the reason and again as the detected device.
    expect(info).to_contain_text("Chosen because this looks like a phone.")
    expect(info).not_to_contain_text("Detected device")
    press(page, info.get_by_role("button", name="Close"))
    expect(info).to_be_hidden()
    nothing_was_sent(page, frames)
    context.close()


def box(page: Page, selector: str) -> dict[str, float]:
    found = page.locator(selector).bounding_box()
    assert found is not None, selector
    return found


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


@pytest.mark.parametrize("device", list(DEVICES))
def test_the_tier_popover_leaves_the_prompt_box_in_sight_and_closes_when_it_is_used(
    browser: Browser, server: tuple[str, str], device: str
) -> None:
    context = signed_in_context(browser, server[0], **DEVICES[device])
    page = context.new_page()
    open_watching_frames(page)
    info = page.locator("#tier-info")
    press(page, page.locator("#tier-badge"))
    expect(info).to_be_visible()
    # Above the prompt box and its Send button (it was drawn over them from the badge under
    # the box: on a 360x740 phone the box was out of sight while it was open).
    for covered in ("#prompt", ".composer-row button[type=submit]", "#tier-badge"):
        assert not overlap(box(page, "#tier-info"), box(page, covered)), covered
    assert box(page, "#tier-info")["y"] >= 0  # and still on the screen
    # Tapping (clicking) the box closes it, and what is typed goes into the box.
    press(page, page.locator("#prompt"))
    expect(info).to_be_hidden()
    page.keyboard.type("hello")
    expect(page.locator("#prompt")).to_have_value("hello")
    if device == "desktop":
        # Back to the box by keyboard (no click to dismiss it): focusing it closes it too.
        press(page, page.locator("#tier-badge"))
        expect(info).to_be_visible()
        for _ in range(8):
            if page.evaluate("document.activeElement?.id") == "prompt":
                break
            page.keyboard.press("Shift+Tab")
        assert page.evaluate("document.activeElement?.id") == "prompt"
        expect(info).to_be_hidden()
    context.close()

"""Buttons that look like what they are: an enabled Send does not look disabled in the dark
theme (it once was the pale blue of the light theme's disabled Send), and an answer's 👍/👎 are
in full colour, not grey and faded like disabled buttons. axe checks text contrast
(tests/browser/test_accessibility.py); it does not check that enabled looks enabled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.browser.browsing import (
    chatsite_with_database,
    open_chat,
    run_axe,
    send,
    signed_in_context,
    wait_for_answer,
)

pytestmark = pytest.mark.browser

# What a button looks like over the page: its background, blended by the opacity of it and its
# ancestors over the page's background, and its text colour (blended the same way).
LOOK = """el => {
  let opacity = 1;
  for (let e = el; e; e = e.parentElement) opacity *= parseFloat(getComputedStyle(e).opacity);
  const style = getComputedStyle(el);
  return {opacity, filter: style.filter, background: style.backgroundColor, color: style.color,
          page: getComputedStyle(document.body).backgroundColor};
}"""

Rgb = tuple[float, float, float]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with chatsite_with_database() as (base, _):
        yield base


def rgba(css: str) -> tuple[Rgb, float]:
    parts = [float(p) for p in css[css.index("(") + 1 : -1].replace("/", ",").split(",")]
    alpha = parts[3] if len(parts) == 4 else 1.0
    return (parts[0], parts[1], parts[2]), alpha


def over(top: Rgb, alpha: float, under: Rgb) -> Rgb:
    r, g, b = (alpha * t + (1 - alpha) * u for t, u in zip(top, under, strict=True))
    return r, g, b


def luminance(rgb: Rgb) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: Rgb, b: Rgb) -> float:
    light, dark = sorted((luminance(a), luminance(b)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def seen(button: Locator) -> dict[str, Any]:
    """The button's background and text as the eye gets them over the page."""
    look = button.evaluate(LOOK)
    page, _ = rgba(look["page"])
    background, alpha = rgba(look["background"])
    background = over(background, alpha * look["opacity"], page)
    text, text_alpha = rgba(look["color"])
    return {
        "background": background,
        "text": over(text, text_alpha * look["opacity"], background),
        "opacity": look["opacity"],
        "filter": look["filter"],
    }


def send_both_ways(page: Page, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Send's look while an answer streams (disabled) and once it is complete (enabled)."""
    button = page.locator("#send")
    send(page, "/stall 2 /echo hello")
    answer = wait_for_answer(page, n)
    expect(answer).to_have_attribute("data-status", "streaming")
    expect(button).to_be_disabled()
    disabled = seen(button)
    expect(answer).to_have_attribute("data-status", "complete")
    page.locator("textarea[name=text]").fill("next question")
    expect(button).to_be_enabled()
    return disabled, seen(button)


def test_an_enabled_send_in_the_dark_theme_does_not_look_like_a_disabled_one(
    browser: Browser, server: str
) -> None:
    context = signed_in_context(browser, server, color_scheme="light")
    page = open_chat(context)
    light_disabled, light_enabled = send_both_ways(page, 1)
    page.locator("textarea[name=text]").fill("")
    page.get_by_role("button", name="Dark theme").click()
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    dark_disabled, dark_enabled = send_both_ways(page, 2)

    for enabled, disabled in ((light_enabled, light_disabled), (dark_enabled, dark_disabled)):
        # Enabled reads as enabled: its label is clear, and it stands apart from disabled.
        assert contrast(enabled["text"], enabled["background"]) >= 4.5, enabled
        assert contrast(enabled["background"], disabled["background"]) >= 1.5, (enabled, disabled)
    # The complaint itself: dark's enabled Send was light's disabled Send (a ratio of 1.01).
    assert contrast(dark_enabled["background"], light_disabled["background"]) >= 1.5, (
        dark_enabled,
        light_disabled,
    )
    assert run_axe(page) == []
    context.close()


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_vote_buttons_look_enabled_and_the_vote_given_stands_out(
    browser: Browser, server: str, theme: str
) -> None:
    context = signed_in_context(browser, server, color_scheme=theme)
    page = open_chat(context)
    send(page, "/echo An answer to vote on.")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")
    up = answer.get_by_role("button", name="Good answer")
    down = answer.get_by_role("button", name="Bad answer")
    for button in (up, down):
        look = seen(button)
        # Neither faded nor grey: the emoji in its own colours, as on any enabled button.
        assert look["opacity"] == 1 and look["filter"] == "none", look
    up.click()
    expect(up).to_have_attribute("aria-pressed", "true")
    pressed, other = seen(up), seen(down)
    assert other["opacity"] == 1 and other["filter"] == "none", other
    assert pressed["background"] != other["background"]
    assert run_axe(page) == []
    context.close()

"""Live rendering (issue 15), in Chromium: an answer looks finished while it streams and does not
move when it ends — on a desktop and on phones.

The demo model answers `/echo <markdown>` at 20 tokens/s. Before `done` the page must show the
heading, bold words, three list items, a code block with its language label and a formula,
rendered; after `done` each of those elements is the same element at the same place in the
answer (±2 px), the reader's scroll position is kept, and a reload shows the same HTML.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    DEVICES,
    PHONES,
    is_touch,
    press,
    send,
    signed_in_context,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser

ANSWER = "\n".join(
    [
        "# Plan for the week",
        "",
        "Start with the **important** part, then the rest.",
        "",
        "- first item",
        "- second item",
        "- third item",
        "",
        "```python",
        "def area(r):",
        "    return 3.14 * r * r",
        "```",
        "",
        "The area is $\\pi r^2$ for a circle.",
        "",
        "Some words after the formula so that the answer goes on streaming for a while, "
        "long enough to look at it before it ends, and to type the next question meanwhile.",
        "",
        "The end of the answer comes after this last line of plain text.",
    ]
)

# The elements to find before `done`, and their places relative to the answer's body.
PLACES = """
(article) => {
  const body = article.querySelector(".body");
  const top = body.getBoundingClientRect().top;
  const left = body.getBoundingClientRect().left;
  const found = {
    heading: body.querySelector("h1"),
    strong: body.querySelector("strong"),
    item: body.querySelectorAll("li")[2],
    pre: body.querySelector(".codeblock pre"),
    label: body.querySelector(".codeblock .codeblock-lang"),
    math: body.querySelector("math"),
  };
  const places = {};
  for (const [name, el] of Object.entries(found)) {
    if (!el) return null;
    const box = el.getBoundingClientRect();
    places[name] = [box.top - top, box.left - left, box.height];
  }
  window.__liveElements ||= found;  // the elements as first found, all of them
  return {
    places,
    items: body.querySelectorAll("li").length,
    label: found.label.textContent,
    same: Object.entries(window.__liveElements).every(([k, el]) => el === found[k]),
    scroll: document.getElementById("messages").scrollTop,
    viewport: found.heading.getBoundingClientRect().top,
  };
}
"""


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite(DEMO_TOKENS_PER_SECOND="20", DEMO_TTFB_MS="0") as base:
        yield base


def close(a: list[float], b: list[float]) -> bool:
    return all(abs(x - y) <= 2 for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("device", ["desktop", *PHONES])
def test_markdown_renders_while_it_streams_and_nothing_moves_at_the_end(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = context.new_page()
    errors = watch_for_errors(page)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, "/echo " + ANSWER)
    answer = wait_for_answer(page, 1)

    # Before `done`: every element rendered (by the server's blocks), the answer still streams.
    page.wait_for_function(f"(a) => ({PLACES})(a) !== null", arg=answer.element_handle())
    before: dict[str, Any] = answer.evaluate(PLACES)
    expect(answer).to_have_attribute("data-status", "streaming")
    assert before["items"] == 3
    assert before["label"] == "python"
    body = answer.locator(".body")
    assert "**" not in body.inner_text() and "```" not in body.inner_text()

    # The reader scrolls up a little (if the thread can scroll): the page must not follow.
    messages = page.locator("#messages")
    page.evaluate(
        "() => { const m = document.getElementById('messages');"
        " m.scrollTop = Math.max(0, m.scrollHeight - m.clientHeight - 60); }"
    )
    page.wait_for_timeout(100)  # let the page see the scroll (its listener sets follow off)
    before = answer.evaluate(PLACES)
    scrolled_up = messages.evaluate("m => m.scrollHeight - m.clientHeight - m.scrollTop > 40")

    # Meanwhile the next question can be typed.
    box = page.locator("#prompt")
    press(page, box)
    page.keyboard.type("/echo and then?")
    expect(box).to_have_value("/echo and then?")

    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)
    after: dict[str, Any] = answer.evaluate(PLACES)
    assert after["same"], "an element rendered while streaming was replaced at the end"
    for name, place in before["places"].items():
        assert close(place, after["places"][name]), (name, place, after["places"][name])
    if scrolled_up:
        assert abs(after["scroll"] - before["scroll"]) <= 2
        assert abs(after["viewport"] - before["viewport"]) <= 2
    expect(box).to_have_value("/echo and then?")
    live_html = body.inner_html()

    # A reload shows the same HTML as the live tab (its copy buttons are the page's own).
    page.reload()
    reloaded = wait_for_answer(page, 1)
    expect(reloaded).to_have_attribute("data-status", "complete")
    assert reloaded.locator(".body").inner_html() == live_html
    if not is_touch(page):
        assert errors == []
    context.close()


# Per animation frame, while the answer streams and a few frames after: its status, how far
# the body's bottom is above the thread's bottom, and whether the thread is at its bottom
# (and can scroll at all).
BOTTOMS = """
(article) => {
  const m = document.getElementById("messages");
  const body = article.querySelector(".body");
  const seen = (window.__bottoms = []);
  let after = 5;
  const tick = () => {
    seen.push({
      status: article.dataset.status,
      gap: m.getBoundingClientRect().bottom - body.getBoundingClientRect().bottom,
      atBottom: m.scrollHeight - m.clientHeight - m.scrollTop <= 2,
      scrolls: m.scrollHeight > m.clientHeight + 50,
    });
    if (article.dataset.status === "streaming" || --after > 0) requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}
"""


@pytest.fixture(scope="module")
def fast_server() -> Iterator[str]:
    with running_chatsite(DEMO_TOKENS_PER_SECOND="200", DEMO_TTFB_MS="0") as base:
        yield base


@pytest.mark.parametrize("device", ["desktop", PHONES[0]])
def test_a_reader_at_the_bottom_sees_nothing_move_up_when_the_answer_ends(
    browser: Browser, fast_server: str, device: str
) -> None:
    # The new user's review: the footer's buttons and the details line came at `done` and
    # pushed the last lines read up by 70 px. A streaming answer now keeps their room.
    context = signed_in_context(browser, fast_server, **DEVICES[device])
    page = context.new_page()
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, "/long 700")
    answer = wait_for_answer(page, 1)
    answer.evaluate(BOTTOMS)
    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)
    page.wait_for_function("() => window.__bottoms.at(-1).status === 'complete'")
    page.wait_for_timeout(300)
    seen: list[dict[str, Any]] = page.evaluate("() => window.__bottoms")
    streaming = [s for s in seen if s["status"] == "streaming" and s["scrolls"] and s["atBottom"]]
    assert streaming, "the answer never filled the thread while it streamed"
    end = seen[-1]
    assert end["status"] == "complete" and end["atBottom"]
    assert abs(end["gap"] - streaming[-1]["gap"]) <= 2, (streaming[-1], end)
    context.close()


def test_an_unclosed_code_fence_shows_as_a_code_block_that_grows(
    browser: Browser, server: str
) -> None:
    code = "\n".join(f"const line{i} = {i} * 2;" for i in range(30))
    context = signed_in_context(browser, server, **DEVICES["desktop"])
    page = context.new_page()
    errors = watch_for_errors(page)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, f"/echo Intro.\n\n```js\n{code}\n```\n\nDone.")
    answer = wait_for_answer(page, 1)
    # While the fence is open: the page's preview, a code block with its label, never "```".
    growing = answer.locator(".live-tail .codeblock")
    expect(growing.locator(".codeblock-lang")).to_have_text("js")
    lines = "(el) => el.querySelector('.live-tail pre code')?.textContent.split('\\n').length || 0"
    page.wait_for_function(f"(el) => ({lines})(el) > 3", arg=answer.element_handle())
    first = answer.evaluate(lines)
    page.wait_for_function(f"(el) => ({lines})(el) > {first + 2}", arg=answer.element_handle())
    expect(answer).to_have_attribute("data-status", "streaming")
    assert "```" not in answer.locator(".body").inner_text()
    # Closed, it is the server's block: highlighted, with its label and a copy button.
    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)
    expect(answer.locator(".body .live-tail")).to_have_count(0)
    expect(answer.locator(".codeblock code.language-javascript")).to_contain_text("line29")
    expect(answer.locator(".codeblock .copy-code")).to_have_count(1)
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", ["desktop", "android"])
def test_a_formula_in_a_list_still_being_written_shows_no_dollar_signs(
    browser: Browser, server: str, device: str
) -> None:
    """New-user review: a list is one block, rendered when it ends; until then its formulas
    showed as `$x_i^2 + \\frac{a}{b}$` for seconds. The open tail's preview shows them as
    text (symbols, scripts, a/b) until the list's block brings their MathML."""
    items = [f"- item {i} is $x_{i}^2 + \\frac{{a}}{{b}}$ with words after it" for i in range(12)]
    context = signed_in_context(browser, server, **DEVICES[device])
    page = context.new_page()
    errors = watch_for_errors(page)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, "/echo " + "\n".join(["Squares:", "", *items, "", "$$", "\\sum_i x_i", "$$"]))
    answer = wait_for_answer(page, 1)
    preview = answer.locator(".live-tail li .math-preview")
    expect(preview.nth(1)).to_be_visible()
    expect(answer).to_have_attribute("data-status", "streaming")
    # Every item whose line is complete (the last may still wait for its closing `$`, a
    # second at most: a lone `$` is money until its closer comes).
    done_items = answer.evaluate(
        "a => [...a.querySelectorAll('.live-tail li')].slice(0, -1).map((li) => li.innerText)"
    )
    assert len(done_items) >= 1
    for text in done_items:
        assert "$" not in text and "\\frac" not in text, text
    assert "a/b" in preview.first.inner_text()
    expect(preview.first.locator("sup")).to_have_text("2")
    # Done: the list's block brings real MathML, and the display formula too; no preview left.
    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)
    expect(answer.locator(".body .math-preview")).to_have_count(0)
    expect(answer.locator(".body li math")).to_have_count(12)
    assert "$" not in answer.locator(".body").inner_text()
    if not is_touch(page):
        assert errors == []
    context.close()


# Where each list item's text starts, relative to the answer's body, and how deep it sits.
ITEM_PLACES = """
(article) => {
  const body = article.querySelector(".body");
  const origin = body.getBoundingClientRect();
  return [...body.querySelectorAll("li")].map((li) => {
    const box = li.getBoundingClientRect();
    let depth = 0;
    for (let up = li.parentElement; up && up !== body; up = up.parentElement) {
      if (up.localName === "li") depth += 1;
    }
    return { text: li.firstChild?.textContent.trim() ?? "", depth,
             place: [box.top - origin.top, box.left - origin.left] };
  });
}
"""


@pytest.mark.parametrize("device", ["desktop", *PHONES])
def test_a_nested_list_item_stays_nested_and_in_place_when_stopped_mid_list(
    browser: Browser, server: str, device: str
) -> None:
    """New-user review (`/markdown 2000`): an item indented under the one above ("  - …") was
    drawn top-level while the list streamed, and jumped in as a sub-item when Stop brought the
    server's render. The preview nests it as markdown-it does: nothing moves at Stop."""
    items = []
    for i in range(14):
        items.append(f"- item {i} says a few words about the list")
        if i % 3 == 0:
            items.append(f"  - sub-item {i} goes under item {i}")
    context = signed_in_context(browser, server, **DEVICES[device])
    page = context.new_page()
    errors = watch_for_errors(page)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, "/echo " + "\n".join(["A list:", "", *items, "", "The end."]))
    answer = wait_for_answer(page, 1)
    # Two sub-items written (the list is one block: all of it is still the live preview).
    answer.locator(".live-tail li", has_text="item 4 says").wait_for()
    before = {item["text"]: item for item in answer.evaluate(ITEM_PLACES)}
    expect(answer).to_have_attribute("data-status", "streaming")
    press(page, page.get_by_role("button", name="■ Stop"))
    expect(answer).to_have_attribute("data-status", "stopped", timeout=30_000)
    expect(answer.locator(".body .live-tail")).to_have_count(0)
    # Items drawn after the snapshot only add below; the line being written then has
    # another text now, and is skipped.
    after = {item["text"]: item for item in answer.evaluate(ITEM_PLACES)}
    assert any(item["depth"] == 1 for item in before.values())
    assert any(item["depth"] == 1 for item in after.values())
    for text, item in before.items():
        if text not in after:
            continue  # the line being written when Stop came
        assert item["depth"] == after[text]["depth"], (text, item, after[text])
        assert close(item["place"], after[text]["place"]), (text, item, after[text])
    if not is_touch(page):
        assert errors == []
    context.close()


# Per animation frame, from before the prompt is sent until the answer ends: how many blocks
# the newest answer's body holds, and its status.
BLOCKS_PER_FRAME = """
() => {
  const seen = (window.__placed = []);
  const tick = () => {
    const article = document.querySelector("article.msg-assistant:last-of-type");
    const body = article?.querySelector(".body");
    if (body) {
      const blocks = body.querySelectorAll(":scope > :not(.live-tail)").length;
      seen.push([article.dataset.status, blocks]);
    }
    if (article?.dataset.status !== "complete") requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}
"""


@pytest.fixture(scope="module")
def full_speed_server() -> Iterator[str]:
    with running_chatsite(DEMO_TOKENS_PER_SECOND="0", DEMO_TTFB_MS="0") as base:
        yield base


@pytest.mark.parametrize("device", ["desktop", "android"])
def test_a_slow_device_places_a_fast_answer_over_many_frames_and_ends_like_a_reload(
    browser: Browser, full_speed_server: str, device: str
) -> None:
    # An answer that arrives faster than the device lays it out (a 6,000-token markdown answer
    # at full speed, on a CPU slowed 6 times): the page places it a few blocks a frame, sized
    # by what its frames cost (pace.js), and the final HTML and `done` wait for the blocks
    # before them. Before, the final HTML made the page place every block left in one frame:
    # a long task that grows with how far behind the page was.
    context = signed_in_context(browser, full_speed_server, **DEVICES[device])
    page = context.new_page()
    errors = watch_for_errors(page)
    # Chromium's CPU throttling (DevTools protocol): the slow phone this test is about.
    context.new_cdp_session(page).send("Emulation.setCPUThrottlingRate", {"rate": 6})
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    page.evaluate(BLOCKS_PER_FRAME)
    send(page, "/markdown 6000")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete", timeout=60_000)
    seen: list[list[Any]] = page.evaluate("() => window.__placed")
    body = answer.locator(".body")
    total = body.evaluate("(b) => b.children.length")
    assert total > 60, total
    counts = [0] + [count for status, count in seen if status == "streaming"]
    placed_at_end = total - counts[-1]
    steps = [b - a for a, b in pairwise(counts)]
    # The answer showed up over many frames while it streamed, not in one at its end (before:
    # no block placed while it streamed, then all of them in the task of the final HTML).
    assert placed_at_end <= total // 4, (placed_at_end, total, seen)
    assert len([s for s in steps if s > 0]) >= 4, (total, seen)
    assert max(steps) <= total // 2, (total, seen)
    # And nothing was lost or laid out differently for it: the same HTML as a reload.
    expect(body).to_have_attribute("data-blocks", str(total))
    live_html = body.inner_html()
    expect(page.locator("#send")).to_be_visible()  # `done` reached the composer
    page.reload()
    reloaded = wait_for_answer(page, 1)
    assert reloaded.locator(".body").inner_html() == live_html
    if not is_touch(page):
        assert errors == []
    context.close()

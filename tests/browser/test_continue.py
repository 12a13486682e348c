"""Continue, used as a person uses it on a desktop and on phones (issue 17.3): stop an answer,
press Continue, and get one longer answer whose old text is its beginning; and the same for an
answer that ended at the model's length limit (`/length`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect

from tests.browser.browsing import (
    DEVICES,
    PHONES,
    answers,
    long_text,
    open_chat,
    press,
    send,
    signed_in_context,
    source_text,
    statuses,
    wait_for_answer,
    watch_for_errors,
)
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    # 50 tokens/s: slow enough to stop a long answer mid-way, and to see it go on.
    with running_chatsite(DEMO_TOKENS_PER_SECOND="50", DEMO_TTFB_MS="0") as base:
        yield base


def stopped_long_answer(page: Page, index: int = 1, *, shown: int = 40) -> Locator:
    """Ask `/long 120` and press Stop once the answer (the `index`-th) shows `shown` characters."""
    send(page, "/long 120")
    answer = wait_for_answer(page, index)
    page.wait_for_function(
        f"(el) => el.querySelector('.body').textContent.length > {shown}",
        arg=answer.element_handle(),
    )
    press(page, page.get_by_role("button", name="■ Stop"))
    expect(answer).to_have_attribute("data-status", "stopped")
    return answer


@pytest.mark.parametrize("device", list(DEVICES))
def test_stop_then_continue_gives_one_longer_answer(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    whole = long_text(120)
    answer = stopped_long_answer(page)
    old = source_text(answer)
    assert 40 <= len(old) < len(whole)

    press(page, answer.get_by_role("button", name="Continue"))
    expect(answer).to_have_attribute("data-status", "complete", timeout=20_000)
    expect(answers(page)).to_have_count(1)  # the same answer, longer: not a new one
    new = source_text(answer)
    assert new.startswith(old) and new == whole
    assert answer.locator(".body").inner_text().split()[:5] == old.split()[:5]
    mid = answer.get_attribute("data-mid")
    assert mid and statuses(page, mid)[-3:] == ["stopped", "streaming", "complete"]
    expect(answer.get_by_role("button", name="Continue")).to_have_count(0)
    # A reload finds the one whole answer.
    page.reload()
    expect(answers(page)).to_have_count(1)
    assert source_text(answers(page).first) == whole
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", ["desktop", PHONES[0]])
def test_continue_is_offered_on_the_last_answer_only(
    browser: Browser, server: str, device: str
) -> None:
    # A stopped answer followed by another exchange: Continue there would rewrite what the
    # later answer was written from (the new user's review pressed it), so it is not offered.
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    first = stopped_long_answer(page)
    expect(first.get_by_role("button", name="Continue")).to_be_visible()

    send(page, "/echo second")
    second = wait_for_answer(page, 2)
    expect(second).to_have_attribute("data-status", "complete")
    expect(first.get_by_role("button", name="Continue")).to_be_hidden()
    page.reload()
    expect(answers(page).first.get_by_role("button", name="Continue")).to_be_hidden()
    assert errors == []
    context.close()


@pytest.mark.parametrize("device", list(DEVICES))
def test_a_length_limited_answer_continues_until_it_ends(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    send(page, "/length 15 /long 30")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")
    expect(answer.locator(".msg-footer")).to_contain_text("length limit")
    press(page, answer.get_by_role("button", name="Continue"))
    expect(answer.locator(".msg-footer")).not_to_contain_text("length limit", timeout=20_000)
    expect(answer).to_have_attribute("data-status", "complete")
    assert source_text(answer) == long_text(30)
    expect(answer.get_by_role("button", name="Continue")).to_have_count(0)
    assert errors == []
    context.close()


# Each paragraph of an answer's body, in order: its top relative to the body and its text.
PARAGRAPHS = """
(article) => {
  const body = article.querySelector(".body");
  const top = body.getBoundingClientRect().top;
  return [...body.querySelectorAll("p")].map((p) => [
    p.getBoundingClientRect().top - top,
    p.textContent.replace(/\\s+/g, " ").trim(),
  ]);
}
"""


def stop_mid_paragraph(page: Page) -> tuple[Locator, str]:
    """Ask for a long answer and stop it; again if the stop fell on a paragraph's end (rare:
    the test is about the paragraph a stop cuts). The answer and its text."""
    for count in range(1, 4):
        send(page, "/long 400")
        answer = wait_for_answer(page, count)
        page.wait_for_function(
            "(el) => el.querySelector('.body').textContent.length > 40",
            arg=answer.element_handle(),
        )
        press(page, page.get_by_role("button", name="■ Stop"))
        expect(answer).to_have_attribute("data-status", "stopped")
        old = source_text(answer)
        if not old.endswith("\n"):
            return answer, old
    raise AssertionError("three answers in a row stopped at a paragraph's end")


@pytest.mark.parametrize("device", ["desktop", PHONES[0]])
def test_a_continuation_goes_on_in_the_same_paragraph_and_nothing_moves_at_the_end(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    whole = long_text(400)
    answer, old = stop_mid_paragraph(page)
    last, following = old.split()[-1], whole[len(old) :].split()[:3]

    press(page, answer.get_by_role("button", name="Continue"))
    # While it streams: the words on both sides of the stop are in one <p>.
    joined = " ".join([last, *following])
    # By id: the continuation's shell replaces the article element (out of band).
    page.wait_for_function(
        "([mid, words]) => document.getElementById(`msg-${mid}`)?.querySelector('.body')"
        ".textContent.replace(/\\s+/g, ' ').includes(words)",
        arg=[answer.get_attribute("data-mid"), joined],
    )
    seen = answer.evaluate(
        "(el, words) => ({status: el.dataset.status, paragraphs: [...el.querySelectorAll("
        "'.body p')].filter((p) => p.textContent.replace(/\\s+/g, ' ').includes(words))"
        ".length})",
        joined,
    )
    assert seen == {"status": "streaming", "paragraphs": 1}, seen

    # The paragraphs as the page shows them just before the final HTML is swapped in (every
    # chunk and block painted by then), then after the end: the same, at the same places.
    before_end = (
        "(mid) => window.addEventListener('htmx:oobBeforeSwap', (event) => {"
        "  const target = event.detail.target;"
        "  if (target.dataset?.mid !== mid || window.__beforeEnd) return;"
        f"  window.__beforeEnd = ({PARAGRAPHS})(target);"
        "}, true)"
    )
    page.evaluate(before_end, answer.get_attribute("data-mid"))
    expect(answer).to_have_attribute("data-status", "complete", timeout=30_000)
    before: list[list[Any]] = page.evaluate("() => window.__beforeEnd")
    after: list[list[Any]] = answer.evaluate(PARAGRAPHS)
    assert before and len(after) == len(before)
    # From the continued paragraph on: those were laid out as they streamed in. The earlier
    # blocks came in the shell, and off screen `content-visibility: auto` (chat.css) may show
    # them as placeholders until scrolled to, which is not the end moving anything.
    first = next(i for i, (_top, text) in enumerate(before) if joined in text)
    for (top_before, text_before), (top_after, text_after) in zip(
        before[first:], after[first:], strict=True
    ):
        assert text_after == text_before
        assert abs(top_after - top_before) <= 2, (text_before[:40], top_before, top_after)
    assert source_text(answer) == whole
    # The continued paragraph is one paragraph of the final HTML too.
    assert sum(joined in text for _top, text in after) == 1
    assert errors == []
    context.close()


# The fewest characters the answer's body showed since this ran (new-user review: another tab
# emptied a continued answer and refilled it from its first chunk).
WATCH_SHORTEST = """
(mid) => {
  window.shortest = Infinity;
  const measure = () => {
    const body = document.querySelector(`#msg-${mid} > .body`);
    window.shortest = Math.min(window.shortest, body ? body.textContent.trim().length : 0);
  };
  measure();
  new MutationObserver(measure).observe(document.getElementById("messages"), {
    subtree: true, childList: true, characterData: true,
  });
}
"""


@pytest.mark.parametrize("device", ["desktop", PHONES[0]])
def test_another_tab_keeps_showing_a_continued_answer_as_it_goes_on(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    answer = stopped_long_answer(page, shown=80)
    mid = answer.get_attribute("data-mid")
    old = source_text(answer)

    other = open_chat(context, page.url)
    errors = watch_for_errors(other)
    theirs = other.locator(f"#msg-{mid}")
    expect(theirs).to_have_attribute("data-status", "stopped")
    shown = len(theirs.locator(".body").inner_text().strip())
    other.evaluate(WATCH_SHORTEST, mid)

    press(page, answer.get_by_role("button", name="Continue"))
    expect(theirs).to_have_attribute("data-status", "complete", timeout=20_000)
    expect(answer).to_have_attribute("data-status", "complete", timeout=20_000)
    assert source_text(theirs) == source_text(answer) == long_text(120)
    assert source_text(theirs).startswith(old)
    # It never showed less than the answer it had: it went on from there.
    shortest = other.evaluate("window.shortest")
    assert shortest >= shown * 0.9, (shortest, shown)
    assert theirs.locator(".body").inner_text().split()[:5] == old.split()[:5]
    assert errors == []
    context.close()

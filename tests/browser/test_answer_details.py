"""Each answer says which model wrote it and, in its details line, the tokens in and out, on a
desktop and on phones: the same numbers as the answer's `done` frame, live and after a reload."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from tests.browser.browsing import (
    DEVICES,
    Frames,
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


@pytest.mark.parametrize("device", list(DEVICES))
def test_an_answer_shows_its_model_and_tokens_in_and_out(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = context.new_page()
    frames = Frames(page)
    page.goto("/")
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    errors = watch_for_errors(page)
    send(page, "/echo four words of answer")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")
    ready = frames.of_type("ready")[-1]
    usage = frames.of_type("done")[-1]["usage"]
    assert usage["completion_tokens"] > 0
    expected = f"{usage['prompt_tokens']} tokens in · {usage['completion_tokens']} out"
    details = answer.locator(".answer-details")
    expect(details.locator(".details-model")).to_have_text(ready["model"])
    expect(details.locator(".details-tokens")).to_have_text(expected)
    expect(answer.locator(".meta .model")).to_have_text(ready["model"])
    page.reload()
    answer = wait_for_answer(page, 1)
    expect(answer.locator(".answer-details .details-tokens")).to_have_text(expected)
    assert errors == []
    context.close()

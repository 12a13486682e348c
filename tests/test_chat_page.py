"""The chat page's template filters: which failed answers offer Retry."""

from __future__ import annotations

import pytest

from chat import conversations
from chat.bubbles import failure
from chat.turns import turn
from chat.upstream import errors


@pytest.mark.parametrize(
    "error",
    [
        errors.SERVER_TROUBLE_MESSAGE,
        errors.BUSY_MESSAGE,
        errors.UNREACHABLE_MESSAGE,
        errors.UNREADABLE_MESSAGE,
        errors.STREAM_ERROR_MESSAGE,
        errors.DROPPED_MESSAGE,
        errors.EMPTY_ANSWER_MESSAGE,
        conversations.INTERRUPTED,
        turn.FAILED_INTERNAL,
        "",  # an answer saved before errors had words
    ],
)
def test_a_failure_that_may_pass_offers_retry(error: str) -> None:
    assert failure(error).retry
    assert failure(error + ".").retry


@pytest.mark.parametrize(
    ("error", "advice"),
    [
        (errors.NOT_ALLOWED_MESSAGE, "model settings"),
        (errors.NO_SUCH_MODEL_MESSAGE, "model settings"),
        (errors.REFUSED_REQUEST_MESSAGE, "shorten it"),
        (turn.DELETED, ""),
    ],
)
def test_a_failure_the_same_request_meets_again_offers_advice_instead(
    error: str, advice: str
) -> None:
    found = failure(error)
    assert not found.retry
    assert advice in found.advice

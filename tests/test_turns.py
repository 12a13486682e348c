"""The pieces of a turn that need no socket: adaptive coalescing and token estimates."""

import pytest

from chat.tokens import estimate_tokens
from chat.turns.turn import COALESCE_BUSY_TURNS, COALESCE_MAX_MS, coalesce_interval


def test_frames_stay_at_the_base_interval_while_few_answers_stream() -> None:
    for streaming in (0, 1, COALESCE_BUSY_TURNS):
        assert coalesce_interval(0.016, streaming) == 0.016


def test_frames_widen_with_load_up_to_the_cap() -> None:
    widths = [coalesce_interval(0.016, n) for n in range(COALESCE_BUSY_TURNS, 1000, 7)]
    assert widths == sorted(widths), "never narrower under more load"
    assert widths[-1] == pytest.approx(COALESCE_MAX_MS / 1000)
    assert max(widths) <= COALESCE_MAX_MS / 1000


def test_coalescing_switched_off_stays_off_under_load() -> None:
    assert coalesce_interval(0.0, 500) == 0.0


def test_token_estimates_round_up_and_are_zero_for_nothing() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abc") == 1
    assert estimate_tokens("a" * 400) == 100

"""Usage records: one row per user, day, model and tier; the daily series; the admin's chart."""

from __future__ import annotations

import asyncio
import uuid
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from chat.limits.usage import daily_series, record_usage, usage_svg
from chat.models import Usage

SVG = "{http://www.w3.org/2000/svg}"


def today() -> Any:
    return datetime.now(UTC).date()


def make_user(name: str = "ada") -> Any:
    return get_user_model().objects.create(username=f"{name}-{uuid.uuid4().hex[:8]}")


# record_usage runs the ORM in a worker thread: a transactional test lets that thread see rows;
# serialized_rollback restores the seeded rows the flush removes (as the other tests expect).
async_db = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@async_db
async def test_recording_twice_sums_into_one_row() -> None:
    user = await get_user_model().objects.acreate(username="ada")
    await record_usage(
        user.id, model="demo-full", tier="full", prompt_tokens=10, completion_tokens=100
    )
    await record_usage(
        user.id, model="demo-full", tier="full", prompt_tokens=5, completion_tokens=50
    )
    rows = [row async for row in Usage.objects.filter(user=user)]
    assert len(rows) == 1
    (row,) = rows
    assert (row.day, row.requests, row.prompt_tokens, row.completion_tokens) == (
        today(),
        2,
        15,
        150,
    )


@async_db
async def test_each_model_and_tier_gets_its_own_row() -> None:
    user = await get_user_model().objects.acreate(username="ada")
    await record_usage(
        user.id, model="demo-full", tier="full", prompt_tokens=1, completion_tokens=1
    )
    await record_usage(
        user.id, model="demo-lite", tier="lite", prompt_tokens=1, completion_tokens=1
    )
    assert await Usage.objects.filter(user=user).acount() == 2


@async_db
async def test_turns_ending_together_are_all_counted() -> None:
    user = await get_user_model().objects.acreate(username="ada")
    await asyncio.gather(
        *(
            record_usage(
                user.id, model="demo-full", tier="full", prompt_tokens=1, completion_tokens=2
            )
            for _ in range(8)
        )
    )
    row = await Usage.objects.aget(user=user)
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (8, 8, 16)


@pytest.mark.django_db
def test_the_series_is_zero_filled_oldest_first_and_ends_today() -> None:
    ada, bob = make_user("ada"), make_user("bob")
    t = today()
    Usage.objects.create(
        user=ada, day=t, model="m", tier="full", requests=2, prompt_tokens=10, completion_tokens=20
    )
    Usage.objects.create(
        user=ada, day=t, model="m2", tier="lite", requests=1, prompt_tokens=1, completion_tokens=1
    )
    Usage.objects.create(
        user=ada,
        day=t - timedelta(days=2),
        model="m",
        tier="full",
        requests=1,
        prompt_tokens=5,
        completion_tokens=5,
    )
    Usage.objects.create(
        user=bob, day=t, model="m", tier="full", requests=4, prompt_tokens=100, completion_tokens=0
    )
    # Older than the window: left out.
    Usage.objects.create(
        user=ada,
        day=t - timedelta(days=9),
        model="m",
        tier="full",
        requests=9,
        prompt_tokens=9,
        completion_tokens=9,
    )

    assert daily_series(ada.id, days=4) == [
        (t - timedelta(days=3), 0, 0),
        (t - timedelta(days=2), 1, 10),
        (t - timedelta(days=1), 0, 0),
        (t, 3, 32),
    ]
    # None: the whole site.
    assert daily_series(None, days=4)[-1] == (t, 7, 132)


@pytest.mark.django_db
def test_the_default_series_covers_thirty_days() -> None:
    series = daily_series(make_user().id)
    assert len(series) == 30
    assert series[-1] == (today(), 0, 0)


def test_the_chart_is_an_accessible_svg_with_a_bar_per_day() -> None:
    t = today()
    series = [(t - timedelta(days=2), 1, 100), (t - timedelta(days=1), 0, 0), (t, 3, 2500)]
    root = ET.fromstring(usage_svg(series, title="Tokens of <ada> & co"))
    assert root.tag == f"{SVG}svg"
    assert root.get("role") == "img"
    title = root.find(f"{SVG}title")
    assert title is not None
    # Escaped on the way out, so the parsed title is exactly the text given.
    assert title.text == "Tokens of <ada> & co"
    assert title.get("id") in (root.get("aria-labelledby") or "").split()
    bars = root.findall(f"{SVG}rect")
    assert len(bars) == 3
    heights = [float(bar.get("height") or 0) for bar in bars]
    assert heights[1] == 0
    assert heights[2] > heights[0] > 0
    tooltip = bars[2].find(f"{SVG}title")
    assert tooltip is not None
    assert tooltip.text == f"{t:%Y-%m-%d}: 2,500 tokens, 3 requests"


def test_an_empty_chart_is_still_valid_svg_and_says_so() -> None:
    root = ET.fromstring(usage_svg([], title="Nothing"))
    assert root.findall(f"{SVG}rect") == []
    assert "No usage yet" in "".join(root.itertext())


def test_two_charts_on_one_page_have_distinct_ids() -> None:
    first = ET.fromstring(usage_svg([], title="a")).find(f"{SVG}title")
    second = ET.fromstring(usage_svg([], title="a")).find(f"{SVG}title")
    assert first is not None
    assert second is not None
    assert first.get("id") != second.get("id")

"""The row a turn's end stores, column by column, and the final frame it makes.

`do_finish_message` writes its statement out (docs/decisions/performance.md, issue 18): one
UPDATE … RETURNING where the database can return columns, else an UPDATE then a SELECT. These
tests pin every column of a finished answer's row on both paths, that the message handed to the
final frame and `done` is that row, that an answer whose conversation was deleted finishes to
nothing without an error, and that the final frame of an answer its turn knows is its only
version (no versions query) is the frame the versions query makes. They run on SQLite and, with
DATABASE_URL=postgres://…, PostgreSQL.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from chat import conversations, fragments
from chat.models import Message, Usage
from chat.turns.saving import save_answer
from tests.conftest import assistant_mid, receive_until_done

ADMISSION = {"slot": "s-1", "day": "2026-12-02", "reserved": 700}


def _columns() -> set[str]:
    return {f.attname for f in Message._meta.concrete_fields}


def _row(mid: str) -> dict[str, Any]:
    row = Message.objects.filter(mid=mid).values(*_columns()).get()
    assert set(row) == _columns()  # a new column must be pinned here too
    return row  # type: ignore[no-any-return]


def _aware_between(value: Any, low: datetime, high: datetime) -> None:
    assert isinstance(value, datetime) and value.tzinfo is not None, value
    assert low <= value <= high, (low, value, high)


def _started(owner: Any) -> Any:
    return conversations.do_start_exchange(
        owner.pk, None, "question", model="demo-full", tier="full", admission=ADMISSION
    )


FINISHES = [
    dict(
        text="the **answer**",
        html="<p>the <strong>answer</strong></p>\n",
        status=Message.Status.COMPLETE,
        error="",
        chunk_count=7,
        prompt_tokens=2**31 - 1,
        completion_tokens=3,
        usage_estimated=False,
        ttft_ms=120,
    ),
    # An upstream's error as it came: NUL (PostgreSQL text cannot hold it) and too long.
    dict(
        text="half an",
        html=None,
        status=Message.Status.FAILED,
        error="bad\x00 upstream " + "x" * 400,
        chunk_count=2,
        prompt_tokens=0,
        completion_tokens=0,
        usage_estimated=True,
        ttft_ms=None,
    ),
    dict(
        text="",
        html="",
        status=Message.Status.STOPPED,
        error="Stopped.",
        chunk_count=0,
        prompt_tokens=4,
        completion_tokens=0,
        usage_estimated=True,
        ttft_ms=0,
    ),
]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.parametrize("returning", [True, False], ids=["returning", "update-then-select"])
@pytest.mark.parametrize("save", FINISHES, ids=["complete", "failed", "stopped"])
def test_a_finished_answer_stores_these_columns(
    owner: Any, monkeypatch: Any, returning: bool, save: dict[str, Any]
) -> None:
    mid = _started(owner).answer.mid
    if not returning:  # as on a SQLite before 3.35 (the start above returned its ids)
        monkeypatch.setattr(connection.features, "can_return_columns_from_insert", False)
    before_row = _row(mid)
    assert before_row["lease_until"] is not None
    before = timezone.now()
    message = conversations.do_finish_message(mid, **save)
    after = timezone.now()
    assert message is not None

    row = _row(mid)
    _aware_between(row.pop("finished_at"), before, after)
    expected = {**before_row, **save, "lease_until": None}
    del expected["finished_at"]
    if save["status"] == Message.Status.FAILED:
        expected["error"] = ("bad upstream " + "x" * 400)[:300]
    assert row == expected
    # The message handed to the final frame and `done` is the row as the ORM loads it.
    loaded = Message.objects.get(mid=mid)
    assert {n: getattr(message, n) for n in _columns()} == {
        n: getattr(loaded, n) for n in _columns()
    }
    assert message.admission and message.admission == loaded.admission  # JSON, as the ORM reads it
    assert not message._state.adding


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.parametrize("returning", [True, False], ids=["returning", "update-then-select"])
def test_an_answer_whose_conversation_was_deleted_finishes_to_nothing(
    owner: Any, monkeypatch: Any, caplog: Any, returning: bool
) -> None:
    exchange = _started(owner)
    exchange.conversation.delete()
    # The turn's usage is still recorded (what the model did was done). Not with the patch:
    # on PostgreSQL the usage row's INSERT, an ORM create, needs the returned id.
    usage = (owner.pk, "demo-full", "full", 5, 3) if returning else None
    if not returning:
        monkeypatch.setattr(connection.features, "can_return_columns_from_insert", False)
    with caplog.at_level(logging.ERROR):
        frame, gone = save_answer(exchange.answer.mid, FINISHES[0], usage=usage, only_version=True)
    assert (frame, gone) == (None, True)  # no frame for a message no page shows, no error
    assert caplog.records == []
    assert not Message.objects.filter(mid=exchange.answer.mid).exists()
    assert Usage.objects.filter(user=owner, requests=1).exists() == returning


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.parametrize("blocks", [None, 3])
@pytest.mark.parametrize("save", FINISHES, ids=["complete", "failed", "stopped"])
def test_an_only_versions_final_frame_is_the_one_its_versions_query_makes(
    owner: Any, blocks: int | None, save: dict[str, Any]
) -> None:
    message = conversations.do_finish_message(_started(owner).answer.mid, **save)
    assert message is not None
    queried = fragments.final_html(message, blocks=blocks)
    assert fragments.final_html(message, blocks=blocks, only_version=True) == queried
    assert 'hx-swap-oob="true"' in queried and "version-count" not in queried


async def test_a_regenerated_answers_final_frame_has_its_arrows_and_a_prompts_has_none(
    connect: Any, owner: Any, chat_settings: Any
) -> None:
    """The turn says which answers are their prompt's only version: a new prompt's (asked or
    edited), never a regeneration's or a continuation's, whose frame asks for its versions."""
    comm = await connect(owner)
    await comm.send_to(text_data=json.dumps({"type": "prompt", "conversation": "", "text": "hi"}))
    first = await receive_until_done(comm)
    mid = assistant_mid(first["html"][0])
    assert first["order"][-2:] == ["html", "done"]
    assert f'id="msg-{mid}"' in first["html"][-1] and "version-count" not in first["html"][-1]

    await comm.send_to(text_data=json.dumps({"type": "regenerate", "mid": mid}))
    again = await receive_until_done(comm)
    final = again["html"][-1]
    assert again["order"][-2:] == ["html", "done"] and 'hx-swap-oob="true"' in final
    assert f'id="msg-{mid}"' not in final
    assert '<span class="version-count" aria-hidden="true">2 / 2</span>' in final

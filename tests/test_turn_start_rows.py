"""The rows a turn's start stores, column by column, and what it refuses.

`do_start_exchange` writes its statements out (docs/decisions/performance.md, issue 18): a new
conversation is inserted after its prompt and answer, its leaf already set, and a follow-up
moves its leaf (and remembers a newly picked model) in one UPDATE. These tests pin every column
of the rows of a new conversation's turn and of a follow-up, that the objects handed to the
turn are those rows, that a start which fails stores nothing, and that bad input gets the same
errors and stores nothing. They run on SQLite and, with DATABASE_URL=postgres://…, PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import IntegrityError
from django.db.models.signals import post_save, pre_save
from django.utils import timezone

from chat import conversations
from chat.ids import new_message_id
from chat.models import Conversation, Message, Preferences
from chat.tokens import chars_to_tokens

# Transactional: each start really commits, so the deferred foreign keys are checked.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

ADMISSION = {"slot": "s-1", "day": "2026-12-02", "reserved": 700}


def _columns(model: type[Any]) -> set[str]:
    return {f.attname for f in model._meta.concrete_fields}


def _row(model: type[Any], pk: Any) -> dict[str, Any]:
    row = model.objects.filter(pk=pk).values(*_columns(model)).get()
    assert set(row) == _columns(model)  # a new column must be pinned here too
    return row  # type: ignore[no-any-return]


def _aware_between(value: Any, low: datetime, high: datetime) -> None:
    assert isinstance(value, datetime) and value.tzinfo is not None, value
    assert low <= value <= high, (low, value, high)


def _as_loaded(obj: Any) -> dict[str, Any]:
    """An object's column values as the ORM would hold them after loading its row."""
    return {name: getattr(obj, name) for name in _columns(type(obj))}


def test_a_new_conversations_turn_stores_these_rows(owner: Any) -> None:
    Preferences.objects.create(user=owner, instructions="Answer in French.")
    before = timezone.now()
    exchange = conversations.do_start_exchange(
        owner.pk,
        None,
        "  Hello   there,\nmodel  ",
        model="demo-full",
        tier="full",
        admission=ADMISSION,
        picked="demo-lite",
        allowed=frozenset({"demo-lite"}),
    )
    after = timezone.now()
    conv, prompt, answer = exchange.conversation, exchange.prompt, exchange.answer
    assert prompt is not None and exchange.created and not exchange.forked
    assert Conversation.objects.filter(user=owner).count() == 1
    assert Message.objects.filter(conversation=conv).count() == 2

    c = _row(Conversation, conv.pk)
    _aware_between(c.pop("created_at"), before, after)
    _aware_between(c.pop("updated_at"), before, after)
    assert c == {
        "id": conv.id,
        "user_id": owner.pk,
        "title": "Hello there, model",
        "pinned": False,
        "model": "demo-lite",  # the pick, remembered for the conversation
        "system_prompt": "",
        "title_by_hand": False,
        "leaf_id": answer.pk,
    }

    p = _row(Message, prompt.pk)
    _aware_between(p.pop("created_at"), before, after)
    assert p == {
        "id": prompt.pk,
        "mid": prompt.mid,
        "conversation_id": conv.id,
        "parent_id": None,
        "role": "user",
        "text": "  Hello   there,\nmodel  ",
        "html": None,
        "status": "complete",
        "error": "",
        "model": "",
        "tier": "",
        "picked": False,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "usage_estimated": False,
        "ttft_ms": None,
        "chunk_count": 0,
        "owner": "",
        "lease_until": None,
        "admission": None,
        "finished_at": None,
    }

    a = _row(Message, answer.pk)
    _aware_between(a.pop("created_at"), before, after)
    lease = timedelta(seconds=settings.CHAT_LEASE_SECONDS)
    _aware_between(a.pop("lease_until"), before + lease, after + lease)
    sent = len("Answer in French.") + len("  Hello   there,\nmodel  ")
    assert a == {
        "id": answer.pk,
        "mid": answer.mid,
        "conversation_id": conv.id,
        "parent_id": prompt.pk,
        "role": "assistant",
        "text": "",
        "html": None,
        "status": "streaming",
        "error": "",
        "model": "demo-lite",
        "tier": "full",
        "picked": True,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "usage_estimated": False,
        "ttft_ms": None,
        "chunk_count": 0,
        "owner": settings.CHAT_INSTANCE_ID,
        "admission": {**ADMISSION, "prompt_tokens": chars_to_tokens(sent)},
        "finished_at": None,
    }

    # Ids: message ids of this instance and of the conversation's shard, prompt before answer;
    # times in the order the rows were made.
    for message in (prompt, answer):
        assert message.mid.endswith(f"-{settings.CHAT_INSTANCE_ID}-{conv.shard}")
    assert prompt.pk < answer.pk and prompt.mid < answer.mid
    stored = Conversation.objects.get(pk=conv.pk)
    first, second = Message.objects.get(pk=prompt.pk), Message.objects.get(pk=answer.pk)
    assert stored.created_at <= first.created_at <= second.created_at <= stored.updated_at
    # The objects the turn goes on with are the rows as stored.
    assert _as_loaded(conv) == _as_loaded(stored)
    assert _as_loaded(prompt) == _as_loaded(first)
    assert _as_loaded(answer) == _as_loaded(second)
    assert not conv._state.adding and not prompt._state.adding and not answer._state.adding
    assert exchange.history == [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "  Hello   there,\nmodel  "},
    ]


def test_a_follow_up_stores_these_rows_and_moves_the_leaf(owner: Any) -> None:
    first = conversations.do_start_exchange(owner.pk, None, "one", model="demo-full", tier="full")
    conv = first.conversation
    Message.objects.filter(pk=first.answer.pk).update(text="uno", status="complete")
    Conversation.objects.filter(pk=conv.pk).update(system_prompt="Be brief.")
    created_at = Conversation.objects.get(pk=conv.pk).created_at
    before = timezone.now()
    exchange = conversations.do_start_exchange(
        owner.pk,
        str(conv.id),
        "two",
        model="demo-full",
        tier="lite",
        admission=ADMISSION,
        picked="demo-lite",
        allowed=frozenset({"demo-lite"}),
    )
    after = timezone.now()
    prompt, answer = exchange.prompt, exchange.answer
    assert prompt is not None and not exchange.created and not exchange.forked
    assert exchange.conversation.pk == conv.pk

    c = _row(Conversation, conv.pk)
    assert c.pop("created_at") == created_at
    _aware_between(c.pop("updated_at"), before, after)
    assert c == {
        "id": conv.id,
        "user_id": owner.pk,
        "title": "one",
        "pinned": False,
        "model": "demo-lite",  # the new pick, stored with the leaf
        "system_prompt": "Be brief.",
        "title_by_hand": False,
        "leaf_id": answer.pk,
    }
    p = _row(Message, prompt.pk)
    _aware_between(p.pop("created_at"), before, after)
    assert p == {
        "id": prompt.pk,
        "mid": prompt.mid,
        "conversation_id": conv.id,
        "parent_id": first.answer.pk,  # goes on from the leaf
        "role": "user",
        "text": "two",
        "html": None,
        "status": "complete",
        "error": "",
        "model": "",
        "tier": "",
        "picked": False,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "usage_estimated": False,
        "ttft_ms": None,
        "chunk_count": 0,
        "owner": "",
        "lease_until": None,
        "admission": None,
        "finished_at": None,
    }
    a = _row(Message, answer.pk)
    _aware_between(a.pop("created_at"), before, after)
    lease = timedelta(seconds=settings.CHAT_LEASE_SECONDS)
    _aware_between(a.pop("lease_until"), before + lease, after + lease)
    sent = len("Be brief.") + len("one") + len("uno") + len("two")
    assert a == {
        "id": answer.pk,
        "mid": answer.mid,
        "conversation_id": conv.id,
        "parent_id": prompt.pk,
        "role": "assistant",
        "text": "",
        "html": None,
        "status": "streaming",
        "error": "",
        "model": "demo-lite",
        "tier": "lite",
        "picked": True,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "usage_estimated": False,
        "ttft_ms": None,
        "chunk_count": 0,
        "owner": settings.CHAT_INSTANCE_ID,
        "admission": {**ADMISSION, "prompt_tokens": chars_to_tokens(sent)},
        "finished_at": None,
    }
    assert exchange.history == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "uno"},
        {"role": "user", "content": "two"},
    ]
    stored = Conversation.objects.get(pk=conv.pk)
    assert _as_loaded(exchange.conversation) == _as_loaded(stored)
    assert _as_loaded(prompt) == _as_loaded(Message.objects.get(pk=prompt.pk))
    assert _as_loaded(answer) == _as_loaded(Message.objects.get(pk=answer.pk))

    # The same model again is no change: the conversation keeps it, the answer is "picked".
    again = conversations.do_start_exchange(
        owner.pk,
        str(conv.id),
        "three",
        model="demo-full",
        tier="lite",
        picked="demo-lite",
        allowed=frozenset({"demo-lite"}),
    )
    assert again.prompt is not None and again.prompt.parent_id == answer.pk
    assert Conversation.objects.get(pk=conv.pk).leaf_id == again.answer.pk
    assert Conversation.objects.get(pk=conv.pk).model == "demo-lite"
    # Without a pick the conversation's model goes on while this connection may use it.
    plain = conversations.do_start_exchange(
        owner.pk, str(conv.id), "four", model="demo-full", tier="lite", allowed=frozenset()
    )
    assert (plain.answer.model, plain.answer.picked) == ("demo-full", False)
    assert Conversation.objects.get(pk=conv.pk).model == "demo-lite"


def test_a_conversation_stored_before_leaves_goes_on_from_its_newest_message(owner: Any) -> None:
    first = conversations.do_start_exchange(owner.pk, None, "one", model="m", tier="full")
    Conversation.objects.filter(pk=first.conversation.pk).update(leaf=None)
    exchange = conversations.do_start_exchange(
        owner.pk, str(first.conversation.id), "two", model="m", tier="full"
    )
    assert exchange.prompt is not None and exchange.prompt.parent_id == first.answer.pk
    assert Conversation.objects.get(pk=first.conversation.pk).leaf_id == exchange.answer.pk


def _repeat_a_mid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer gets the prompt's mid: its INSERT fails (mid is unique) after the prompt's
    succeeded, as any failure inside the transaction would."""
    mids: list[str] = []

    def repeated(shard: str) -> str:
        mids.append(mids[-1] if mids else new_message_id(shard))
        return mids[-1]

    monkeypatch.setattr(conversations, "new_message_id", repeated)


def test_a_new_conversation_whose_start_fails_stores_nothing(
    owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _repeat_a_mid(monkeypatch)
    with pytest.raises(IntegrityError):
        conversations.do_start_exchange(owner.pk, None, "hello", model="m", tier="full")
    assert not Conversation.objects.exists()
    assert not Message.objects.exists()


def test_a_follow_up_whose_start_fails_stores_nothing_and_keeps_the_leaf(
    owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = conversations.do_start_exchange(owner.pk, None, "one", model="m", tier="full")
    conv = Conversation.objects.get(pk=first.conversation.pk)
    _repeat_a_mid(monkeypatch)
    with pytest.raises(IntegrityError):
        conversations.do_start_exchange(
            owner.pk,
            str(conv.id),
            "two",
            model="m",
            tier="full",
            picked="p",
            allowed=frozenset({"p"}),
        )
    assert Message.objects.count() == 2
    after = Conversation.objects.get(pk=conv.pk)
    assert (after.leaf_id, after.updated_at, after.model) == (
        conv.leaf_id,
        conv.updated_at,
        conv.model,
    )


@pytest.mark.parametrize(
    ("which", "replaces", "error", "message"),
    [
        ("unknown", None, conversations.NotFound, "That conversation does not exist."),
        ("malformed", None, conversations.NotFound, "That conversation does not exist."),
        ("someone else's", None, conversations.NotFound, "That conversation does not exist."),
        ("someone else's", "prompt", conversations.NotFound, "That conversation does not exist."),
        ("none", "prompt", conversations.BadRequest, "An edit needs its conversation."),
        ("mine", "answer", conversations.NotFound, "That message is not a prompt on this"),
        ("mine", "nonsense", conversations.NotFound, "That message is not a prompt on this"),
    ],
)
def test_bad_input_gets_its_error_and_stores_nothing(
    owner: Any, other_user: Any, which: str, replaces: str | None, error: type, message: str
) -> None:
    mine = conversations.do_start_exchange(owner.pk, None, "mine", model="m", tier="full")
    theirs = conversations.do_start_exchange(other_user.pk, None, "theirs", model="m", tier="full")
    conversation_id = {
        "unknown": "0f0e0d0c-0b0a-0908-0706-050403020100",
        "malformed": "not-a-uuid",
        "someone else's": str(theirs.conversation.id),
        "none": None,
        "mine": str(mine.conversation.id),
    }[which]
    target = theirs if which == "someone else's" else mine
    assert target.prompt is not None
    replaced = {
        None: None,
        "prompt": target.prompt.mid,
        "answer": target.answer.mid,
        "nonsense": "no-such-mid",
    }[replaces]
    rows = (Conversation.objects.count(), Message.objects.count())
    leaves = dict(Conversation.objects.values_list("pk", "leaf_id"))
    with pytest.raises(error) as raised:
        conversations.do_start_exchange(
            owner.pk, conversation_id, "again", model="m", tier="full", replaces=replaced
        )
    assert str(raised.value).startswith(message)
    assert (Conversation.objects.count(), Message.objects.count()) == rows
    assert dict(Conversation.objects.values_list("pk", "leaf_id")) == leaves


def test_no_save_signal_is_listened_to_for_the_rows_a_turn_writes_out() -> None:
    """The written-out INSERTs and UPDATEs send no pre_save/post_save signals (the ORM's would):
    a receiver added for these models must make the turn's start send them, or go elsewhere."""
    for signal in (pre_save, post_save):
        for model in (Conversation, Message):
            assert not signal.has_listeners(model), (signal, model)

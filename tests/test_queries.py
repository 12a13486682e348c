"""Query counts on the hot paths: starting a turn, finishing one, loading a conversation, the
admin's user list. Each is a fixed number of statements, whatever the history or the page size.

Exact counts, so a change that adds a statement to the path of every turn is seen and argued
for (update the number in the same commit, with the reason).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from chat import conversations
from chat.ids import new_message_id
from chat.limits.plans import forget_cached_limits
from chat.models import Conversation, Message, Plan, Quota
from chat.protocol import Prompt, Regenerate
from chat.tiers.policy import clear_policy_cache
from chat.turns.start import _asking_tab_html, _begin_exchange
from chat.turns.turn import _save_answer
from tests.conftest import session_key_for
from tests.long_conversation import long_conversation


def _conversation_with(user: Any, exchanges: int) -> Conversation:
    conversation = Conversation.objects.create(user=user, title="history")
    parent = None
    for i in range(exchanges):
        for role in (Message.Role.USER, Message.Role.ASSISTANT):
            parent = Message.objects.create(
                mid=new_message_id(conversation.shard),
                conversation=conversation,
                parent=parent,
                role=role,
                text=f"{role} {i} **bold**",
                status=Message.Status.COMPLETE,
            )
    conversation.leaf = parent
    conversation.save(update_fields=["leaf"])
    return conversation


def _count(run: Any) -> int:
    with CaptureQueriesContext(connection) as queries:
        run()
    return len(queries)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_starting_a_turn_is_a_fixed_number_of_statements(owner: Any) -> None:
    session = session_key_for(owner)
    counts = []
    for exchanges in (1, 20):
        conversation = _conversation_with(owner, exchanges)
        frame = Prompt(text="next question", conversation=str(conversation.id))
        counts.append(
            _count(lambda f=frame: _begin_exchange(f, owner.pk, session, model="m", tier="full"))
        )
    # The session check, then one transaction: BEGIN, the conversation with the user's custom
    # instructions (one statement), the prompt, the history (one query: a walk up from the
    # leaf, in the database, that stops at the model's context), the answer, the new leaf,
    # COMMIT.
    assert counts[0] == counts[1], "starting a turn must not grow with the history"
    assert counts[0] == 8, counts


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_new_conversation_starts_without_reading_a_history(owner: Any) -> None:
    session = session_key_for(owner)
    frame = Prompt(text="first question")
    count = _count(lambda: _begin_exchange(frame, owner.pk, session, model="m", tier="full"))
    # The session, BEGIN, the prompt (its INSERT also reads the custom instructions), the
    # answer, the conversation (inserted last, its leaf set), COMMIT: no history is read, and
    # no UPDATE of the leaf.
    assert count == 6, count


def _kinds(run: Any) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        run()
    return [q["sql"].split(None, 1)[0].upper() for q in queries.captured_queries]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_turns_start_writes_each_row_once(owner: Any) -> None:
    """Each row of a turn's start is one statement (docs/decisions/performance.md, issue 18):
    a new conversation is inserted last with its leaf set (no UPDATE after it), the custom
    instructions come with the prompt's INSERT (no SELECT of their own); a follow-up reads its
    conversation and the instructions in one SELECT and moves its leaf, and remembers a newly
    picked model, in one UPDATE."""
    session = session_key_for(owner)
    started: list[Any] = []

    def start(frame: Prompt, **pick: Any) -> None:
        begun = _begin_exchange(frame, owner.pk, session, model="m", tier="full", **pick)
        assert begun is not None
        started.append(begun[0])

    new = _kinds(lambda: start(Prompt(text="first")))
    # The session check's SELECT, then the transaction.
    assert new == ["SELECT", "BEGIN", "INSERT", "INSERT", "INSERT", "COMMIT"], new
    conversation = str(started[0].conversation.id)
    picked = {"picked": "other", "allowed": frozenset({"other"})}
    follow_ups = [("next", {}), ("picked", picked)]
    for text, pick in follow_ups:
        frame = Prompt(text=text, conversation=conversation)
        kinds = _kinds(lambda f=frame, p=pick: start(f, **p))
        # The session; BEGIN; the conversation with the instructions; the prompt; the history
        # (a WITH RECURSIVE walk); the answer; the leaf (and the pick); COMMIT.
        assert kinds == [
            "SELECT",
            "BEGIN",
            "SELECT",
            "INSERT",
            "WITH",
            "INSERT",
            "UPDATE",
            "COMMIT",
        ], kinds
    assert Conversation.objects.get(pk=conversation).model == "other"


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_plain_exchanges_bubbles_render_off_the_orm_thread_with_no_query(owner: Any) -> None:
    """A new conversation's and a follow-up's bubbles are left to the caller, which renders
    them off the ORM thread (chat/turns/start.py): from the objects `_begin_exchange` loaded,
    with no query (a query there would open a connection on another thread)."""
    session = session_key_for(owner)
    follow_up = _conversation_with(owner, 2)
    for frame in (
        Prompt(text="first <question>"),
        Prompt(text="next <question>", conversation=str(follow_up.id)),
    ):
        begun = _begin_exchange(frame, owner.pk, session, model="m", tier="full")
        assert begun is not None
        exchange, html, _reopened = begun
        assert html is None, "a plain exchange is rendered off the ORM thread, not on it"
        with CaptureQueriesContext(connection) as queries:
            html = _asking_tab_html(exchange)
        assert len(queries) == 0, [q["sql"][:80] for q in queries.captured_queries]
        assert exchange.prompt is not None
        assert f'id="msg-{exchange.prompt.mid}"' in html
        assert f'id="msg-{exchange.answer.mid}"' in html
        assert "next &lt;question&gt;" in html or "first &lt;question&gt;" in html
        assert ('id="conversation-id"' in html) == exchange.created


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_an_edits_bubbles_still_render_on_the_orm_thread(owner: Any) -> None:
    """A fork's bubbles carry their "2 / 2" arrows, a query: rendered where it can query."""
    session = session_key_for(owner)
    conversation = _conversation_with(owner, 2)
    edited = conversation.messages.filter(role=Message.Role.USER).order_by("id").last()
    assert edited is not None
    frame = Prompt(text="edited", conversation=str(conversation.id), replaces=edited.mid)
    begun = _begin_exchange(frame, owner.pk, session, model="m", tier="full")
    assert begun is not None
    exchange, html, _reopened = begun
    assert exchange.forked
    assert html is not None and "data-fork-after=" in html and "2 / 2" in html


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_regeneration_does_not_grow_with_the_history(owner: Any) -> None:
    session = session_key_for(owner)
    counts = []
    for exchanges in (1, 20):
        conversation = _conversation_with(owner, exchanges)
        answer = conversation.leaf
        assert answer is not None
        frame = Regenerate(mid=answer.mid)
        counts.append(
            _count(lambda f=frame: _begin_exchange(f, owner.pk, session, model="m", tier="full"))
        )
    assert counts[0] == counts[1], counts


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_finishing_a_turn_is_a_fixed_number_of_statements(owner: Any) -> None:
    conversation = _conversation_with(owner, 1)
    exchange = conversations.do_start_exchange(
        owner.pk, str(conversation.id), "question", model="m", tier="full"
    )
    save = dict(
        text="the **answer**",
        html="<p>the <strong>answer</strong></p>\n",  # rendered off the ORM thread, as a turn does
        status=Message.Status.COMPLETE,
        error="",
        chunk_count=2,
        prompt_tokens=5,
        completion_tokens=3,
        usage_estimated=False,
        ttft_ms=10,
    )
    usage = (owner.pk, "m", "full", 5, 3)
    first = _count(lambda: _save_answer(exchange.answer.mid, save, usage=usage))
    # Save (one UPDATE that returns the row), the day's usage (an UPDATE that finds no row,
    # then an INSERT in its own transaction the first time of the day), the answer's versions
    # for its "2 / 3" arrows.
    assert first == 6, first
    exchange = conversations.do_start_exchange(
        owner.pk, str(conversation.id), "again", model="m", tier="full"
    )
    later = _count(lambda: _save_answer(exchange.answer.mid, save, usage=usage))
    assert later == 3, later  # today's usage row exists now: one UPDATE, no transaction
    # The answer of a prompt its turn asked is its only version (chat/turns/start.py says so):
    # no versions query. Two statements are a turn's end: its row and its usage.
    exchange = conversations.do_start_exchange(
        owner.pk, str(conversation.id), "once more", model="m", tier="full"
    )
    plain = _count(lambda: _save_answer(exchange.answer.mid, save, usage=usage, only_version=True))
    assert plain == 2, plain


@pytest.mark.django_db
def test_a_conversation_page_does_not_grow_with_its_history(owner: Any) -> None:
    client = Client()
    client.force_login(owner)
    counts = []
    for exchanges in (1, 25):
        conversation = _conversation_with(owner, exchanges)
        # The limits and the tier policy are cached for 2 s: start both measures cold.
        forget_cached_limits()
        clear_policy_cache()
        with CaptureQueriesContext(connection) as queries:
            response = client.get(f"/c/{conversation.id}/")
        assert response.status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


@pytest.mark.django_db
def test_a_page_of_a_10000_message_conversation_is_a_fixed_number_of_statements(
    owner: Any,
) -> None:
    """Issue 13, finding 17: the page walks the branch up from its leaf in the database and
    reads only the window it shows."""
    client = Client()
    client.force_login(owner)
    counts = []
    for messages in (2, 10_000):
        conversation = long_conversation(owner, messages)
        forget_cached_limits()
        clear_policy_cache()
        with CaptureQueriesContext(connection) as queries:
            response = client.get(f"/c/{conversation.id}/")
        assert response.status_code == 200
        counts.append(len(queries))
        # The window: one recursive query up from the leaf, one for its messages' versions.
        walks = [q["sql"] for q in queries.captured_queries if "WITH RECURSIVE" in q["sql"]]
        assert len(walks) == 1, walks
    assert counts[0] == counts[1], counts
    # The tier policy's rules, tiers and pickable models (cached 2 s, cold here), the session
    # and its user, the user's quota and plan (for the tier and the meter), the user again
    # (the plan's tier check), the conversation, the window (the walk up, the owner's votes,
    # the versions), the sidebar.
    assert counts[1] == 13, counts


@pytest.mark.django_db
def test_load_earlier_is_a_fixed_number_of_statements(owner: Any) -> None:
    client = Client()
    client.force_login(owner)
    conversation = long_conversation(owner, 10_000)
    before = Message.objects.filter(conversation=conversation).order_by("-id")[100]
    forget_cached_limits()
    clear_policy_cache()
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/c/{conversation.id}/messages/", {"before": before.mid})
    assert response.status_code == 200
    # The tier policy's rules, tiers and pickable models (cached 2 s, cold here), the session
    # and its user, the user's quota and plan, the user again (the plan's tier check), the
    # conversation, the message, the window (the walk up, the owner's votes, the versions).
    assert len(queries) == 13, [q["sql"][:80] for q in queries.captured_queries]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_prompt_and_a_regeneration_in_a_10000_message_conversation(owner: Any) -> None:
    """Both read a bounded history (a walk up that stops at the model's context) and render
    only their new messages: as many statements as in a short conversation."""
    session = session_key_for(owner)
    counts = []
    for messages in (2, 10_000):
        conversation = long_conversation(owner, messages)
        frame = Prompt(text="next question", conversation=str(conversation.id))
        counts.append(
            _count(lambda f=frame: _begin_exchange(f, owner.pk, session, model="m", tier="full"))
        )
        leaf = Message.objects.filter(conversation=conversation).order_by("-id")[2]
        regenerate = Regenerate(mid=leaf.mid)
        counts.append(
            _count(
                lambda f=regenerate: _begin_exchange(f, owner.pk, session, model="m", tier="full")
            )
        )
    assert counts[:2] == counts[2:], counts
    # A prompt: the session, BEGIN, the conversation with the custom instructions, prompt, the
    # history, answer, leaf, COMMIT. A regeneration: the session, BEGIN, the answer, its
    # prompt, the custom instructions, the history, the new answer, the leaf, COMMIT, then
    # its versions for the "2 / 2" arrows.
    assert counts[:2] == [8, 10], counts


@pytest.mark.django_db
def test_the_admin_user_list_does_not_grow_per_row(django_user_model: Any) -> None:
    boss = django_user_model.objects.create_superuser("boss", password="boss-pass-123456")
    client = Client()
    client.force_login(boss)
    gold = Plan.objects.create(name="Gold for the query test", daily_tokens=5000)
    Plan.objects.filter(is_default=True).update(is_default=False)
    Plan.objects.create(name="Default for the query test", daily_tokens=1000, is_default=True)

    def users(n: int) -> int:
        for i in range(n):
            user = django_user_model.objects.create_user(f"u{n}-{i}", password="x-pass-123456")
            if i % 2:
                Quota.objects.create(user=user, plan=gold)
        forget_cached_limits()  # both measures start cold (the caches live 2 s)
        clear_policy_cache()
        with CaptureQueriesContext(connection) as queries:
            response = client.get("/admin/auth/user/")
        assert response.status_code == 200
        return len(queries)

    assert users(3) == users(30)


@pytest.mark.django_db
def test_the_conversation_list_is_a_fixed_number_of_statements(owner: Any) -> None:
    """The sidebar (its date groups are laid in the browser from each item's date): one page of
    conversations is one query, whatever the number of conversations, pinned or searched."""
    client = Client()
    client.force_login(owner)
    client.get("/conversations/")  # warm: the first request reads the plan and the tiers

    def listed(n: int, query: str) -> int:
        Conversation.objects.filter(user=owner).delete()
        for i in range(n):
            Conversation.objects.create(user=owner, title=f"chat {i}", pinned=i % 7 == 0)
        forget_cached_limits()
        clear_policy_cache()
        client.get("/conversations/")
        with CaptureQueriesContext(connection) as queries:
            response = client.get(f"/conversations/{query}")
        assert response.status_code == 200
        return len(queries)

    for query in ("", "?offset=50", "?q=chat"):
        small, large = listed(3, query), listed(120, query)
        assert small == large, (query, small, large)
    # The session, the user (read twice: once by the async middleware's `auser()`, once by
    # the view's `request.user`), the page of conversations.
    count = listed(120, "")
    assert count == 4, count


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_resolving_a_users_limits_is_two_statements(owner: Any, other_user: Any) -> None:
    """On the admission's path at nearly every turn (its cache lasts 2 s): the user's quota,
    then its plan and the default plan in one statement, with or without a quota."""
    from chat.limits.plans import resolve_limits

    pro = Plan.objects.create(name="Pro", rate_limit="99/minute", daily_tokens=5)
    Quota.objects.create(user=owner, plan=pro, max_concurrent_streams=7)
    with CaptureQueriesContext(connection) as queries:
        limits = resolve_limits(owner.pk)
    assert len(queries) == 2, queries
    # The quota's own value first, then its plan's; the default plan under both.
    assert (limits.plan, limits.rate, limits.daily_tokens, limits.max_streams) == (
        "Pro",
        "99/minute",
        5,
        7,
    )
    with CaptureQueriesContext(connection) as queries:
        assert resolve_limits(other_user.pk).plan != "Pro"
    assert len(queries) == 2, queries

"""A 10,000-message conversation is paged (issue 13, finding 17): the page shows the latest
window, "Load earlier messages" fetches the one before, the history sent upstream stops at the
model's context, and the branch on show stays right after an edit deep in history.

SQLite, in process (Django's test client): sizes and the tree. The same on PostgreSQL and over
real sockets is in tests/test_paging_servers.py; exact query counts in tests/test_queries.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from chat import branches
from chat import conversations as services
from chat.models import Conversation, Message
from tests.long_conversation import long_conversation, text_of

pytestmark = pytest.mark.django_db

LONG = 10_000
# The whole thread was 7.7 MB of HTML; a window of 50 short messages is a few dozen KB.
PAGE_BYTES = 200_000


def numbers(html: str) -> list[int]:
    """The numbers of the seeded messages in a page or fragment, in document order."""
    return [int(n) for n in re.findall(r"(?:prompt|answer) message (\d{5})\.", html)]


def shown(html: str) -> list[int]:
    """Each seeded message's number once (an answer's text is also in its copy template)."""
    seen: list[int] = []
    for n in numbers(html):
        if not seen or seen[-1] != n:
            seen.append(n)
    return seen


@pytest.fixture
def long(owner: Any) -> Conversation:
    conversation: Conversation = long_conversation(owner, LONG)
    return conversation


@pytest.fixture
def client(owner: Any) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def test_the_page_of_a_long_conversation_shows_only_its_latest_window(
    client: Client, long: Conversation, settings: Any
) -> None:
    response = client.get(f"/c/{long.id}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert len(response.content) < PAGE_BYTES, len(response.content)
    window = settings.CHAT_THREAD_WINDOW
    assert shown(html) == list(range(LONG - window, LONG))
    # The control that fetches the window before the first message shown.
    first = Message.objects.get(conversation=long, text=text_of(LONG - window))
    assert f"?before={first.mid}" in html
    assert "Load earlier messages" in html


def test_load_earlier_fetches_the_previous_window_in_order_down_to_the_root(
    client: Client, owner: Any
) -> None:
    conversation = long_conversation(owner, 120)
    page = client.get(f"/c/{conversation.id}/").content.decode()
    seen = shown(page)
    while True:
        before = re.search(r"\?before=([^\"&]+)", page)
        if before is None:
            break
        page = client.get(
            f"/c/{conversation.id}/messages/?before={before.group(1)}"
        ).content.decode()
        assert page.count("<article") <= 50
        seen = shown(page) + seen
    # Every message once, in order, and the root's window has no control.
    assert seen == list(range(120))


def test_load_earlier_refuses_bad_input_and_other_peoples_ids(
    client: Client, owner: Any, other_user: Any
) -> None:
    conversation = long_conversation(owner, 120)
    theirs = long_conversation(other_user, 4)
    their_message = Message.objects.filter(conversation=theirs).last()
    assert their_message is not None
    mine = Message.objects.filter(conversation=conversation).last()
    assert mine is not None
    url = f"/c/{conversation.id}/messages/"
    assert client.get(url).status_code == 400  # no `before`: said so, not a crash
    assert "before=" in client.get(url).content.decode()
    assert client.get(url, {"before": "x" * 81}).status_code == 400
    assert client.get(url, {"before": "no-such-message"}).status_code == 404
    # Another conversation's message, even one of someone else's: not in this conversation.
    assert client.get(url, {"before": their_message.mid}).status_code == 404
    # Someone else's conversation: 404 whatever the message.
    other = Client()
    other.force_login(other_user)
    assert other.get(url, {"before": mine.mid}).status_code == 404
    assert client.get(f"/c/{theirs.id}/messages/", {"before": their_message.mid}).status_code == 404


def test_the_history_sent_upstream_stops_at_the_models_context(
    owner: Any, long: Conversation, settings: Any
) -> None:
    exchange = services.do_start_exchange(
        owner.pk, str(long.id), "next question", model="m", tier="full"
    )
    sent = sum(len(m["content"]) for m in exchange.history)
    # What is read is the newest messages that fit, plus at most the one that did not.
    longest = max(len(text_of(i)) for i in range(LONG))
    assert sent <= settings.LLM_CONTEXT_CHARS + len("next question") + longest
    assert exchange.history[-1] == {"role": "user", "content": "next question"}
    assert exchange.history[-2]["content"] == text_of(LONG - 1)


def test_a_prompt_and_a_regeneration_send_only_their_new_messages(
    owner: Any, long: Conversation
) -> None:
    from chat.fragments import exchange_html

    sizes = []
    for conversation in (long_conversation(owner, 2), long):
        prompt = services.do_start_exchange(
            owner.pk, str(conversation.id), "question", model="m", tier="full"
        )
        services.do_finish_message(
            prompt.answer.mid,
            text="answer",
            status="complete",
            error="",
            chunk_count=1,
            prompt_tokens=1,
            completion_tokens=1,
            usage_estimated=False,
            ttft_ms=1,
        )
        again = services.do_regenerate(owner.pk, prompt.answer.mid, model="m", tier="full")
        sizes.append(
            (
                len(exchange_html(prompt, target="#messages", watch=False)),
                len(exchange_html(again, target="#messages", watch=False)),
            )
        )
        assert again.fork_after == prompt.answer.parent.mid  # type: ignore[union-attr]
    (short_prompt, short_again), (long_prompt, long_again) = sizes
    # The same bubbles whatever came before (a message id may differ by a digit or two).
    assert abs(long_prompt - short_prompt) < 40, sizes
    assert abs(long_again - short_again) < 40, sizes
    assert long_again < 5_000, sizes


def test_an_edit_deep_in_history_shows_the_right_branch_and_the_arrows_go_back(
    client: Client, owner: Any, long: Conversation, settings: Any
) -> None:
    deep = Message.objects.get(conversation=long, text=text_of(5000))  # a prompt
    edit = services.do_start_exchange(
        owner.pk, str(long.id), "an edited prompt", model="m", tier="full", replaces=deep.mid
    )
    assert edit.fork_after == Message.objects.get(conversation=long, text=text_of(4999)).mid
    # Upstream: the branch up to the edit, trimmed, never the messages after it.
    assert edit.history[-2]["content"] == text_of(4999)
    assert all(text_of(5001) != m["content"] for m in edit.history)

    long.refresh_from_db()
    window = branches.window(long)
    texts = [e.message.text for e in window.entries]
    window_size = settings.CHAT_THREAD_WINDOW
    assert texts == [text_of(i) for i in range(5002 - window_size, 5000)] + [
        "an edited prompt",
        "",
    ]
    edited = window.entries[-2]
    assert (edited.version, edited.versions, edited.previous) == (2, 2, deep.mid)

    # The arrows go back: the old version and the long branch after it, up to the leaf.
    response = client.post(f"/c/{long.id}/versions/{deep.mid}/")
    assert response.status_code == 200
    long.refresh_from_db()
    assert long.leaf is not None and long.leaf.text == text_of(LONG - 1)
    # The switched message is 5,000 messages up: too far to keep in place, so the latest
    # window of the branch comes, with its "Load earlier messages".
    html = response.content.decode()
    assert shown(html) == list(range(LONG - window_size, LONG))
    assert "Load earlier messages" in html and len(response.content) < PAGE_BYTES

    # And forward again to the edit, whose short branch is shown down from the switched one.
    edited_mid = edit.prompt.mid  # type: ignore[union-attr]
    response = client.post(f"/c/{long.id}/versions/{edited_mid}/")
    html = response.content.decode()
    assert "an edited prompt" in html and shown(html)[-1] == 4999

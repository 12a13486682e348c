"""chat/bubbles.py: a message's bubble, an answer's 👍/👎 and a conversation's sidebar entry, as
the page and every frame show them. (They replaced message.html, feedback.html and
conversation_item.html, checked byte for byte against them before the templates went: the
transition tests of commits 195b6d8 and the sidebar's after it.)"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from html import escape
from types import SimpleNamespace
from typing import Any

import pytest
from django.urls import NoReverseMatch, reverse, set_script_prefix

from chat.branches import ThreadEntry
from chat.bubbles import Live, feedback_html, message_html, url
from chat.conversations import DELETED, INTERRUPTED
from chat.menus import conversation_item_html
from chat.models import Conversation, Message
from chat.upstream.errors import NOT_ALLOWED_MESSAGE

HOSTILE = "<script>alert('x')</script> & \"quoted\""
ESCAPED = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;quoted&quot;"
CONVERSATION = "9cab5bc7-bfad-46f6-be0b-39f888906e07"


def answer(**fields: object) -> Message:
    values: dict[str, object] = {
        "mid": "1796391281360-web1-1",
        "conversation_id": CONVERSATION,
        "role": "assistant",
        "status": "complete",
        "text": "the answer",
        "model": "demo-full",
        "tier": "full",
        "prompt_tokens": 12,
        "completion_tokens": 34,
    }
    values.update(fields)
    return Message(**values)


def test_every_value_a_user_or_a_model_wrote_is_escaped() -> None:
    m = answer(status="stopped", text=HOSTILE, error=HOSTILE, model=HOSTILE)
    m.votes = [SimpleNamespace(vote="down", comment=HOSTILE)]  # type: ignore[attr-defined]
    html = message_html(m)
    assert "<script>" not in html
    # the meta, the stop note, the details line, the source (the comment's box is closed on a
    # page once the comment was given)
    assert html.count(ESCAPED) == 4
    box = feedback_html(m, SimpleNamespace(vote="down", comment=HOSTILE))  # 👎 pressed again
    assert "<script>" not in box and f">{ESCAPED}</textarea>" in box
    prompt = message_html(Message(mid="p1", role="user", text=HOSTILE))
    assert "<script>" not in prompt and ESCAPED in prompt
    assert 'aria-label="You said"' in prompt and 'data-action="edit"' in prompt


def test_the_rendered_answer_is_placed_as_it_is() -> None:
    html = message_html(answer(), rendered="<p>safe <em>html</em></p>", oob=True, blocks=2)
    assert '<div class="body markdown" data-blocks="2" aria-busy="false"><p>safe <em>html' in html
    assert 'hx-swap-oob="true"' in html


def test_a_streaming_answer_is_busy_with_no_controls_and_keeps_its_details_room() -> None:
    html = message_html(answer(status="streaming", text=""), watch=True, next_seq=7)
    assert 'data-status="streaming" data-watch="1" data-next="7"' in html
    assert 'aria-busy="true"' in html and "answer-details is-pending" in html
    for control in ("regenerate", "copy", "feedback", "continue", "retry"):
        assert f'class="{control}' not in html


def test_a_finished_answer_has_its_controls_details_and_source() -> None:
    html = message_html(answer(usage_estimated=True))
    for control in ('class="regenerate"', 'class="copy"', 'class="vote-up"', 'class="vote-down"'):
        assert control in html
    assert "demo-full</span> · full tier · " in html
    assert "12 tokens in · 34 out (estimated)" in html
    assert '<template class="source">the answer</template>' in html
    assert 'action="/m/1796391281360-web1-1/feedback/"' in html
    assert 'class="continue"' not in html  # complete, not cut at the length limit


@pytest.mark.parametrize(
    ("error", "retry", "advice"),
    [
        (INTERRUPTED, True, ""),
        (NOT_ALLOWED_MESSAGE, False, "model settings"),
        (DELETED, False, ""),
    ],
)
def test_a_failed_answer_offers_retry_only_where_it_can_succeed(
    error: str, retry: bool, advice: str
) -> None:
    finished = datetime(2026, 12, 4, 13, 5, tzinfo=UTC)
    html = message_html(answer(status="failed", error=error, text="", finished_at=finished))
    assert f'<span class="note error" role="status">{escape(error)}</span>' in html
    assert ('data-action="retry"' in html) is retry
    assert ('class="note advice"' in html) is bool(advice)
    assert advice in html
    assert (
        "Answer id <code>1796391281360-web1-1</code>, model demo-full, 2026-12-04 13:05 UTC."
        in html
    )
    assert 'class="copy"' not in html  # nothing to copy


def test_versions_arrows_post_the_neighbours_and_disable_at_the_ends() -> None:
    m = answer()
    first = message_html(m, entry=ThreadEntry(m, 1, 3, "", "1796391281360-web1-2"))
    assert 'aria-label="Version 1 of 3"' in first and "1 / 3" in first
    assert re.search(r'class="version-prev" aria-label="Previous version" disabled>', first)
    assert (
        f'class="version-next" aria-label="Next version" hx-post="/c/{CONVERSATION}/versions/'
        '1796391281360-web1-2/" hx-target="#messages"' in first
    )
    alone = message_html(m, entry=ThreadEntry(m, 1, 1, "", ""))
    assert 'class="versions"' not in alone


def test_an_answer_going_on_carries_its_open_block() -> None:
    html = message_html(
        answer(status="streaming"), oob=True, live=Live(2, 40, '"open \\"block\\"\\r"')
    )
    assert (
        'data-placed="2" data-end="40" data-open="&quot;open \\&quot;block\\&quot;\\r&quot;"'
        in html
    )


def test_feedback_opens_the_comment_box_after_a_down_vote_and_thanks_after_it_is_sent() -> None:
    m = answer()
    none = feedback_html(m, None)
    assert 'data-vote=""' in none and 'aria-pressed="true"' not in none and "Thanks" not in none
    up = feedback_html(m, SimpleNamespace(vote="up", comment=""))
    assert 'data-vote="up"' in up and "Thanks for your feedback." in up
    down = feedback_html(m, SimpleNamespace(vote="down", comment=""))
    assert 'class="feedback-comment"' in down and " autofocus>" in down
    again = feedback_html(m, SimpleNamespace(vote="down", comment="too long"))
    assert ">too long</textarea>" in again and "autofocus" not in again
    sent = feedback_html(m, SimpleNamespace(vote="down", comment="too long"), sent=True)
    assert "feedback-comment" not in sent and "your feedback was sent." in sent
    # With its answer (a page, a frame): a 👎 whose comment was given shows its thanks.
    shown = feedback_html(m, SimpleNamespace(vote="down", comment="too long"), on_page=True)
    assert "feedback-comment" not in shown and "Thanks for your feedback." in shown
    asked = feedback_html(m, SimpleNamespace(vote="down", comment=""), on_page=True)
    assert 'class="feedback-comment"' in asked  # not given yet: the box is still offered


@pytest.mark.django_db
def test_a_sidebar_entry_escapes_its_title_and_the_current_id_it_was_sent(
    django_user_model: Any,
) -> None:
    user = django_user_model.objects.create_user("sidebar", password="x")
    c = Conversation.objects.create(user=user, title=HOSTILE, pinned=True)
    html = conversation_item_html(c, HOSTILE)
    assert "<script>" not in html
    # the link, the menu's name, the rename box, the delete confirmation; and `current` three times
    assert html.count(ESCAPED) == 7
    assert 'aria-current="page"' not in html and "hx-swap-oob" not in html
    assert '<span class="pinned" aria-label="Pinned">📌 </span>' in html and ">Unpin<" in html
    shown = conversation_item_html(c, str(c.id), oob=True)
    assert f'<li id="conv-{c.id}" class="conv current"' in shown
    assert 'aria-current="page"' in shown and 'hx-swap-oob="true"' in shown
    assert f'hx-post="/c/{c.id}/delete/"' in shown


@pytest.mark.parametrize("prefix", ["/", "/chat/"])
def test_the_urls_written_from_placeholders_are_what_reverse_gives(prefix: str) -> None:
    conversation = uuid.uuid4()
    mid = "1796391281360-web1-15"
    set_script_prefix(prefix)
    try:
        for name, args in [
            ("chat:conversation", [conversation]),
            ("chat:rename", [conversation]),
            ("chat:delete", [str(conversation)]),
            ("chat:feedback", [mid]),
            ("chat:switch_version", [conversation, mid]),
        ]:
            assert url(name, *args) == reverse(name, args=args)
        assert url("chat:conversation", conversation).startswith(prefix + "c/")
        # Not a plain id: reverse() itself, which quotes it or refuses it (hostile review).
        assert url("chat:feedback", "a b?é") == reverse("chat:feedback", args=["a b?é"])
        with pytest.raises(NoReverseMatch):
            url("chat:rename", "not-a-uuid/../../x")
        # A value that looks like a placeholder is written as it is.
        fake = "00000000-0000-4000-8000-000000000001"
        assert url("chat:switch_version", fake, mid) == reverse(
            "chat:switch_version", args=[fake, mid]
        )
    finally:
        set_script_prefix("/")

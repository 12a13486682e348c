"""Transition check: chat.bubbles writes what message.html and feedback.html rendered, byte for
byte, for every state a bubble can be in."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from django.template.loader import render_to_string

from chat import bubbles
from chat.branches import ThreadEntry
from chat.conversations import DELETED, INTERRUPTED
from chat.models import LENGTH_LIMITED, Message
from chat.upstream.errors import NOT_ALLOWED_MESSAGE, REFUSED_REQUEST_MESSAGE

HOSTILE = '<b>"it\'s" & </textarea><script>alert(1)</script>'


def messages() -> list[Message]:
    found = []
    for role, status, error, text, picked, tier, model, finished, estimated in itertools.product(
        ["user", "assistant"],
        ["streaming", "complete", "stopped", "failed"],
        [
            "",
            "Stopped by you.",
            INTERRUPTED,
            DELETED,
            NOT_ALLOWED_MESSAGE,
            REFUSED_REQUEST_MESSAGE,
            LENGTH_LIMITED,
            HOSTILE,
        ],
        ["", "some **text**", HOSTILE],
        [False, True],
        ["", "full", "lite"],
        ["", "demo-full", HOSTILE],
        [None, datetime(2026, 12, 4, 13, 5, tzinfo=UTC)],
        [False, True],
    ):
        if role == "user" and (status != "complete" or error or picked or tier or model):
            continue
        m = Message(
            mid=f"1796391281360-web1-{len(found)}",
            conversation_id="9cab5bc7-bfad-46f6-be0b-39f888906e07",
            role=role,
            status=status,
            error=error,
            text=text,
            picked=picked,
            tier=tier,
            model=model,
            finished_at=finished,
            usage_estimated=estimated,
            prompt_tokens=1234,
            completion_tokens=56789,
        )
        found.append(m)
    return found


VOTES = [
    None,
    SimpleNamespace(vote="up", comment=""),
    SimpleNamespace(vote="down", comment=""),
    SimpleNamespace(vote="down", comment=HOSTILE),
]


@pytest.mark.parametrize("case", range(4))
def test_every_bubble_is_what_the_template_wrote(case: int) -> None:
    entries = [None, "one", "first", "middle", "last"]
    count = 0
    for i, m in enumerate(messages()):
        if i % 4 != case:
            continue
        shape = entries[i % len(entries)]
        entry = None
        if shape == "one":
            entry = ThreadEntry(m, 1, 1, "", "", "")
        elif shape == "first":
            entry = ThreadEntry(m, 1, 3, "", "1796391281360-web1-x2", "")
        elif shape == "middle":
            entry = ThreadEntry(m, 2, 3, "1796391281360-web1-x1", "1796391281360-web1-x3", "")
        elif shape == "last":
            entry = ThreadEntry(m, 3, 3, "1796391281360-web1-x2", "", "")
        vote = VOTES[i % len(VOTES)]
        if vote is not None:
            m.votes = [vote]  # type: ignore[attr-defined]
        elif i % 3:
            m.votes = []  # type: ignore[attr-defined]
        for kw in (
            {},
            {"rendered": "<p>safe <em>html</em></p>", "oob": True, "blocks": 3},
            {"watch": True, "next_seq": 7, "blocks": 0},
            {"live": bubbles.Live(2, 40, json.dumps('open "block"\r\n<x>'))},
        ):
            context: dict[str, Any] = {"m": m, "entry": entry, **kw}
            if "live" in kw:
                live = kw["live"]
                context["live"] = {"placed": live.placed, "end": live.end, "open": live.open}
            want = render_to_string("chat/partials/message.html", context)
            got = bubbles.message_html(m, entry=entry, **kw)
            assert got == want, (m.role, m.status, m.error, kw)
            count += 1
    assert count > 1000


@pytest.mark.parametrize("sent", [False, True])
def test_the_feedback_is_what_the_template_wrote(sent: bool) -> None:
    m = Message(mid="1796391281360-web1-9", role="assistant", status="complete", text="x")
    for vote in VOTES:
        want = render_to_string(
            "chat/partials/feedback.html", {"m": m, "vote": vote or "", "sent": sent}
        )
        assert bubbles.feedback_html(m, vote, sent=sent) == want


@pytest.mark.django_db
def test_the_exchange_and_final_frames_are_what_the_templates_wrote(
    django_user_model: Any,
) -> None:
    from django.template import engines

    from chat import fragments
    from chat.conversations import Exchange
    from chat.models import Conversation

    exchange_template = engines["django"].get_template("chat/frames/exchange.html")
    final_template = engines["django"].get_template("chat/frames/final.html")
    user = django_user_model.objects.create_user("eq", password="x")
    conv = Conversation.objects.create(user=user, title=HOSTILE)
    prompt = Message.objects.create(conversation=conv, mid="p1", role="user", text=HOSTILE)
    answer = Message.objects.create(
        conversation=conv, mid="a1", role="assistant", status="streaming", parent=prompt
    )
    count = 0
    for created, has_prompt, fork_after, shown, watch, answer_html in itertools.product(
        [False, True],
        [False, True],
        [None, "", "p0"],
        [False, True],
        [False, True],
        ["", "<p>done</p>"],
    ):
        exchange = Exchange(conv, created, prompt if has_prompt else None, answer, [], fork_after)
        got = fragments.exchange_html(
            exchange, target="#messages", watch=watch, answer_html=answer_html, shown=shown
        )
        prompt_entry = answer_entry = None
        if shown and exchange.forked:
            from chat.branches import entry_for

            if exchange.prompt is not None:
                prompt_entry = entry_for(exchange.prompt)
            else:
                answer_entry = entry_for(exchange.answer)
        want = exchange_template.render(
            {
                "conversation": conv,
                "prompt": exchange.prompt,
                "prompt_entry": prompt_entry,
                "answer": answer,
                "answer_entry": answer_entry,
                "target": "#messages",
                "watch": watch,
                "created": created,
                "fork_after": fork_after,
                "first": exchange.prompt or answer,
                "answer_html": answer_html,
                "shown": shown,
            }
        )
        assert got == want, (created, has_prompt, fork_after, shown, watch)
        count += 1
    answer.status, answer.text, answer.html = "complete", "hi", "<p>hi</p>"
    for blocks in (None, 0, 2):
        entry = ThreadEntry(answer, 1, 1, "", "", "<p>hi</p>")
        want = final_template.render(
            {"message": answer, "entry": entry, "rendered": entry.rendered, "blocks": blocks}
        )
        assert fragments.final_html(answer, blocks=blocks, only_version=True) == want
    assert count == 96

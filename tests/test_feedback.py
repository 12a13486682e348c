"""Feedback on answers (issue 17.5): the owner's 👍/👎, one per answer and changeable, a comment
on 👎; nobody else's, CSRF, bad input; the admin's list, filters and the count per model."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from chat.ids import new_message_id
from chat.limits.plans import forget_cached_limits
from chat.models import Conversation, Feedback, Message
from chat.tiers.policy import clear_policy_cache

pytestmark = pytest.mark.django_db


def exchange(
    user: Any, *, model: str = "demo-full", tier: str = "full", status: str = "complete"
) -> tuple[Conversation, Message, Message]:
    conversation = Conversation.objects.create(user=user, title=f"chat of {user.username}")
    prompt = Message.objects.create(
        mid=new_message_id(conversation.shard),
        conversation=conversation,
        role=Message.Role.USER,
        text="a question",
    )
    answer = Message.objects.create(
        mid=new_message_id(conversation.shard),
        conversation=conversation,
        parent=prompt,
        role=Message.Role.ASSISTANT,
        text="an answer",
        status=status,
        model=model,
        tier=tier,
    )
    Conversation.objects.filter(pk=conversation.pk).update(leaf=answer)
    return conversation, prompt, answer


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_owner_votes_and_changes_their_mind_one_vote_per_answer(owner: Any) -> None:
    _, _, answer = exchange(owner)
    client = logged_in(owner)
    url = f"/m/{answer.mid}/feedback/"
    response = client.post(url, {"value": "up"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert 'aria-pressed="true">👍' in response.content.decode()
    response = client.post(url, {"value": "down"}, HTTP_HX_REQUEST="true")
    # A 👎 opens the box for what was wrong.
    assert 'name="comment"' in response.content.decode()
    sent = client.post(
        url, {"value": "down", "comment": "It made up a date."}, HTTP_HX_REQUEST="true"
    )
    # Sent: the box closes, so nothing invites a second send; the thanks stays.
    assert 'name="comment"' not in sent.content.decode()
    assert "Thanks, your feedback was sent." in sent.content.decode()
    vote = Feedback.objects.get()  # still one row: the vote changed, it was not added
    assert (vote.vote, vote.comment, vote.user_id) == ("down", "It made up a date.", owner.pk)
    # A 👎 without the comment field keeps the comment; a 👍 drops it (it said what was wrong).
    client.post(url, {"value": "down"}, HTTP_HX_REQUEST="true")
    assert Feedback.objects.get().comment == "It made up a date."
    client.post(url, {"value": "up"}, HTTP_HX_REQUEST="true")
    assert (Feedback.objects.get().vote, Feedback.objects.get().comment) == ("up", "")
    # Without htmx (a plain form post) the person lands back on the conversation.
    response = client.post(url, {"value": "down"})
    assert response.status_code == 302 and response["Location"] == f"/c/{answer.conversation_id}/"


def test_the_vote_is_shown_pressed_when_the_conversation_is_opened_again(owner: Any) -> None:
    conversation, _, answer = exchange(owner)
    Feedback.objects.create(message=answer, user=owner, vote="down", comment="too long")
    page = logged_in(owner).get(f"/c/{conversation.id}/").content.decode()
    assert 'aria-pressed="true">👎' in page
    # Its comment was given: the thanks, not the box (👎 again opens it with the comment).
    assert "Thanks for your feedback." in page and "too long" not in page
    again = logged_in(owner).post(
        f"/m/{answer.mid}/feedback/", {"value": "down"}, headers={"HX-Request": "true"}
    )
    assert ">too long</textarea>" in again.content.decode()


def test_someone_elses_answer_is_not_found_and_an_anonymous_vote_goes_to_the_login(
    owner: Any, other_user: Any
) -> None:
    _, _, answer = exchange(owner)
    url = f"/m/{answer.mid}/feedback/"
    response = logged_in(other_user).post(url, {"value": "down", "comment": "x"})
    assert response.status_code == 404
    response = Client().post(url, {"value": "down"})
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert logged_in(owner).get(url).status_code == 405
    for mid in ("no-such-id", "x" * 500):
        assert logged_in(owner).post(f"/m/{mid}/feedback/", {"value": "up"}).status_code == 404
    assert not Feedback.objects.exists()


def test_bad_input_gets_a_clear_400(owner: Any, caplog: pytest.LogCaptureFixture) -> None:
    _, prompt, answer = exchange(owner)
    _, _, streaming = exchange(owner, status="streaming")
    client = logged_in(owner)
    cases = [
        (answer.mid, {}, "Say whether the answer was good"),
        (answer.mid, {"value": "sideways"}, "Feedback is up or down."),
        (answer.mid, {"value": "down", "comment": "x" * 2001}, "under 2,000 characters"),
        (prompt.mid, {"value": "up"}, "Only a finished answer can be rated."),
        (streaming.mid, {"value": "up"}, "Only a finished answer can be rated."),
    ]
    for mid, data, words in cases:
        response = client.post(f"/m/{mid}/feedback/", data, HTTP_HX_REQUEST="true")
        assert response.status_code == 400, data
        assert words in response.content.decode(), data
        assert response["HX-Retarget"] == "#alerts"
    assert not Feedback.objects.exists()
    # Each refusal is one log line, not a traceback any user could repeat 120 times a minute.
    refused = [r for r in caplog.records if r.name == "django.request"]
    assert len(refused) == len(cases)
    assert all(r.getMessage().endswith("/feedback/") and not r.exc_info for r in refused)


def test_a_vote_needs_the_csrf_token(owner: Any) -> None:
    _, _, answer = exchange(owner)
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert client.post(f"/m/{answer.mid}/feedback/", {"value": "up"}).status_code == 403
    assert not Feedback.objects.exists()


def test_votes_cost_one_query_per_page_whatever_the_number_of_answers(owner: Any) -> None:
    client = logged_in(owner)
    counts = []
    for answers in (1, 12):
        conversation = Conversation.objects.create(user=owner, title="many")
        parent = None
        for i in range(answers):
            prompt = Message.objects.create(
                mid=new_message_id(conversation.shard),
                conversation=conversation,
                parent=parent,
                role=Message.Role.USER,
                text=f"q{i}",
            )
            parent = Message.objects.create(
                mid=new_message_id(conversation.shard),
                conversation=conversation,
                parent=prompt,
                role=Message.Role.ASSISTANT,
                text=f"a{i}",
            )
            Feedback.objects.create(message=parent, user=owner, vote="up")
        Conversation.objects.filter(pk=conversation.pk).update(leaf=parent)
        forget_cached_limits()
        clear_policy_cache()
        with CaptureQueriesContext(connection) as queries:
            page = client.get(f"/c/{conversation.id}/").content.decode()
        assert page.count('aria-pressed="true">👍') == answers
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_the_admin_lists_feedback_by_vote_model_tier_and_day_with_counts_per_model(
    owner: Any,
) -> None:
    boss = get_user_model().objects.create_superuser("boss", password="boss-pass-123456")
    conversation, _, full = exchange(owner)
    _, _, lite = exchange(owner, model="demo-lite", tier="lite")
    Feedback.objects.create(message=full, user=owner, vote="down", comment="wrong capital")
    Feedback.objects.create(message=lite, user=owner, vote="up")
    admin = logged_in(boss)
    listing = admin.get("/admin/chat/feedback/").content.decode()
    assert "wrong capital" in listing
    assert f"/admin/chat/conversation/{conversation.pk}/change/" in listing  # the link to it
    for query, shown, hidden in (
        ("vote__exact=down", "wrong capital", "demo-lite"),
        ("message__model=demo-lite", "demo-lite", "wrong capital"),
        ("message__tier__exact=full", "wrong capital", "demo-lite"),
    ):
        page = admin.get(f"/admin/chat/feedback/?{query}").content.decode()
        rows = page.split('id="result_list"')[1].split("</table>")[0]
        assert shown in rows and hidden not in rows, query
    day = full.created_at.date()
    page = admin.get(
        f"/admin/chat/feedback/?updated_at__day={day.day}&updated_at__month={day.month}"
        f"&updated_at__year={day.year}"
    )
    assert page.status_code == 200 and "wrong capital" in page.content.decode()
    index = admin.get("/admin/").content.decode()
    counts = index.split('id="feedback-by-model"')[1].split("</table>")[0]
    assert "demo-full" in counts and "demo-lite" in counts
    # Votes are the users' own: the admin reads them and cannot add or edit one.
    assert admin.get("/admin/chat/feedback/add/").status_code == 403
    vote = Feedback.objects.get(vote="down")
    admin.post(f"/admin/chat/feedback/{vote.pk}/change/", {"vote": "up", "comment": "edited"})
    assert Feedback.objects.get(pk=vote.pk).comment == "wrong capital"

"""Feedback on answers: 👍/👎 (one per person and answer, changeable) and a comment on 👎."""

from __future__ import annotations

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from chat.bubbles import feedback_html
from chat.forms import InvalidInput
from chat.models import Feedback, Message

COMMENT_MAX_CHARS = 2000


class FeedbackForm(forms.Form):
    value = forms.ChoiceField(
        choices=Feedback.Vote.choices,
        error_messages={
            "required": "Say whether the answer was good (up) or bad (down).",
            "invalid_choice": "Feedback is up or down.",
        },
    )
    comment = forms.CharField(
        required=False,
        max_length=COMMENT_MAX_CHARS,
        strip=True,
        error_messages={"max_length": f"Keep the comment under {COMMENT_MAX_CHARS:,} characters."},
    )


def do_vote(message: Message, user_id: int, vote: str, comment: str | None) -> Feedback:
    """Record the vote (replacing this person's earlier one). A 👍 drops an earlier comment,
    which said what was wrong; a 👎 without a comment field keeps the one it had."""
    defaults: dict[str, str] = {"vote": vote}
    if vote == Feedback.Vote.UP:
        defaults["comment"] = ""
    elif comment is not None:
        defaults["comment"] = comment
    feedback, _ = Feedback.objects.update_or_create(
        message=message, user_id=user_id, defaults=defaults
    )
    return feedback


@login_required
@require_POST
def feedback(request: HttpRequest, mid: str) -> HttpResponse:
    """`POST /m/<mid>/feedback/` (value=up|down, optional comment): the owner's vote; anyone
    else's, or an unknown id, is a 404. htmx gets the answer's feedback controls back."""
    message = (
        Message.objects.select_related("conversation")
        .filter(mid=mid, conversation__user_id=int(request.user.pk or 0))
        .first()
    )
    if message is None:
        raise Http404("That message does not exist.")
    if message.role != Message.Role.ASSISTANT or message.status == Message.Status.STREAMING:
        raise InvalidInput("Only a finished answer can be rated.")
    form = FeedbackForm(request.POST)
    if not form.is_valid():
        raise InvalidInput(str(next(iter(form.errors.values()))[0]))
    comment = form.cleaned_data["comment"] if "comment" in request.POST else None
    vote = do_vote(message, int(request.user.pk or 0), form.cleaned_data["value"], comment)
    if not request.htmx:  # type: ignore[attr-defined]
        return redirect(message.conversation)
    # The comment form was sent: it closes, and the thanks stays with the vote buttons.
    return HttpResponse(feedback_html(message, vote, sent=comment is not None))

"""Export and share: a conversation as Markdown or JSON, all of a person's data as JSON, and a
read-only snapshot at `/s/<token>/` that anyone with the link can read."""

from __future__ import annotations

import json
import re
import secrets

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import content_disposition_header
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_POST

from chat.exports import (
    account_document,
    conversation_document,
    conversation_markdown,
    snapshot_of,
)
from chat.models import Conversation, SharedConversation

# secrets.token_urlsafe(32): 43 characters of [A-Za-z0-9_-]. Anything else is not looked up.
TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")


def _own(request: HttpRequest, conversation_id: str) -> Conversation:
    """The person's own conversation; anyone else's or an unknown one is a 404."""
    return get_object_or_404(Conversation, id=conversation_id, user_id=int(request.user.pk or 0))


def _download(body: str, content_type: str, filename: str) -> HttpResponse:
    response = HttpResponse(body, content_type=content_type)
    response["Content-Disposition"] = content_disposition_header(True, filename)
    response["Cache-Control"] = "private, no-store"
    return response


def _filename(conversation: Conversation, extension: str) -> str:
    name = slugify(conversation.title)[:60] or "conversation"
    return f"{name}-{conversation.created_at:%Y-%m-%d}.{extension}"


@login_required
@require_GET
def export_markdown(request: HttpRequest, conversation_id: str) -> HttpResponse:
    conversation = _own(request, conversation_id)
    return _download(
        conversation_markdown(conversation),
        "text/markdown; charset=utf-8",
        _filename(conversation, "md"),
    )


@login_required
@require_GET
def export_json(request: HttpRequest, conversation_id: str) -> HttpResponse:
    conversation = _own(request, conversation_id)
    return _download(
        json.dumps(conversation_document(conversation), ensure_ascii=False, indent=2),
        "application/json",
        _filename(conversation, "json"),
    )


@login_required
@require_GET
def export_account(request: HttpRequest) -> HttpResponse:
    """`GET /settings/export.json`: every conversation and vote of the person asking."""
    document = account_document(request.user, int(request.user.pk or 0))  # type: ignore[arg-type]
    return _download(
        json.dumps(document, ensure_ascii=False, indent=2),
        "application/json",
        f"chatsite-{request.user.get_username()}-{timezone.now():%Y-%m-%d}.json",
    )


@login_required
@require_POST
def share(request: HttpRequest, conversation_id: str) -> HttpResponse:
    """Share the branch on show as it is now. Sharing again updates the snapshot under the same
    link. htmx gets the link (and Copy, Stop sharing); a plain post goes to the shared page."""
    conversation = _own(request, conversation_id)
    shared, created = SharedConversation.objects.get_or_create(
        conversation=conversation,
        defaults={
            "token": secrets.token_urlsafe(32),
            "title": conversation.title,
            "messages": snapshot_of(conversation),
        },
    )
    if not created:
        shared.title = conversation.title
        shared.messages = snapshot_of(conversation)
        shared.save(update_fields=["title", "messages", "updated_at"])
    path = reverse("chat:shared", args=[shared.token])
    if not request.htmx:  # type: ignore[attr-defined]
        return redirect(path)
    return render(
        request,
        "chat/partials/share_result.html",
        {"c": conversation, "path": path, "link": request.build_absolute_uri(path)},
    )


@login_required
@require_POST
def unshare(request: HttpRequest, conversation_id: str) -> HttpResponse:
    """Stop sharing: the link is then not found (a new share makes a new link)."""
    conversation = _own(request, conversation_id)
    SharedConversation.objects.filter(conversation=conversation).delete()
    if not request.htmx:  # type: ignore[attr-defined]
        return redirect(conversation)
    return render(request, "chat/partials/share_result.html", {"c": conversation, "path": ""})


@require_GET
def shared(request: HttpRequest, token: str) -> HttpResponse:
    """The snapshot, for anyone with the link (no login): the same sanitised HTML as the page,
    kept out of search engines and out of caches (an unshared link must stop working)."""
    if not TOKEN.fullmatch(token):
        raise Http404("No such shared conversation.")
    snapshot = SharedConversation.objects.filter(token=token).first()
    if snapshot is None:
        raise Http404("No such shared conversation.")
    response = render(request, "chat/shared.html", {"shared": snapshot})
    response["X-Robots-Tag"] = "noindex, nofollow, noarchive"
    response["Cache-Control"] = "private, no-store"
    # The link is the only key: never send it on as a Referer, even to this site's own pages.
    response["Referrer-Policy"] = "no-referrer"
    return response

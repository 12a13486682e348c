"""Export and share: a conversation as Markdown or JSON, all of a person's data as JSON, and a
read-only snapshot at `/s/<token>/` that anyone with the link can read."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
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
from chat.json_pieces import chunks, pieces
from chat.limits.exports import ExportSlot, take_export_slot
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


# A second export while one runs: the person's own, so the message says what to do.
EXPORT_BUSY = (
    "An export of yours is still being prepared. Wait until it has downloaded, then try again."
)


class _Streamed:
    """An export's JSON as it is written; gives its slot back when the writing ends or when the
    response is closed (Django closes it however the download ends, even unread)."""

    def __init__(self, document: dict[str, Any], slot: ExportSlot) -> None:
        self._chunks = chunks(pieces(document))
        self._slot = slot

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._chunks
        finally:
            self._slot.release()

    def next_chunk(self) -> bytes | None:
        return next(self._chunks, None)

    def close(self) -> None:
        self._slot.release()


class _ASGIStreamed:
    """The same under ASGI, where Django would read a plain iterator whole into a list: each
    chunk is written on the ORM thread instead, one hop per chunk."""

    def __init__(self, body: _Streamed) -> None:
        self._body = body

    async def __aiter__(self) -> AsyncIterator[bytes]:
        step = sync_to_async(self._body.next_chunk, thread_sensitive=True)
        try:
            while (chunk := await step()) is not None:
                yield chunk
        finally:
            self._body.close()

    def close(self) -> None:
        self._body.close()


def _stream(
    request: HttpRequest, document: dict[str, Any], slot: ExportSlot, name: str
) -> StreamingHttpResponse:
    body = _Streamed(document, slot)
    content: Any = _ASGIStreamed(body) if isinstance(request, ASGIRequest) else body
    response = StreamingHttpResponse(content, content_type="application/json")
    response["Content-Disposition"] = content_disposition_header(True, name)
    response["Cache-Control"] = "private, no-store"
    return response


def _busy() -> HttpResponse:
    response = HttpResponse(EXPORT_BUSY, status=429, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = "10"
    return response


@login_required
@require_GET
def export_json(request: HttpRequest, conversation_id: str) -> HttpResponse | StreamingHttpResponse:
    conversation = _own(request, conversation_id)
    slot = take_export_slot(conversation.user_id)
    if slot is None:
        return _busy()
    try:
        document = conversation_document(conversation)
    except BaseException:
        slot.release()
        raise
    return _stream(request, document, slot, _filename(conversation, "json"))


@login_required
@require_GET
def export_account(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """`GET /settings/export.json`: every conversation and vote of the person asking, streamed
    (a bounded part of it in memory at a time), one at a time per person."""
    user_id = int(request.user.pk or 0)
    slot = take_export_slot(user_id)
    if slot is None:
        return _busy()
    try:
        document = account_document(request.user, user_id)  # type: ignore[arg-type]
    except BaseException:
        slot.release()
        raise
    name = f"chatsite-{request.user.get_username()}-{timezone.now():%Y-%m-%d}.json"
    return _stream(request, document, slot, name)


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

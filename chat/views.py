"""HTTP views: the chat pages and the htmx partials of the conversation list."""

from __future__ import annotations

from dataclasses import dataclass

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.crypto import salted_hmac
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import reswap, retarget, trigger_client_event

from chat import branches, conversations, protocol
from chat.demo_upstream.answers import MODELS as DEMO_MODELS
from chat.events import send_to_user_on_commit
from chat.forms import (
    EarlierForm,
    InvalidInput,
    ListQueryForm,
    RenameForm,
    current_conversation,
)
from chat.limits.limiter import get_limiter
from chat.menus import conversation_item_html
from chat.models import Conversation, Message
from chat.tiers.hints import CHOICE_COOKIE, normalise_choice
from chat.tiers.picker import with_choices
from chat.tiers.policy import CHOICE_REASON, TierDecision, tier_for_request
from chat.turns.registry import registry

SIDEBAR_SIZE = 50


@dataclass(frozen=True)
class Starter:
    """A starter prompt on the first screen: a click sends `prompt`."""

    label: str
    prompt: str


STARTERS = (
    Starter("Explain how rainbows form", "Explain how a rainbow forms, in three short paragraphs."),
    Starter(
        "Write a palindrome checker in Python",
        "Write a Python function that checks whether a word is a palindrome, with a few tests.",
    ),
    Starter("Plan a rainy weekend at home", "Give me five ideas for a rainy weekend at home."),
    Starter(
        "Compare working from home and the office",
        "Compare working from home and working at the office in a short table.",
    ),
)


def _list_query(request: HttpRequest) -> tuple[str, int]:
    """The search and the offset of the conversation list, validated (InvalidInput if not)."""
    form = ListQueryForm(request.GET)
    if not form.is_valid():
        raise InvalidInput(form.first_error())
    return form.cleaned_data["q"].strip(), form.cleaned_data["offset"] or 0


def _conversations(request: HttpRequest, query: str) -> QuerySet[Conversation]:
    """The user's conversations, pinned first then newest; filtered by `query` (title or text)."""
    qs = Conversation.objects.filter(user_id=int(request.user.pk or 0))
    if query:
        qs = qs.filter(Q(title__icontains=query) | Q(messages__text__icontains=query)).distinct()
    return qs


def _sidebar(request: HttpRequest, current: str) -> dict[str, object]:
    """One page of the conversation list, and where the next page starts (None at the end)."""
    query, offset = _list_query(request)
    page = list(_conversations(request, query)[offset : offset + SIDEBAR_SIZE + 1])
    more = offset + SIDEBAR_SIZE if len(page) > SIDEBAR_SIZE else None
    return {
        "conversations": page[:SIDEBAR_SIZE],
        "next_offset": more,
        "query": query,
        "current": current,
    }


def not_found(
    request: HttpRequest, exception: Exception | None = None, *, conversation: bool = False
) -> HttpResponse:
    """404 in the app's own page, with the way back (handler404; and a conversation's link)."""
    if conversation:
        heading = "This conversation is not here"
        message = "It may have been deleted, or the link belongs to another account."
    else:
        heading = "Page not found"
        message = "There is nothing at this address."
    context = {"heading": heading, "message": message}
    return render(request, "chat/not_found.html", context, status=404)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """400: what was wrong, in words, where the person will see it (htmx: the alert region)."""
    message = (
        str(exception)
        if isinstance(exception, InvalidInput)
        else "The request could not be understood."
    )
    if request.headers.get("HX-Request"):
        response = render(request, "chat/partials/invalid.html", {"message": message}, status=400)
        retarget(response, "#alerts")
        reswap(response, "innerHTML")
        return response
    return render(request, "chat/bad_request.html", {"message": message}, status=400)


def _page(request: HttpRequest, conversation: Conversation | None) -> HttpResponse:
    # Only the latest window of the branch on show (issue 13, finding 17): a page's size and
    # queries do not grow with the conversation; "Load earlier messages" fetches the rest.
    window = branches.window(conversation) if conversation is not None else branches.Window([])
    return render(
        request,
        "chat/page.html",
        {
            "conversation": conversation,
            "window": window,
            **_sidebar(request, str(conversation.id) if conversation else ""),
            **_tier_context(request, getattr(request, "tier", None)),
            "max_prompt_chars": protocol.max_prompt_chars(),
            "starters": STARTERS,
            "demo_model": _answers_with_the_demo_model(getattr(request, "tier", None)),
            "tokens_left": _tokens_left(int(request.user.pk or 0)),
            **_model_choices(request, conversation),
            # Whose the tab's stored drafts are (drafts.js): opaque, one per user.
            "storage_owner": salted_hmac("chatsite.drafts", str(request.user.pk)).hexdigest()[:16],
        },
    )


def _model_choices(request: HttpRequest, conversation: Conversation | None) -> dict[str, object]:
    """The model picker's options for this device and plan, and the one selected: the
    conversation's model while it may still be picked here, else the tier's default."""
    tier: TierDecision | None = getattr(request, "tier", None)
    if tier is None:
        return {"model_choices": (), "model_selected": ""}
    choices = with_choices(tier, request.user).models
    picked = conversation.model if conversation is not None else ""
    selected = picked if picked in {model for model, _ in choices} else tier.model
    return {"model_choices": choices, "model_selected": selected}


def _answers_with_the_demo_model(tier: TierDecision | None) -> bool:
    """Whether the built-in demo model answers here: only then does the first screen speak of
    it (and, to staff, of how to connect a real one)."""
    model = tier.model if tier is not None else settings.CHAT_MODEL_FULL
    return model in DEMO_MODELS


def _tokens_left(user_id: int) -> int | None:
    """Today's usable tokens for the usage meter; None when no budget applies."""

    async def read() -> int | None:
        return await get_limiter().usable_today(user_id)

    return async_to_sync(read)()


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return _page(request, None)


@login_required
@require_GET
def conversation(request: HttpRequest, conversation_id: str) -> HttpResponse:
    conv = Conversation.objects.filter(
        id=conversation_id, user_id=int(request.user.pk or 0)
    ).first()
    if conv is None:
        # A stale link or bookmark (deleted, or another account's): the app's own page, also
        # under DEBUG, whose technical 404 a new user met after `make run`.
        return not_found(request, None, conversation=True)
    return _page(request, conv)


@login_required
@require_GET
def earlier_messages(request: HttpRequest, conversation_id: str) -> HttpResponse:
    """The window of the branch on show just before the message `before` (htmx: it replaces
    the "Load earlier messages" control, with its own control if more come before it)."""
    conv = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    form = EarlierForm(request.GET)
    if not form.is_valid():
        raise InvalidInput(form.first_error())
    try:
        before = conv.messages.get(mid=form.cleaned_data["before"])
    except Message.DoesNotExist:
        raise Http404("That message does not exist.") from None
    return render(
        request,
        "chat/partials/thread.html",
        {"window": branches.window(conv, before=before), "conversation": conv},
    )


@login_required
@require_GET
def conversation_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "chat/partials/conversation_list.html",
        _sidebar(request, current_conversation(request.GET.get("current", ""))),
    )


@login_required
@require_POST
def pin(request: HttpRequest, conversation_id: str) -> HttpResponse:
    """Pin or unpin a conversation; the list is sent again since its order changed."""
    conv = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    current = current_conversation(request.POST.get("current", ""))  # refused before the write
    Conversation.objects.filter(pk=conv.pk).update(pinned=not conv.pinned)
    return render(request, "chat/partials/conversation_list.html", _sidebar(request, current))


@login_required
@require_POST
def rename(request: HttpRequest, conversation_id: str) -> HttpResponse:
    conv = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    form = RenameForm(request.POST)
    if not form.is_valid():
        return HttpResponse("A title is required (at most 200 characters).", status=400)
    current = current_conversation(request.POST.get("current", ""))  # refused before the write
    conversations.do_rename_conversation(conv, form.cleaned_data["title"])
    return HttpResponse(conversation_item_html(conv, current))


@login_required
@require_POST
def switch_version(request: HttpRequest, conversation_id: str, mid: str) -> HttpResponse:
    """Show another version of a message (the "2 of 3" arrows); htmx swaps the thread."""
    try:
        conv = conversations.do_switch_version(int(request.user.pk or 0), str(conversation_id), mid)
    except conversations.NotFound as exc:
        raise Http404(str(exc)) from None
    # The new branch up to the switched message, so that it stays in place on screen.
    return render(
        request,
        "chat/partials/thread.html",
        {"window": branches.window_reaching(conv, mid), "conversation": conv},
    )


@login_required
@require_POST
def delete(request: HttpRequest, conversation_id: str) -> HttpResponse:
    """Delete a conversation, and stop its answers still streaming, wherever they run: an
    answer nobody can see any more must not go on costing an upstream call and a stream
    slot (issue 13, finding 16)."""
    conv = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    streaming = conversations.streaming_answers(conv)
    conv.delete()
    for mid in streaming:
        # Here at once (on the event loop, where the turn runs), elsewhere through the
        # control channel; the turn ends `stopped` and settles its slot and reservation.
        async_to_sync(registry.stop)(mid)
    # Every other tab of the user (any browser, any instance) drops it too; one that shows it
    # becomes a new chat, keeping what was typed in its box (chat.sockets.consumers).
    send_to_user_on_commit(
        int(request.user.pk or 0), {"type": "chat.deleted", "conversation": str(conversation_id)}
    )
    response = HttpResponse("")
    if request.POST.get("current") == str(conversation_id):
        # The page shows what is gone: sidebar.js makes it a new chat in place of its history
        # entry, so neither Back nor a reload lands on the deleted conversation's 404.
        trigger_client_event(response, "open-conversation-deleted")
    return response


def _tier_context(request: HttpRequest, tier: TierDecision | None) -> dict[str, object]:
    """What the tier badge and its popover show (chat/partials/tier_*.html)."""
    return {
        "tier": tier,
        # The choice counts only where the policy took it (a plan may refuse full on a phone).
        "tier_chosen": tier is not None and tier.reason == CHOICE_REASON,
        "next_path": request.get_full_path(),
    }


@require_POST
async def choose_tier(request: HttpRequest) -> HttpResponse:
    """Remember this device's model choice (a cookie: the choice is about this phone).

    From the page (htmx) the answer is the badge and its popover as they are with the new
    choice, swapped out of band, and a `tier-chosen` event: the page reconnects its socket,
    whose handshake then carries the cookie, so the next `ready` frame and every answer after
    it use the chosen tier. Nothing else on the page changes: the prompt box keeps its text.
    Without scripts the form posts and the page is loaded again.
    """
    choice = normalise_choice(request.POST.get("tier"))  # anything else: back to automatic
    if request.htmx:  # type: ignore[attr-defined]
        cookies = {name: value for name, value in request.COOKIES.items() if name != CHOICE_COOKIE}
        if choice:
            cookies[CHOICE_COOKIE] = choice
        tier = await tier_for_request(request, cookies=cookies)
        next_path = _safe_next(request)
        response = render(
            request,
            "chat/partials/tier_choice.html",
            {**_tier_context(request, tier), "next_path": next_path, "oob": True},
        )
        trigger_client_event(response, "tier-chosen", {"tier": tier.tier})
    else:
        response = redirect(_safe_next(request))
    if choice:
        response.set_cookie(
            CHOICE_COOKIE, choice, max_age=365 * 86400, samesite="Lax", httponly=True
        )
    else:
        response.delete_cookie(CHOICE_COOKIE)
    return response


def _safe_next(request: HttpRequest) -> str:
    target = request.POST.get("next", "/")
    # A path on this site only: `redirect()` would try anything else without a slash ("-1")
    # as a view name and fail with a 500.
    if target.startswith("/") and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}
    ):
        return target
    return "/"

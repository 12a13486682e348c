"""HTTP views: the chat pages and the htmx partials of the conversation list."""

from __future__ import annotations

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from chat import services
from chat.forms import RenameForm, SignupForm
from chat.models import Conversation
from chat.ratelimit import get_limiter

SIDEBAR_SIZE = 50


def _conversations(request: HttpRequest) -> QuerySet[Conversation]:
    """The user's conversations, pinned first then newest; filtered by `?q=` (title or text)."""
    qs = Conversation.objects.filter(user_id=int(request.user.pk or 0))
    query = request.GET.get("q", "").strip()
    if query:
        qs = qs.filter(Q(title__icontains=query) | Q(messages__text__icontains=query)).distinct()
    return qs


def _sidebar(request: HttpRequest, current: str) -> dict[str, object]:
    """One page of the conversation list, and where the next page starts (None at the end)."""
    try:
        offset = max(0, int(request.GET.get("offset", "0")))
    except ValueError:
        offset = 0
    page = list(_conversations(request)[offset : offset + SIDEBAR_SIZE + 1])
    more = offset + SIDEBAR_SIZE if len(page) > SIDEBAR_SIZE else None
    return {
        "conversations": page[:SIDEBAR_SIZE],
        "next_offset": more,
        "query": request.GET.get("q", "").strip(),
        "current": current,
    }


def _page(request: HttpRequest, conversation: Conversation | None) -> HttpResponse:
    entries: list[services.ThreadEntry] = []
    if conversation is not None:
        services.do_reap_orphans()
        entries = services.thread(conversation, render=True)
    return render(
        request,
        "chat/page.html",
        {
            "conversation": conversation,
            "entries": entries,
            **_sidebar(request, str(conversation.id) if conversation else ""),
            "tier": getattr(request, "tier", None),
            "max_prompt_chars": settings.CHAT_MAX_PROMPT_CHARS,
            "tokens_left": _tokens_left(int(request.user.pk or 0)),
        },
    )


def _tokens_left(user_id: int) -> int | None:
    """Today's tokens left for the usage meter; None when the quota is unlimited."""

    async def read() -> tuple[int, int]:
        return await get_limiter().tokens_today(user_id)

    used, quota = async_to_sync(read)()
    return max(0, quota - used) if quota else None


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return _page(request, None)


@login_required
@require_GET
def conversation(request: HttpRequest, conversation_id: str) -> HttpResponse:
    conv = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    return _page(request, conv)


@login_required
@require_GET
def conversation_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "chat/partials/conversation_list.html",
        _sidebar(request, request.GET.get("current", "")),
    )


@login_required
@require_POST
def pin(request: HttpRequest, conversation_id: str) -> HttpResponse:
    """Pin or unpin a conversation; the list is sent again since its order changed."""
    conv = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    Conversation.objects.filter(pk=conv.pk).update(pinned=not conv.pinned)
    return render(
        request,
        "chat/partials/conversation_list.html",
        _sidebar(request, request.POST.get("current", "")),
    )


@login_required
@require_POST
def rename(request: HttpRequest, conversation_id: str) -> HttpResponse:
    conv = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    form = RenameForm(request.POST)
    if not form.is_valid():
        return HttpResponse("A title is required (at most 200 characters).", status=400)
    services.do_rename_conversation(conv, form.cleaned_data["title"])
    return render(
        request,
        "chat/partials/conversation_item.html",
        {"c": conv, "current": request.POST.get("current", "")},
    )


@login_required
@require_POST
def switch_version(request: HttpRequest, conversation_id: str, mid: str) -> HttpResponse:
    """Show another version of a message (the "2 of 3" arrows); htmx swaps the thread."""
    try:
        conv = services.do_switch_version(int(request.user.pk or 0), str(conversation_id), mid)
    except services.NotFound as exc:
        raise Http404(str(exc)) from None
    return render(
        request,
        "chat/partials/thread.html",
        {"entries": services.thread(conv, render=True), "conversation": conv},
    )


@login_required
@require_POST
def delete(request: HttpRequest, conversation_id: str) -> HttpResponse:
    conv = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    conv.delete()
    if request.POST.get("current") == str(conversation_id):
        response = HttpResponse(status=204)
        response["HX-Redirect"] = "/"
        return response
    return HttpResponse("")


@require_POST
def choose_tier(request: HttpRequest) -> HttpResponse:
    """Remember this device's model choice (a cookie: the choice is about this phone)."""
    choice = request.POST.get("tier", "auto")
    if request.headers.get("HX-Request"):
        response: HttpResponse = HttpResponse(status=204)
        response["HX-Refresh"] = "true"
    else:
        response = redirect(_safe_next(request))
    if choice in ("full", "lite"):
        response.set_cookie("chat_tier", choice, max_age=365 * 86400, samesite="Lax", httponly=True)
    else:
        response.delete_cookie("chat_tier")
    return response


def _safe_next(request: HttpRequest) -> str:
    target = request.POST.get("next", "/")
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return "/"


def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("chat:home")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("chat:home")
    return render(request, "registration/signup.html", {"form": form})

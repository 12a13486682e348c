"""The user's settings page (custom instructions) and a conversation's own settings (its
system prompt): both sent upstream as the first `system` message."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.backends.utils import csrf_input
from django.views.decorators.http import require_http_methods, require_POST

from chat.forms import InstructionsForm, SystemPromptForm
from chat.menus import conversation_settings_html
from chat.models import Conversation, Preferences
from chat.tiers.picker import pick, with_choices
from chat.tiers.policy import TierDecision


@login_required
@require_http_methods(["GET", "POST"])
def user_settings(request: HttpRequest) -> HttpResponse:
    """GET/POST /settings/: the user's custom instructions."""
    user_id = int(request.user.pk or 0)
    saved = False
    if request.method == "POST":
        form = InstructionsForm(request.POST)
        if form.is_valid():
            Preferences.objects.update_or_create(
                user_id=user_id, defaults={"instructions": form.cleaned_data["instructions"]}
            )
            saved = True
        status = 200 if saved else 400
    else:
        current = (
            Preferences.objects.filter(user_id=user_id)
            .values_list("instructions", flat=True)
            .first()
        )
        form = InstructionsForm(initial={"instructions": current or ""})
        status = 200
    return render(request, "chat/settings.html", {"form": form, "saved": saved}, status=status)


@login_required
@require_POST
def conversation_settings(request: HttpRequest, conversation_id: str) -> HttpResponse:
    """POST /c/<id>/settings/: the conversation's system prompt (404: not the user's)."""
    conv = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    form = SystemPromptForm(request.POST)
    if form.is_valid():
        conv.system_prompt = form.cleaned_data["system_prompt"]
        conv.save(update_fields=["system_prompt"])
    if not request.htmx:  # type: ignore[attr-defined]
        return redirect(conv) if form.is_valid() else HttpResponse(status=400)
    html = conversation_settings_html(
        conv,
        csrf=csrf_input(request),
        value=form["system_prompt"].value() or "",
        errors=[str(error) for error in form.errors.get("system_prompt", [])],
        saved=form.is_valid(),
    )
    return HttpResponse(html, status=200 if form.is_valid() else 400)


@login_required
@require_POST
def conversation_model(request: HttpRequest, conversation_id: str) -> HttpResponse:
    """POST /c/<id>/model/ (field `model`): the model picked in the composer for this
    conversation, remembered as soon as it is picked, not only with the next prompt (a reload
    or a visit later shows it). Only a model this device and plan may pick (400 otherwise, as
    a prompt naming it would get); 404 for anyone but the owner."""
    conv = get_object_or_404(Conversation, id=conversation_id, user=request.user)
    tier: TierDecision | None = getattr(request, "tier", None)
    if tier is None:
        return HttpResponse("No model can be picked here.", status=400)
    try:
        model = pick(request.POST.get("model", ""), with_choices(tier, request.user))
    except LookupError:
        return HttpResponse("That model is not available to you here.", status=400)
    if model is None:
        return HttpResponse("Pick a model.", status=400)
    Conversation.objects.filter(pk=conv.pk).update(model=model)
    return HttpResponse(status=204)

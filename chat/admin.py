"""The Django admin: plans and quotas, usage with charts, model tiers, device rules, chats."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from django.contrib import admin, messages
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

# The users' and plans' admin (registered when imported): a room of its own.
from chat import admin_users  # noqa: F401
from chat.models import (
    Conversation,
    DeviceRule,
    Feedback,
    Message,
    ModelTier,
    PickableModel,
    Usage,
)
from chat.ops.tier_check import LISTED_CACHE_SECONDS, served_models, try_tier
from chat.rendering import render_markdown
from chat.tiers.policy import FULL, LITE, load_policy
from chat.upstream.client import UpstreamError


@admin.register(Usage)
class UsageAdmin(admin.ModelAdmin):
    list_display = (
        "day",
        "user",
        "model",
        "usage_chosen_by",
        "requests",
        "prompt_tokens",
        "completion_tokens",
    )
    list_filter = ("tier", "model", "day")
    search_fields = ("user__username",)
    date_hierarchy = "day"
    readonly_fields = [f.name for f in Usage._meta.fields]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Usage]:
        # A usage row counts a day's answers by model and device tier; whether their model was
        # picked is the answers' (Message.picked): one subquery for the page, none per row.
        picked = Message.objects.filter(
            conversation__user_id=OuterRef("user_id"),
            created_at__date=OuterRef("day"),
            model=OuterRef("model"),
            tier=OuterRef("tier"),
            picked=True,
        )
        return super().get_queryset(request).annotate(_picked=Exists(picked))

    @admin.display(description="chosen by", ordering="tier")
    def usage_chosen_by(self, obj: Any) -> str:
        return chosen_by(obj._picked, obj.tier)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


def chosen_by(picked: bool, tier: str) -> str:
    """Who chose an answer's model, in place of a bare tier beside it ("full" beside
    demo-lite read as if the full tier's model were demo-lite)."""
    if not tier:
        return ""
    return f"picked (on the {tier} tier)" if picked else f"the {tier} tier"


@admin.register(ModelTier)
class ModelTierAdmin(admin.ModelAdmin):
    list_display = ("tier", "model", "max_tokens", "temperature")
    actions = ["try_tiers"]

    # permissions=["change"]: a test answer costs the model server's time and tokens; a
    # view-only staff user may not spend them.
    @admin.action(
        description="Test the selected tiers: stream a one-line answer", permissions=["change"]
    )
    def try_tiers(self, request: HttpRequest, queryset: QuerySet[ModelTier]) -> None:
        for tier in queryset:
            result = async_to_sync(try_tier)(tier.model, tier.temperature)
            took = f"{result.seconds:.1f} s"
            if result.ok:
                # The answer's first line is model output: markdown, and hostile. It is shown
                # as the chat shows answers, through the one renderer and sanitiser.
                answer = mark_safe(render_markdown(result.line))
                self.message_user(
                    request,
                    format_html(
                        '{} tier ({}) answered in {}: <div class="tier-answer">{}</div>',
                        tier.get_tier_display(),
                        tier.model,
                        took,
                        answer,
                    ),
                )
            else:
                self.message_user(
                    request,
                    f"{tier.get_tier_display()} tier ({tier.model}) did not answer: {result.line}.",
                    messages.ERROR,
                )

    def warn_of_unlisted_models(self, request: HttpRequest, tiers: list[ModelTier]) -> None:
        """A tier naming a model the model server does not list fails every answer: say so
        where the tier is edited. The list is kept for LISTED_CACHE_SECONDS: a model server
        that is down or hung holds one view for at most LIST_SECONDS, not every one."""
        try:
            listed = set(async_to_sync(served_models)())
        except UpstreamError as exc:
            self.message_user(
                request,
                f"Could not check the tiers' models: {exc.message} (GET /v1/models; asked "
                f"again after {LISTED_CACHE_SECONDS} s).",
                messages.WARNING,
            )
            return
        for tier in tiers:
            if tier.model not in listed:
                offered = ", ".join(sorted(listed)) or "none"
                self.message_user(
                    request,
                    f"The {tier.get_tier_display().lower()} tier's model “{tier.model}” is not "
                    f"one the model server lists (it lists: {offered}): its answers will fail.",
                    messages.WARNING,
                )

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        if request.method == "GET":
            self.warn_of_unlisted_models(request, list(ModelTier.objects.all()))
        return super().changelist_view(request, extra_context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        if request.method == "GET":
            tier = self.get_object(request, object_id)
            if tier is not None:
                self.warn_of_unlisted_models(request, [tier])
        return super().change_view(request, object_id, form_url, extra_context)


@admin.register(PickableModel)
class PickableModelAdmin(admin.ModelAdmin):
    """The models users may pick in the composer, besides their device tier's default."""

    list_display = ("label", "model", "plan_names", "phones", "enabled", "order")
    list_editable = ("phones", "enabled", "order")
    filter_horizontal = ("plans",)
    # Above the list: the tier models users are offered anyway (an empty list is no dropdown
    # of nothing, and an admin should not have to guess that).
    change_list_template = "admin/chat/pickablemodel/change_list.html"

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        policy = load_policy()
        offered = {
            "full_model": policy.model_for(FULL).model,
            "lite_model": policy.model_for(LITE).model,
            "none_listed": not PickableModel.objects.exists(),
        }
        return super().changelist_view(request, {**(extra_context or {}), **offered})

    def get_queryset(self, request: HttpRequest) -> QuerySet[PickableModel]:
        return super().get_queryset(request).prefetch_related("plans")

    @admin.display(description="Plans")
    def plan_names(self, obj: PickableModel) -> str:
        return ", ".join(plan.name for plan in obj.plans.all()) or "every plan"


@admin.register(DeviceRule)
class DeviceRuleAdmin(admin.ModelAdmin):
    list_display = ("order", "signal", "value", "tier", "enabled", "note")
    list_editable = ("order", "enabled", "tier")
    list_display_links = ("signal",)


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    can_delete = False
    fields = (
        "mid",
        "role",
        "status",
        "model",
        "message_chosen_by",
        "completion_tokens",
        "created_at",
    )
    readonly_fields = fields
    show_change_link = True

    @admin.display(description="chosen by")
    def message_chosen_by(self, obj: Message) -> str:
        return chosen_by(obj.picked, obj.tier)


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "user", "updated_at")
    search_fields = ("title", "user__username")
    list_select_related = ("user",)
    raw_id_fields = ("user",)
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = (
        "mid",
        "role",
        "status",
        "model",
        "message_chosen_by",
        "completion_tokens",
        "ttft_ms",
    )
    list_filter = ("status", "role", "tier", "picked")
    search_fields = ("mid",)
    raw_id_fields = ("conversation",)
    readonly_fields = ("mid", "owner", "lease_until", "created_at", "finished_at")

    @admin.display(description="chosen by", ordering="picked")
    def message_chosen_by(self, obj: Message) -> str:
        return chosen_by(obj.picked, obj.tier)


@admin.register(Feedback)
class FeedbackAdmin(admin.ModelAdmin):
    """People's 👍/👎 on answers: read by model, tier and day; a link to the conversation to see
    the answer in its place. Votes are the users': admins read and may delete, never write."""

    list_display = (
        "vote",
        "short_comment",
        "answer_model",
        "answer_tier",
        "user",
        "conversation",
        "updated_at",
    )
    list_filter = (
        "vote",
        ("message__model", admin.AllValuesFieldListFilter),
        "message__tier",
        ("updated_at", admin.DateFieldListFilter),
    )
    date_hierarchy = "updated_at"
    search_fields = ("comment", "message__mid", "user__username")
    list_select_related = ("message", "message__conversation", "user")
    fields = ("vote", "comment", "message", "user", "conversation", "created_at", "updated_at")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="comment")
    def short_comment(self, obj: Feedback) -> str:
        return obj.comment if len(obj.comment) <= 80 else obj.comment[:79] + "…"

    @admin.display(description="model", ordering="message__model")
    def answer_model(self, obj: Feedback) -> str:
        return obj.message.model

    @admin.display(description="tier", ordering="message__tier")
    def answer_tier(self, obj: Feedback) -> str:
        return obj.message.tier

    @admin.display(description="conversation")
    def conversation(self, obj: Feedback) -> SafeString:
        conversation = obj.message.conversation
        url = reverse("admin:chat_conversation_change", args=[conversation.pk])
        return format_html('<a href="{}">{}</a>', url, conversation.title)

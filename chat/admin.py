"""The Django admin: plans and quotas, usage with charts, model tiers, device rules, chats."""

from __future__ import annotations

from datetime import date
from typing import Any

from asgiref.sync import async_to_sync
from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.db.models import F, IntegerField, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils.safestring import mark_safe

from chat.models import Conversation, DeviceRule, Message, ModelTier, Plan, Quota, Usage
from chat.ratelimit import get_limiter, resolve_limits
from chat.usage import daily_series, usage_svg

User = get_user_model()


def _tokens_today_subquery() -> Subquery:
    return Subquery(
        Usage.objects.filter(user=OuterRef("pk"), day=date.today())
        .values("user")
        .annotate(t=Sum(F("prompt_tokens") + F("completion_tokens")))
        .values("t"),
        output_field=IntegerField(),
    )


class PlanActionForm(ActionForm):
    plan = forms.ModelChoiceField(queryset=Plan.objects.all(), required=False, label="Plan")


class QuotaInline(admin.StackedInline):
    model = Quota
    can_delete = False
    extra = 0
    max_num = 1
    verbose_name_plural = "Plan and quota overrides (blank = from the plan)"


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "rate_limit",
        "daily_tokens",
        "max_concurrent_streams",
        "allow_full_on_mobile",
        "is_default",
    )
    list_editable = ("is_default",)


admin.site.unregister(User)


@admin.register(User)
class ChatUserAdmin(DjangoUserAdmin):
    inlines = [QuotaInline]
    action_form = PlanActionForm
    actions = ["assign_plan", "reset_today"]
    list_display = (
        "username",
        "email",
        "is_active",
        "is_staff",
        "plan_name",
        "tokens_today",
        "remaining_today",
    )
    list_filter = ("is_staff", "is_active", "quota__plan")
    change_form_template = "admin/auth/user/change_form_usage.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return (
            super()
            .get_queryset(request)
            .select_related("quota__plan")
            .annotate(_tokens_today=Coalesce(_tokens_today_subquery(), 0))
        )

    @admin.display(description="Plan", ordering="quota__plan__name")
    def plan_name(self, obj: Any) -> str:
        quota = getattr(obj, "quota", None)
        if quota is not None and quota.plan is not None:
            return str(quota.plan.name)
        return "default"

    @admin.display(description="Tokens today", ordering="_tokens_today")
    def tokens_today(self, obj: Any) -> int:
        return int(obj._tokens_today)

    @admin.display(description="Left today")
    def remaining_today(self, obj: Any) -> str:
        limits = resolve_limits(obj.pk)
        if not limits.daily_tokens:
            return "unlimited"
        return f"{max(0, limits.daily_tokens - int(obj._tokens_today)):,}"

    @admin.action(description="Put the selected users on the chosen plan")
    def assign_plan(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        plan_id = request.POST.get("plan")
        plan = Plan.objects.filter(pk=plan_id).first() if plan_id else None
        if plan is None:
            self.message_user(request, "Choose a plan first.", messages.WARNING)
            return
        for user in queryset:
            Quota.objects.update_or_create(user=user, defaults={"plan": plan})
        self.message_user(request, f"{queryset.count()} users moved to {plan.name}.")

    @admin.action(description="Reset today's token usage of the selected users")
    def reset_today(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        limiter_reset = async_to_sync(_reset_many)
        ids = list(queryset.values_list("pk", flat=True))
        Usage.objects.filter(user_id__in=ids, day=date.today()).delete()
        limiter_reset(ids)
        self.message_user(request, f"Today's usage reset for {len(ids)} users.")

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        extra_context = extra_context or {}
        try:
            user_id = int(object_id)
        except ValueError:
            user_id = None
        if user_id is not None:
            series = daily_series(user_id, 30)
            extra_context["usage_chart"] = mark_safe(
                usage_svg(series, title="Tokens per day, last 30 days")
            )
            extra_context["usage_by_tier"] = (
                Usage.objects.filter(user_id=user_id)
                .values("tier", "model")
                .annotate(
                    requests=Sum("requests"),
                    tokens=Sum(F("prompt_tokens") + F("completion_tokens")),
                )
                .order_by("tier", "model")
            )
        return super().change_view(request, object_id, form_url, extra_context)


async def _reset_many(user_ids: list[int]) -> None:
    limiter = get_limiter()
    for user_id in user_ids:
        await limiter.reset_today(user_id)


@admin.register(Usage)
class UsageAdmin(admin.ModelAdmin):
    list_display = (
        "day",
        "user",
        "tier",
        "model",
        "requests",
        "prompt_tokens",
        "completion_tokens",
    )
    list_filter = ("tier", "model", "day")
    search_fields = ("user__username",)
    date_hierarchy = "day"
    readonly_fields = [f.name for f in Usage._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(ModelTier)
class ModelTierAdmin(admin.ModelAdmin):
    list_display = ("tier", "model", "max_tokens", "temperature")


@admin.register(DeviceRule)
class DeviceRuleAdmin(admin.ModelAdmin):
    list_display = ("order", "signal", "value", "tier", "enabled", "note")
    list_editable = ("order", "enabled", "tier")
    list_display_links = ("signal",)


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    can_delete = False
    fields = ("mid", "role", "status", "model", "tier", "completion_tokens", "created_at")
    readonly_fields = fields
    show_change_link = True


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("title", "user", "updated_at")
    search_fields = ("title", "user__username")
    list_select_related = ("user",)
    raw_id_fields = ("user",)
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("mid", "role", "status", "model", "tier", "completion_tokens", "ttft_ms")
    list_filter = ("status", "role", "tier")
    search_fields = ("mid",)
    raw_id_fields = ("conversation",)
    readonly_fields = ("mid", "owner", "lease_until", "created_at", "finished_at")

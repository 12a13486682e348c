"""The admin's users and plans: each user's plan, usage today and limits in force, each plan's
limits as the limiter applies them, and the actions on users (chat/admin.py imports this)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.db.models import F, IntegerField, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils.safestring import mark_safe

from chat.limits.limiter import get_limiter
from chat.limits.plans import daily_tokens_of, resolve_limits
from chat.limits.rates import describe_rate, parse_rate
from chat.limits.usage import daily_series, record_resets, today, usage_svg
from chat.models import Plan, Preferences, Quota, Usage, UsageReset

User = get_user_model()


def _tokens_today_subquery() -> Subquery:
    return Subquery(
        Usage.objects.filter(user=OuterRef("pk"), day=today())
        .values("user")
        .annotate(t=Sum(F("prompt_tokens") + F("completion_tokens")))
        .values("t"),
        output_field=IntegerField(),
    )


def _forgiven_today_subquery() -> Subquery:
    # What admins' resets forgave of today's history: the history stays, the quota counts less.
    return Subquery(
        UsageReset.objects.filter(user=OuterRef("pk"), day=today())
        .values("user")
        .annotate(t=Sum("tokens"))
        .values("t"),
        output_field=IntegerField(),
    )


class PlanActionForm(ActionForm):
    plan = forms.ModelChoiceField(queryset=Plan.objects.all(), required=False, label="Plan")


class PreferencesInline(admin.StackedInline):
    model = Preferences
    can_delete = False
    extra = 0
    max_num = 1
    # With max_num = 1 Django heads the section with verbose_name (not the plural).
    verbose_name = "custom instructions (the user's own, from /settings/)"
    template = "admin/chat/edit_inline/single_stacked.html"


class QuotaInline(admin.StackedInline):
    """The user's plan and personal limits, under the limits in force now (the change view
    puts `limits_in_force` in the page's context)."""

    model = Quota
    can_delete = False
    # One form even for a user without a Quota: an untouched one saves nothing.
    extra = 1
    max_num = 1
    # The section's heading; its template says what a blank field means, and has no per-form
    # heading ("…: #1"): there is only ever one form.
    verbose_name = "plan and personal limits"
    template = "admin/chat/quota/limits_inline.html"


def limits_in_force(user_id: int) -> str:
    """The limits the limiter applies to the user now, in words, with where they come from."""
    limits = resolve_limits(user_id)
    rates = " and ".join(describe_rate(item) for item in parse_rate(limits.rate))
    tokens = (
        f"{limits.daily_tokens:,} tokens a day" if limits.daily_tokens else "no daily token quota"
    )
    streams = f"{limits.max_streams} {'answer' if limits.max_streams == 1 else 'answers'} at a time"
    plan = f"plan {limits.plan}" if limits.plan != "default" else "the CHAT_* settings (no plan)"
    return f"{rates}; {tokens}; {streams}. From {plan} and this user's overrides."


admin.site.unregister(User)


@admin.register(User)
class ChatUserAdmin(DjangoUserAdmin):
    inlines = [QuotaInline, PreferencesInline]
    action_form = PlanActionForm
    actions = ["assign_plan", "reset_today"]
    # Short headings and no e-mail column (the search finds e-mail addresses): the whole list
    # fits beside the admin's sidebar and filters at 1280 px.
    list_display = (
        "username",
        "active",
        "staff",
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
            .annotate(
                _tokens_today=Coalesce(_tokens_today_subquery(), 0),
                _forgiven_today=Coalesce(_forgiven_today_subquery(), 0),
                # The default plan's quota on every row: the list costs no query per row.
                _default_daily_tokens=Subquery(
                    Plan.objects.filter(is_default=True).order_by("id").values("daily_tokens")[:1]
                ),
                _default_plan_name=Subquery(
                    Plan.objects.filter(is_default=True).order_by("id").values("name")[:1]
                ),
            )
        )

    @admin.display(description="Active", boolean=True, ordering="is_active")
    def active(self, obj: Any) -> bool:
        return bool(obj.is_active)

    @admin.display(description="Staff", boolean=True, ordering="is_staff")
    def staff(self, obj: Any) -> bool:
        return bool(obj.is_staff)

    @admin.display(description="Plan", ordering="quota__plan__name")
    def plan_name(self, obj: Any) -> str:
        quota = getattr(obj, "quota", None)
        if quota is not None and quota.plan is not None:
            return str(quota.plan.name)
        # The plan the limiter applies: the default plan by its name, as the plan list shows it.
        if obj._default_plan_name:
            return f"{obj._default_plan_name} (default)"
        return "none (settings)"

    @admin.display(description="Used today", ordering="_tokens_today")
    def tokens_today(self, obj: Any) -> int:
        return int(obj._tokens_today)

    @admin.display(description="Left today")
    def remaining_today(self, obj: Any) -> str:
        daily = daily_tokens_of(getattr(obj, "quota", None), obj._default_daily_tokens)
        if not daily:
            return "unlimited"
        counted = max(0, int(obj._tokens_today) - int(obj._forgiven_today))
        return f"{max(0, daily - counted):,}"

    # permissions=["change"]: without it an action runs for anyone who can see the list,
    # view-only staff included (docs/security.md).
    @admin.action(description="Put the selected users on the chosen plan", permissions=["change"])
    def assign_plan(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        plan_id = request.POST.get("plan")
        plan = Plan.objects.filter(pk=plan_id).first() if plan_id else None
        if plan is None:
            self.message_user(request, "Choose a plan first.", messages.WARNING)
            return
        for user in queryset:
            Quota.objects.update_or_create(user=user, defaults={"plan": plan})
        self.message_user(request, f"{queryset.count()} users moved to {plan.name}.")

    @admin.action(
        description="Reset today's token usage of the selected users", permissions=["change"]
    )
    def reset_today(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        """Give the users today's quota back. Nothing is deleted: the limiter records an
        allowance beside its count and a UsageReset row forgives the day's history, so the
        usage charts keep the day."""
        ids = list(queryset.values_list("pk", flat=True))
        forgiven = async_to_sync(_reset_many)(ids)
        reset = [user_id for user_id in ids if forgiven[user_id] is not None]
        record_resets(reset, by=request.user.pk)
        if reset:
            self.message_user(
                request,
                f"Today's token usage reset for {len(reset)} users: they have their whole "
                "daily quota again. Their usage history and charts keep today.",
            )
        if len(reset) < len(ids):
            self.message_user(
                request,
                f"{len(ids) - len(reset)} users could not be reset: the limits storage "
                "(Redis) is unavailable. Try again in a moment.",
                messages.ERROR,
            )

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
            extra_context["limits_in_force"] = limits_in_force(user_id)
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


async def _reset_many(user_ids: list[int]) -> dict[int, int | None]:
    """Each user's tokens forgiven by the limiter (None: its storage could not be reached)."""
    limiter = get_limiter()
    return {user_id: await limiter.reset_today(user_id) for user_id in user_ids}


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    """Plans, each limit shown as it is in force: a blank field says whose value applies
    (the default plan's, else the CHAT_* setting's), as `limits_of` resolves it."""

    list_display = (
        "name",
        "rate_in_force",
        "daily_tokens_in_force",
        "streams_in_force",
        "allow_full_on_mobile",
        "full_model_allowed",
        "is_default",
    )
    list_editable = ("is_default",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Plan]:
        # The default plan's limits on every row: the list costs no query per row.
        default = Plan.objects.filter(is_default=True).order_by("id")
        return (
            super()
            .get_queryset(request)
            .annotate(
                _default_rate=Subquery(default.values("rate_limit")[:1]),
                _default_daily=Subquery(default.values("daily_tokens")[:1]),
                _default_streams=Subquery(default.values("max_concurrent_streams")[:1]),
            )
        )

    @admin.display(description="rate limit", ordering="rate_limit")
    def rate_in_force(self, obj: Any) -> str:
        return _in_force(
            obj.rate_limit.strip(), (obj._default_rate or "").strip(), settings.CHAT_RATE_LIMIT, str
        )

    @admin.display(description="daily tokens", ordering="daily_tokens")
    def daily_tokens_in_force(self, obj: Any) -> str:
        return _in_force(obj.daily_tokens, obj._default_daily, settings.CHAT_DAILY_TOKENS, _tokens)

    @admin.display(description="concurrent streams", ordering="max_concurrent_streams")
    def streams_in_force(self, obj: Any) -> str:
        return _in_force(
            obj.max_concurrent_streams,
            obj._default_streams,
            settings.CHAT_MAX_CONCURRENT_STREAMS,
            str,
        )


def _tokens(daily: int) -> str:
    return f"{daily:,}" if daily else "unlimited"


def _in_force(own: Any, default_plans: Any, setting: Any, show: Callable[[Any], str]) -> str:
    """A plan's limit as the limiter applies it: its own; blank, the default plan's; blank
    there too, the setting's (chat.limits.plans.limits_of)."""
    if own not in (None, ""):
        return show(own)
    if default_plans not in (None, ""):
        return f"default plan's ({show(default_plans)})"
    return f"default ({show(setting)})"

"""The model picker: which models a user may pick on this device (the tier's default first),
from the tier policy, the user's plan and the admin's PickableModel rows."""

from __future__ import annotations

import dataclasses
from typing import Any

from channels.db import database_sync_to_async
from django.db.models import Exists, OuterRef, Q

from chat.models import Plan, Quota
from chat.tiers.policy import (
    FULL,
    LITE,
    PLAN_REASON,
    Policy,
    TierDecision,
    aload_policy,
    load_policy,
)


def _plan_of(user: Any) -> int | None:
    """The user's plan: their Quota's, else the default plan (None: no plan at all)."""
    if user is None or not user.is_authenticated:
        return None
    own = Quota.objects.filter(user_id=user.pk, plan_id=OuterRef("pk"))
    plan_id: int | None = (
        Plan.objects.annotate(own=Exists(own))
        .filter(Q(own=True) | Q(is_default=True))
        .order_by("-own", "name")
        .values_list("pk", flat=True)
        .first()
    )
    return plan_id


def _needs_plan(policy: Policy) -> bool:
    return any(p.plans for p in policy.pickable)


def choices(
    decision: TierDecision, policy: Policy, plan_id: int | None
) -> tuple[tuple[str, str], ...]:
    """(id, label) of every model this connection may pick, the tier's default first.

    Besides the admin's rows: the lite tier's model for anyone on full (anyone may pick the
    cheaper model), and the full tier's model on a phone when the plan allows full on mobile
    (`can_choose`), as the tier toggle already allows.
    """
    labels = {p.model: p.label for p in policy.pickable}
    picked: dict[str, str] = {}

    def offer(model: str) -> None:
        if model and model not in picked:
            picked[model] = labels.get(model, model)

    offer(decision.model)
    if decision.tier == FULL:
        offer(policy.model_for(LITE).model)
    elif decision.can_choose:
        offer(policy.model_for(FULL).model)
    # A plan that forbids the full model (Plan.full_model_allowed) forbids it in the picker too.
    forbidden = policy.model_for(FULL).model if decision.reason == PLAN_REASON else None
    for pickable in policy.pickable:
        if pickable.model == forbidden:
            continue
        if pickable.plans and plan_id not in pickable.plans:
            continue
        if decision.mobile and not pickable.phones:
            continue
        offer(pickable.model)
    return tuple(picked.items())


def with_choices(decision: TierDecision, user: Any) -> TierDecision:
    """The decision with the models this user may pick (sync: may query the user's plan)."""
    policy = load_policy()
    plan_id = _plan_of(user) if _needs_plan(policy) else None
    return dataclasses.replace(decision, models=choices(decision, policy, plan_id))


async def awith_choices(decision: TierDecision, user: Any) -> TierDecision:
    """with_choices for async code: no thread hop unless a plan must be read."""
    policy = await aload_policy()
    plan_id = None
    if _needs_plan(policy):
        # scope["user"] may be lazy: touched only inside the sync thread.
        plan_id = await database_sync_to_async(_plan_of)(user)
    return dataclasses.replace(decision, models=choices(decision, policy, plan_id))


def pick(requested: str | None, decision: TierDecision) -> str | None:
    """The requested model if this connection may pick it; None when none was requested.

    Raises LookupError for a model that is not allowed (it is never sent upstream).
    """
    if not requested:
        return None
    allowed = {model for model, _label in decision.models} or {decision.model}
    if requested not in allowed:
        raise LookupError(requested)
    return requested

"""The device tier policy: a request's signals → its tier (rules edited in the admin) → the model
that answers; cached per process, with the adapters' entry points."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError
from django.db.models import Exists, OuterRef, Q
from django.http import HttpRequest

from chat.models import DeviceRule, ModelTier, PickableModel, Plan, Quota, Tier
from chat.tiers.devices import BOT, DESKTOP, PHONE, TABLET, UNKNOWN, device_class
from chat.tiers.hints import (
    Signals,
    normalise_ch_mobile,
    normalise_ect,
    normalise_save_data,
    signals_from_headers,
    signals_from_scope,
)

logger = logging.getLogger("chat.tiers")

FULL = Tier.FULL.value
LITE = Tier.LITE.value
CHOICE_REASON = "your choice on this device"
POLICY_TTL_SECONDS = 2.0


@dataclass(frozen=True)
class Rule:
    """One enabled DeviceRule, its value normalised the way the signal is."""

    signal: str
    value: str
    tier: str

    @classmethod
    def of(cls, signal: str, value: str, tier: str) -> Rule:
        # Normalise what an admin typed ("ON", " 2G", "phone ") the same way as the headers.
        normalised: str | None
        if signal == DeviceRule.Signal.CH_MOBILE:
            normalised = normalise_ch_mobile(value)
        elif signal == DeviceRule.Signal.SAVE_DATA:
            normalised = normalise_save_data(value)
        elif signal == DeviceRule.Signal.ECT:
            normalised = normalise_ect(value)
        else:
            normalised = value.strip().lower()
        # A value that can never match (e.g. save_data=off) stays unmatched, not an error.
        return cls(signal=signal, value=normalised or f"<never:{value}>", tier=tier)

    def matches(self, signals: Signals, device: str) -> bool:
        if self.signal == DeviceRule.Signal.DEVICE:
            return device == self.value
        if self.signal == DeviceRule.Signal.CH_MOBILE:
            return signals.ch_mobile == self.value
        if self.signal == DeviceRule.Signal.SAVE_DATA:
            return signals.save_data == self.value
        if self.signal == DeviceRule.Signal.ECT:
            return signals.ect == self.value
        return False

    def reason(self, device: str) -> str:
        """Short text for the badge's tooltip: why this tier."""
        if self.signal == DeviceRule.Signal.SAVE_DATA:
            return "data saver is on"
        if self.signal == DeviceRule.Signal.ECT:
            return (
                f"slow network ({self.value})" if self.tier == LITE else f"network ({self.value})"
            )
        if self.signal == DeviceRule.Signal.CH_MOBILE:
            if self.value == "?1":
                return "mobile browser (client hint)"
            return "not a mobile browser (client hint)"
        return _device_reason(device)


def _device_reason(device: str) -> str:
    return "unknown device" if device == UNKNOWN else device


@dataclass(frozen=True)
class TierModel:
    model: str
    max_tokens: int | None = None
    temperature: float | None = None


# The ARCHITECTURE §5 defaults. Client hints come before the UA because the browser knows what
# it is and the UA string is a guess; Save-Data and ECT come first because they say lite
# whatever the device. `?0` sits just above the phone rule, the only UA class it contradicts;
# tablets and desktops agree with `?0`, so their own rules go first and an admin who edits
# them (say tablets → lite) also catches Chrome on Android tablets, which sends `?0`.
# chat/migrations/0002_seed_tiers.py seeds the same rows (a migration keeps its own copy).
DEFAULT_RULES: tuple[tuple[int, str, str, str], ...] = (
    (10, "save_data", "on", LITE),
    (20, "ect", "slow-2g", LITE),
    (30, "ect", "2g", LITE),
    (40, "ch_mobile", "?1", LITE),
    (50, "device", TABLET, FULL),
    (60, "device", DESKTOP, FULL),
    (70, "ch_mobile", "?0", FULL),
    (80, "device", PHONE, LITE),
    (90, "device", BOT, FULL),
    (100, "device", UNKNOWN, FULL),
)


def _settings_models() -> dict[str, TierModel]:
    return {
        FULL: TierModel(model=settings.CHAT_MODEL_FULL),
        LITE: TierModel(model=settings.CHAT_MODEL_LITE),
    }


@dataclass(frozen=True)
class Pickable:
    """A model an admin lets users pick (PickableModel): for which plans (empty: all), and
    whether phones may pick it."""

    model: str
    label: str
    plans: frozenset[int] = frozenset()
    phones: bool = False


@dataclass(frozen=True)
class Policy:
    """The ordered enabled rules (first match decides; none → full), the tier → model map and
    the models users may pick."""

    rules: tuple[Rule, ...]
    models: Mapping[str, TierModel]
    pickable: tuple[Pickable, ...] = ()

    @classmethod
    def default(cls) -> Policy:
        """The ARCHITECTURE defaults, models from the CHAT_MODEL_* settings; no database."""
        rules = tuple(Rule.of(signal, value, tier) for _, signal, value, tier in DEFAULT_RULES)
        return cls(rules=rules, models=MappingProxyType(_settings_models()))

    def model_for(self, tier: str) -> TierModel:
        return self.models.get(tier) or _settings_models()[tier]

    def match(self, signals: Signals) -> tuple[str, str, str]:
        """(tier, reason, device) by the rules alone, before the user's choice."""
        device = device_class(signals.user_agent)
        for rule in self.rules:
            if rule.matches(signals, device):
                return rule.tier, rule.reason(device), device
        return FULL, _device_reason(device), device


@dataclass(frozen=True)
class TierDecision:
    tier: str
    model: str
    device: str
    reason: str
    max_tokens: int | None
    temperature: float | None
    can_choose: bool
    # The rules said lite (a phone, data saver, a slow network): models not allowed on phones
    # are not offered. `models` are the (id, label) pairs this connection may pick, the
    # default first (chat.tiers.picker).
    mobile: bool = False
    models: tuple[tuple[str, str], ...] = ()

    @property
    def why(self) -> str:
        """The reason as a sentence for the badge and its popover: a bare "Why: phone." read
        like a label, not an explanation (new-user review)."""
        return why_sentence(self.reason)


# What each device class looks like in a sentence ("this looks like a phone").
_DEVICE_WORDS = {
    PHONE: "a phone",
    TABLET: "a tablet",
    DESKTOP: "a desktop or laptop computer",
    BOT: "an automated client, not a browser",
}


def why_sentence(reason: str) -> str:
    """The sentence for the short `reason` of a decision, e.g. "Chosen because this looks
    like a phone."."""
    if reason in _DEVICE_WORDS:
        return f"Chosen because this looks like {_DEVICE_WORDS[reason]}."
    if reason == _device_reason(UNKNOWN):
        return "Chosen because this device was not recognised: it gets the usual default."
    if reason == CHOICE_REASON:
        return "Chosen by you on this device."
    if reason == PLAN_REASON:
        return "Your plan answers with the lite model."
    if reason == "data saver is on":
        return "Chosen because data saver is on."
    if reason.startswith("slow network"):
        return f"Chosen because the network is slow{reason[len('slow network') :]}."
    if reason.startswith("network ("):
        return f"Chosen because of the network speed{reason[len('network') :]}."
    if reason.endswith("(client hint)"):
        says = "is not" if reason.startswith("not ") else "is"
        return f"Chosen because the browser says it {says} on a mobile device."
    return f"Chosen because: {reason}." if reason else ""


def decide(signals: Signals, policy: Policy, *, allow_full_on_mobile: bool = False) -> TierDecision:
    """The tier and model for these signals.

    The user's choice can always lower the tier (anyone may pick the cheaper model), and raise
    it from lite to full only when their plan allows full on mobile.
    """
    tier, reason, device = policy.match(signals)
    mobile = tier == LITE
    # The toggle is offered when switching is possible: down from full always, up from lite
    # only with the plan's permission.
    can_choose = tier == FULL or allow_full_on_mobile
    if signals.choice == LITE and tier == FULL:
        tier, reason = LITE, CHOICE_REASON
    elif signals.choice == FULL and tier == LITE and allow_full_on_mobile:
        tier, reason = FULL, CHOICE_REASON
    model = policy.model_for(tier)
    return TierDecision(
        tier=tier,
        model=model.model,
        device=device,
        reason=reason,
        max_tokens=model.max_tokens,
        temperature=model.temperature,
        can_choose=can_choose,
        mobile=mobile,
    )


PLAN_REASON = "your plan answers with the lite model"


def lite_only(decision: TierDecision, policy: Policy) -> TierDecision:
    """The decision for an account whose plan forbids the full model: lite on every device,
    nothing to choose. Device signals are the browser's word (a phone may send
    `Sec-CH-UA-Mobile: ?0` or a desktop User-Agent); a plan's "full model allowed: off" is ours.

    Always marked PLAN_REASON, also where the device was lite already: the picker
    (chat.tiers.picker.choices) withholds the full tier's model by that mark, and a phone on
    such a plan was offered (and answered by) the full model when an admin listed it as a
    pickable model (hostile review; tests/test_security_picker.py)."""
    # The admin's pickable models stay pickable; the full tier's model does not.
    full = policy.model_for(FULL).model
    models = tuple(m for m in decision.models if m[0] != full)
    if decision.tier == LITE and not decision.can_choose:
        return replace(decision, reason=PLAN_REASON, models=models)
    model = policy.model_for(LITE)
    return TierDecision(
        tier=LITE,
        model=model.model,
        device=decision.device,
        reason=PLAN_REASON,
        max_tokens=model.max_tokens,
        temperature=model.temperature,
        can_choose=False,
        mobile=decision.mobile,
        models=models,
    )


# --- the policy from the database, cached -----------------------------------------------------


@dataclass(frozen=True)
class _Cached:
    policy: Policy
    expires: float


_cache: _Cached | None = None
# Bumped on every invalidation, so a load that read the database before an admin's edit
# committed cannot put its stale result back into the cache.
_generation = 0
_cache_lock = threading.Lock()
# Indirection so tests can move time forward without sleeping.
_clock = time.monotonic


def _read_policy() -> Policy:
    rules = tuple(
        Rule.of(signal, value, tier)
        for signal, value, tier in DeviceRule.objects.filter(enabled=True)
        .order_by("order", "id")
        .values_list("signal", "value", "tier")
    )
    models = _settings_models()
    for row in ModelTier.objects.all():
        models[row.tier] = TierModel(row.model, row.max_tokens, row.temperature)
    pickable = tuple(
        Pickable(row.model, row.label, frozenset(p.pk for p in row.plans.all()), row.phones)
        for row in PickableModel.objects.filter(enabled=True).prefetch_related("plans")
    )
    return Policy(rules=rules, models=MappingProxyType(models), pickable=pickable)


def _fresh_cached() -> Policy | None:
    cached = _cache
    if cached is not None and _clock() < cached.expires:
        return cached.policy
    return None


def load_policy() -> Policy:
    """The policy from DeviceRule and ModelTier (sync), cached for POLICY_TTL_SECONDS.

    Saving or deleting a rule or a model tier drops this process's cache at once; other
    processes see the edit when their cache expires.
    """
    global _cache
    policy = _fresh_cached()
    if policy is not None:
        return policy
    generation = _generation
    try:
        policy = _read_policy()
    except DatabaseError:
        # No tables yet (before migrate) or the database is away: the built-in defaults keep
        # the chat usable; the short TTL retries soon.
        logger.exception("could not read the tier policy; using the defaults")
        policy = Policy.default()
    with _cache_lock:
        if generation == _generation:
            _cache = _Cached(policy, _clock() + POLICY_TTL_SECONDS)
    return policy


async def aload_policy() -> Policy:
    """load_policy for async code: no thread hop while the cache is fresh."""
    policy = _fresh_cached()
    if policy is not None:
        return policy
    # database_sync_to_async closes stale connections around the query; a websocket has no
    # request_finished to do it.
    return await database_sync_to_async(load_policy)()


def clear_policy_cache() -> None:
    global _cache, _generation
    with _cache_lock:
        _cache = None
        _generation += 1


def _plan_allows_full_on_mobile(user: Any) -> bool:
    """Whether the user's plan (their Quota's, else the default plan) allows full on mobile."""
    if user is None or not user.is_authenticated:
        return False
    # One query, at most one row: the user's own plan sorts before the default plan.
    own = Quota.objects.filter(user_id=user.pk, plan_id=OuterRef("pk"))
    allowed = (
        Plan.objects.annotate(own=Exists(own))
        .filter(Q(own=True) | Q(is_default=True))
        .order_by("-own", "name")
        .values_list("allow_full_on_mobile", flat=True)
        .first()
    )
    return bool(allowed)


# --- the adapters' entry points ---------------------------------------------------------------


async def tier_for_request(
    request: HttpRequest, *, cookies: Mapping[str, str] | None = None
) -> TierDecision:
    """The tier for a Django request (the HTTP middleware's entry point).

    `cookies` replaces the request's own: the tier choice view asks what the tier is with
    the cookie it is about to set.
    """
    signals = signals_from_headers(request.headers, request.COOKIES if cookies is None else cookies)
    policy = await aload_policy()
    allow = False
    # The plan only matters when the rules say lite; most requests skip the query.
    if policy.match(signals)[0] == LITE:
        auser = getattr(request, "auser", None)
        user = await auser() if auser is not None else getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            allow = await sync_to_async(_plan_allows_full_on_mobile)(user)
    return decide(signals, policy, allow_full_on_mobile=allow)


async def tier_for_scope(scope: Mapping[str, Any]) -> TierDecision:
    """The tier for an ASGI websocket scope (the consumer middleware's entry point)."""
    signals = signals_from_scope(scope)
    policy = await aload_policy()
    allow = False
    if policy.match(signals)[0] == LITE:
        # scope["user"] may be a lazy object whose first attribute access hits the database,
        # so it is touched only inside the sync thread.
        allow = await database_sync_to_async(_plan_allows_full_on_mobile)(scope.get("user"))
    return decide(signals, policy, allow_full_on_mobile=allow)

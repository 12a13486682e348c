"""The device tier policy: request signals (User-Agent, client hints, choice) → tier → model."""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.signals import post_delete, post_save
from django.http import HttpRequest
from django.http.cookie import parse_cookie
from ua_parser import (
    BasicResolver,
    Domain,
    Parser,
    RegexResolver,
    load_builtins,
    load_lazy_builtins,
)

from chat.models import DeviceRule, ModelTier, Plan, Quota, Tier

logger = logging.getLogger(__name__)

FULL = Tier.FULL.value
LITE = Tier.LITE.value

PHONE = "phone"
TABLET = "tablet"
DESKTOP = "desktop"
BOT = "bot"
UNKNOWN = "unknown"
DEVICE_CLASSES = (PHONE, TABLET, DESKTOP, BOT, UNKNOWN)

# The per-device choice lives in a cookie, not the account: the same person may want the full
# model on a laptop and the lite one on a phone.
CHOICE_COOKIE = "chat_tier"
CHOICE_REASON = "your choice on this device"

# For the HTTP adapter. Sec-CH-UA-Mobile and Save-Data are sent without asking (where the browser
# supports them); ECT only after the origin asks for it with Accept-CH.
ACCEPT_CH = "Sec-CH-UA-Mobile, Save-Data, ECT"
VARY = ("User-Agent", "Sec-CH-UA-Mobile", "Save-Data", "ECT", "Cookie")

# Real User-Agents stay under ~500 characters; the cap bounds what a hostile client can make
# the parser (and the device_class cache) chew on.
MAX_USER_AGENT_LENGTH = 1024

POLICY_TTL_SECONDS = 2.0


# --- signals --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signals:
    """What a request tells us about its device, normalised (None = absent or unreadable)."""

    user_agent: str
    ch_mobile: str | None  # "?1" | "?0"
    save_data: str | None  # "on"
    ect: str | None  # "slow-2g" | "2g" | "3g" | "4g"
    choice: str | None  # "full" | "lite"


_ECT_VALUES = frozenset({"slow-2g", "2g", "3g", "4g"})


def _normalise_ch_mobile(value: str | None) -> str | None:
    # A structured-header boolean: exactly ?1 or ?0. Anything else is not a hint we can trust.
    if value is None:
        return None
    value = value.strip()
    return value if value in ("?1", "?0") else None


def _normalise_save_data(value: str | None) -> str | None:
    # `Save-Data: on` may carry parameters after a semicolon; only the first token counts.
    if value is None:
        return None
    return "on" if value.split(";", 1)[0].strip().lower() == "on" else None


def _normalise_ect(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().strip('"').lower()
    return value if value in _ECT_VALUES else None


def _normalise_choice(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().lower()
    return value if value in (FULL, LITE) else None


def signals_from_headers(headers: Mapping[str, str], cookies: Mapping[str, str]) -> Signals:
    """Signals from lower-case header names (Django's request.headers works too) and cookies."""
    # request.headers is case-insensitive, a plain dict is not: look names up lower-cased.
    lowered = {name.lower(): value for name, value in headers.items()}
    user_agent = lowered.get("user-agent") or ""
    return Signals(
        user_agent=user_agent.strip()[:MAX_USER_AGENT_LENGTH],
        ch_mobile=_normalise_ch_mobile(lowered.get("sec-ch-ua-mobile")),
        save_data=_normalise_save_data(lowered.get("save-data")),
        ect=_normalise_ect(lowered.get("ect")),
        choice=_normalise_choice(cookies.get(CHOICE_COOKIE)),
    )


def signals_from_scope(scope: Mapping[str, Any]) -> Signals:
    """Signals from an ASGI (websocket) scope: headers are (bytes, bytes) pairs."""
    headers: dict[str, str] = {}
    cookie_parts: list[str] = []
    raw: Iterable[tuple[bytes, bytes]] = scope.get("headers") or ()
    for raw_name, raw_value in raw:
        # HTTP header bytes are latin-1 by definition; decoding that way never fails.
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        if name == "cookie":
            # HTTP/2 may split cookies over several headers.
            cookie_parts.append(value)
        else:
            headers.setdefault(name, value)
    return signals_from_headers(headers, parse_cookie("; ".join(cookie_parts)))


# --- device class ---------------------------------------------------------------------------


def build_parser(resolver: str = "best") -> Parser:
    """A ua-parser Parser without its own cache (device_class caches the result instead).

    "rust" needs ua-parser-rs; "python" is the pure-Python resolver (slow, for comparison);
    "best" takes the Rust one when it is installed.
    """
    if resolver in ("rust", "best") and RegexResolver is not None:
        # The Rust resolver compiles the regexes itself, so the lazy matchers (which only
        # carry the patterns) are enough and load faster.
        return Parser(RegexResolver(load_lazy_builtins()))
    if resolver == "rust":
        raise RuntimeError("ua-parser-rs is not installed")
    return Parser(BasicResolver(load_builtins()))


@functools.cache
def _parser() -> Parser:
    if RegexResolver is None:
        logger.warning("ua-parser-rs is not installed: parsing User-Agents in pure Python (slow)")
    return build_parser("best")


def resolver_name() -> str:
    """Which ua-parser resolver device_class uses: "ua-parser-rs" or "pure-python"."""
    return "ua-parser-rs" if RegexResolver is not None else "pure-python"


# Smart TVs, streaming sticks and consoles: a big screen, so they are treated as desktops.
# ua-parser knows many of them as devices; these tokens catch the rest (and Android TVs, which
# look like Android tablets otherwise). Fire TV models are AFT…, written in capitals.
_TV_OR_CONSOLE = re.compile(
    r"(?i:SMART-?TV|SmartTV|HbbTV|NetCast|Web0S|webOS\.TV|\bCrKey/|BRAVIA|Android ?TV|GoogleTV"
    r"|\bTV Safari|\bRoku|AppleTV|PlayStation|\bXbox\b|Nintendo)"
    r"|;\s?AFT[A-Z0-9]{1,5}[\s);]"
)
_TV_OS = frozenset({"Web0S", "webOS TV", "Chromecast Linux", "Roku", "tvOS"})
_TV_DEVICE = re.compile(r"TV|Chromecast|PlayStation|Xbox|Nintendo|Roku", re.IGNORECASE)

_PHONE_OS = frozenset(
    {
        "KaiOS",
        "Windows Phone",
        "Windows Mobile",
        "BlackBerry OS",
        "Symbian OS",
        "Symbian^3",
        "Firefox OS",
        "Bada",
        "MeeGo",
        "Maemo",
        "Sailfish",
    }
)
# Feature-phone and old-smartphone tokens that ua-parser does not always turn into an OS.
_PHONE_TOKENS = re.compile(
    r"MIDP|J2ME|CLDC|Symbian|Series ?[46]0|IEMobile|Windows Phone|BlackBerry|\bBB10\b|KAIOS",
    re.IGNORECASE,
)
# Mozilla's advice for "is it mobile": the substring "Mobi" anywhere in the UA.
_MOBILE_TOKEN = re.compile(r"Mobi")
_ANDROID_TABLET_TOKEN = re.compile(r"\bTablet\b")
_DESKTOP_OS_PREFIXES = (
    "Windows",
    "Mac OS X",
    "Linux",
    "Chrome OS",
    "Ubuntu",
    "Fedora",
    "Debian",
    "FreeBSD",
    "OpenBSD",
    "NetBSD",
    "Solaris",
    "Red Hat",
    "SUSE",
    "Mint",
)
_DESKTOP_TOKENS = re.compile(r"Windows NT|Macintosh|\bX11\b|\bCrOS\b")
# Headless browsers are automation, not people; ua-parser reports them as a browser family.
_AUTOMATION_FAMILIES = frozenset({"HeadlessChrome", "PhantomJS"})
# A crawler's `…bot/2.1` token, for the ones ua-parser's device rules miss (its pure-Python
# resolver misses Applebot, the Rust one does not). Not a bare "bot": Cubot makes phones.
_BOT_TOKEN = re.compile(r"(?i)(?:bot|crawler|spider)/\d")
# `product/version` with no browser around it: curl, Wget, python-requests, Go-http-client…
_CLIENT_LIBRARY = re.compile(r"[A-Za-z][\w.+-]*/\d")


def classify_device(user_agent: str, parser: Parser) -> str:
    """The form factor of a User-Agent: phone, tablet, desktop, bot or unknown (uncached).

    ua-parser says which OS, device and browser family a UA names, not how big the screen is;
    these rules turn that (and a few raw tokens) into a form factor. The order matters: bots
    first (Googlebot's smartphone crawler sends a phone UA), TVs before Android (Android TVs
    lack "Mobile" like tablets), iPad before iPhone, Kindle before Android (the first Kindle
    Fire said "Mobile Safari"), phone platforms before Android (Windows Phone claims Android).
    """
    ua = user_agent.strip()
    if not ua:
        return UNKNOWN
    result = parser(ua, Domain.ALL)
    browser = result.user_agent.family if result.user_agent else ""
    os_family = result.os.family if result.os else ""
    device = result.device.family if result.device else ""
    brand = (result.device.brand or "") if result.device else ""

    if device == "Spider" or browser in _AUTOMATION_FAMILIES or _BOT_TOKEN.search(ua):
        return BOT
    if (
        os_family in _TV_OS
        or brand == "Generic_Inettv"
        or _TV_DEVICE.search(device)
        or _TV_OR_CONSOLE.search(ua)
    ):
        return DESKTOP
    # iPadOS 13+ in its default desktop mode sends macOS Safari's UA and lands in the desktop
    # branch below: indistinguishable, and harmless since tablets and desktops share a tier.
    # In-app browsers on iPad name it elsewhere in the UA (FBDV/iPad…), hence the raw check.
    if device.startswith("iPad") or "iPad" in ua:
        return TABLET
    if os_family == "iOS" or device.startswith(("iPhone", "iPod")):
        return PHONE
    if (
        (brand == "Amazon" and device.startswith("Kindle"))
        or "Kindle" in ua
        or "Silk/" in ua
        or os_family == "BlackBerry Tablet OS"
        or device == "Generic Tablet"
    ):
        return TABLET
    if (
        os_family in _PHONE_OS
        or device in ("Generic Smartphone", "Generic Feature Phone")
        or browser in ("Opera Mini", "Opera Mobile")
        or _PHONE_TOKENS.search(ua)
    ):
        return PHONE
    if os_family == "Android" or "Android" in ua:
        # Android's own convention: phones put "Mobile" in the UA, tablets leave it out. This
        # covers Chrome's reduced UA ("Android 10; K"), WebViews ("; wv)") and in-app
        # browsers (WeChat, Facebook, Instagram, LINE, TikTok), which all keep the token.
        if _ANDROID_TABLET_TOKEN.search(ua):
            return TABLET
        return PHONE if _MOBILE_TOKEN.search(ua) else TABLET
    if _MOBILE_TOKEN.search(ua):
        return PHONE
    if os_family.startswith(_DESKTOP_OS_PREFIXES) or _DESKTOP_TOKENS.search(ua):
        return DESKTOP
    if not ua.startswith(("Mozilla/", "Opera/")) and _CLIENT_LIBRARY.match(ua):
        return BOT
    return UNKNOWN


@functools.lru_cache(maxsize=4096)
def device_class(user_agent: str) -> str:
    """The form factor of a User-Agent (cached: the same few hundred UAs come back all day)."""
    return classify_device(user_agent, _parser())


# --- policy ---------------------------------------------------------------------------------


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
            normalised = _normalise_ch_mobile(value)
        elif signal == DeviceRule.Signal.SAVE_DATA:
            normalised = _normalise_save_data(value)
        elif signal == DeviceRule.Signal.ECT:
            normalised = _normalise_ect(value)
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
class Policy:
    """The ordered enabled rules (first match decides; none → full) and the tier → model map."""

    rules: tuple[Rule, ...]
    models: Mapping[str, TierModel]

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


def decide(signals: Signals, policy: Policy, *, allow_full_on_mobile: bool = False) -> TierDecision:
    """The tier and model for these signals.

    The user's choice can always lower the tier (anyone may pick the cheaper model), and raise
    it from lite to full only when their plan allows full on mobile.
    """
    tier, reason, device = policy.match(signals)
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
    return Policy(rules=rules, models=MappingProxyType(models))


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


def _policy_changed(sender: type, **kwargs: Any) -> None:
    clear_policy_cache()
    # Inside a transaction a reload could still read the old rows until the commit, so drop
    # the cache again once it is committed (on_commit runs at once outside a transaction).
    transaction.on_commit(clear_policy_cache, using=kwargs.get("using"))


for _model in (DeviceRule, ModelTier):
    post_save.connect(_policy_changed, sender=_model, dispatch_uid=f"tiers-save-{_model.__name__}")
    post_delete.connect(
        _policy_changed, sender=_model, dispatch_uid=f"tiers-delete-{_model.__name__}"
    )


# --- the user's plan --------------------------------------------------------------------------


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


async def tier_for_request(request: HttpRequest) -> TierDecision:
    """The tier for a Django request (the HTTP middleware's entry point)."""
    signals = signals_from_headers(request.headers, request.COOKIES)
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

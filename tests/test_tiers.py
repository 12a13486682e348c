"""The device tier policy: device classes, client hints, the user's choice, the admin's rules."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.test import Client, RequestFactory
from django.utils.functional import SimpleLazyObject

from chat.models import DeviceRule, ModelTier, Plan, Quota
from chat.tiers import devices, hints, policy
from chat.tiers.devices import device_class
from chat.tiers.hints import Signals, signals_from_headers, signals_from_scope
from chat.tiers.policy import (
    CHOICE_REASON,
    DEFAULT_RULES,
    Policy,
    Rule,
    TierModel,
    aload_policy,
    decide,
    load_policy,
    tier_for_request,
    tier_for_scope,
)

CORPUS_PATH = Path(__file__).parent / "data" / "user_agents.tsv"


def _read_corpus() -> list[dict[str, str]]:
    with CORPUS_PATH.open(encoding="utf-8", newline="") as f:
        lines = (line for line in f if not line.startswith("#"))
        return list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))


CORPUS = _read_corpus()
CORPUS_CASES = [pytest.param(row, id=row["label"]) for row in CORPUS]
PHONE_CASES = [
    pytest.param(row, id=row["label"]) for row in CORPUS if row["expected_device"] == "phone"
]

IPHONE = next(r["user_agent"] for r in CORPUS if r["label"] == "iPhone iOS 17 Safari")
ANDROID_PHONE = next(r["user_agent"] for r in CORPUS if r["label"] == "Chrome Android, reduced UA")
ANDROID_TABLET = next(
    r["user_agent"] for r in CORPUS if r["label"] == "Chrome on an Android tablet, reduced UA"
)
IPAD = next(r["user_agent"] for r in CORPUS if r["label"].startswith("iPad Safari, iPadOS 16"))
WINDOWS = next(r["user_agent"] for r in CORPUS if r["label"] == "Chrome, Windows")
MOBILE_HINT = "mobile browser (client hint)"


def signals(
    user_agent: str,
    *,
    ch_mobile: str | None = None,
    save_data: str | None = None,
    ect: str | None = None,
    choice: str | None = None,
) -> Signals:
    """Signals as the header parser makes them, so raw (even malformed) values go through it."""
    headers = {"user-agent": user_agent}
    for name, value in (("sec-ch-ua-mobile", ch_mobile), ("save-data", save_data), ("ect", ect)):
        if value is not None:
            headers[name] = value
    cookies = {"chat_tier": choice} if choice is not None else {}
    return signals_from_headers(headers, cookies)


@pytest.fixture(autouse=True)
def _fresh_policy_cache() -> Iterator[None]:
    # The policy cache is per process; a test must not see another test's rules.
    policy.clear_policy_cache()
    yield
    policy.clear_policy_cache()


# --- the corpus -----------------------------------------------------------------------------


def test_the_corpus_is_big_and_covers_every_device_class() -> None:
    assert len(CORPUS) >= 120
    assert {row["expected_device"] for row in CORPUS} == set(devices.DEVICE_CLASSES)
    assert len({row["user_agent"] for row in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("row", CORPUS_CASES)
def test_each_user_agent_gets_its_device_class(row: dict[str, str]) -> None:
    assert device_class(row["user_agent"]) == row["expected_device"]


@pytest.mark.parametrize("row", CORPUS_CASES)
def test_each_user_agent_gets_its_tier_under_the_default_policy(row: dict[str, str]) -> None:
    decision = decide(signals(row["user_agent"]), Policy.default())
    assert decision.tier == row["expected_tier"]
    assert decision.model == (
        settings.CHAT_MODEL_LITE if row["expected_tier"] == "lite" else settings.CHAT_MODEL_FULL
    )


@pytest.mark.parametrize("row", PHONE_CASES)
def test_a_phone_whose_browser_says_it_is_not_mobile_gets_full(row: dict[str, str]) -> None:
    # Client hints win over the UA string: ?0 is what "Request desktop site" looks like.
    decision = decide(signals(row["user_agent"], ch_mobile="?0"), Policy.default())
    assert (decision.tier, decision.device) == ("full", "phone")
    assert decision.reason == "not a mobile browser (client hint)"


@pytest.mark.parametrize("row", CORPUS_CASES)
def test_save_data_makes_every_device_lite(row: dict[str, str]) -> None:
    decision = decide(signals(row["user_agent"], save_data="on", ch_mobile="?0"), Policy.default())
    assert (decision.tier, decision.reason) == ("lite", "data saver is on")


def test_device_class_caches_by_user_agent() -> None:
    device_class.cache_clear()
    device_class(IPHONE)
    device_class(IPHONE)
    info = device_class.cache_info()
    assert (info.hits, info.misses, info.maxsize) == (1, 1, 4096)


def test_the_rust_resolver_and_the_pure_python_one_agree_on_the_corpus() -> None:
    if devices.resolver_name() != "ua-parser-rs":
        pytest.fail("ua-parser-rs is a dependency (pyproject.toml) but is not installed")
    rust, python = devices.build_parser("rust"), devices.build_parser("python")
    for row in CORPUS:
        ua = row["user_agent"]
        same = devices.classify_device(ua, rust) == devices.classify_device(ua, python)
        assert same, row["label"]


# --- client hints ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user_agent", "hints", "tier", "reason"),
    [
        pytest.param(WINDOWS, {"ch_mobile": "?1"}, "lite", MOBILE_HINT, id="?1 beats a desktop UA"),
        pytest.param(
            ANDROID_TABLET, {"ch_mobile": "?1"}, "lite", MOBILE_HINT, id="?1 beats a tablet UA"
        ),
        pytest.param(
            IPHONE, {"ch_mobile": "?1"}, "lite", MOBILE_HINT, id="?1 agrees with a phone UA"
        ),
        pytest.param(
            ANDROID_TABLET, {"ch_mobile": "?0"}, "full", "tablet", id="?0 agrees with a tablet UA"
        ),
        pytest.param(
            WINDOWS, {"ch_mobile": "?0"}, "full", "desktop", id="?0 agrees with a desktop UA"
        ),
        pytest.param("", {"ch_mobile": "?1"}, "lite", MOBILE_HINT, id="?1 without a UA"),
        pytest.param(
            ANDROID_PHONE,
            {"ch_mobile": "?0", "ect": "2g"},
            "lite",
            "slow network (2g)",
            id="2g beats ?0",
        ),
        pytest.param(
            WINDOWS, {"ect": "slow-2g"}, "lite", "slow network (slow-2g)", id="slow-2g on a desktop"
        ),
        pytest.param(WINDOWS, {"ect": "3g"}, "full", "desktop", id="3g is not slow enough"),
        pytest.param(WINDOWS, {"ect": "4g"}, "full", "desktop", id="4g on a desktop"),
        pytest.param(IPHONE, {"ect": "4g"}, "lite", "phone", id="4g does not lift a phone"),
        pytest.param(
            WINDOWS,
            {"save_data": "on", "ect": "4g"},
            "lite",
            "data saver is on",
            id="Save-Data on a fast desktop",
        ),
        pytest.param(
            IPAD, {"save_data": "on"}, "lite", "data saver is on", id="Save-Data on an iPad"
        ),
    ],
)
def test_client_hints_combine_with_the_user_agent(
    user_agent: str, hints: dict[str, str], tier: str, reason: str
) -> None:
    decision = decide(signals(user_agent, **hints), Policy.default())
    assert (decision.tier, decision.reason) == (tier, reason)


@pytest.mark.parametrize("value", ["?2", "1", "true", "", "?1?0", "?01", "mobile"])
def test_a_malformed_mobile_hint_is_ignored(value: str) -> None:
    assert signals(WINDOWS, ch_mobile=value).ch_mobile is None
    assert decide(signals(WINDOWS, ch_mobile=value), Policy.default()).tier == "full"
    assert decide(signals(IPHONE, ch_mobile=value), Policy.default()).tier == "lite"


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("on", "on"),
        ("ON", "on"),
        (" on ", "on"),
        ("on; foo", "on"),
        ("off", None),
        ("", None),
        ("1", None),
    ],
)
def test_save_data_is_read_tolerantly(raw: str, normalised: str | None) -> None:
    assert signals(WINDOWS, save_data=raw).save_data == normalised


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("2g", "2g"),
        ("2G", "2g"),
        (" slow-2g ", "slow-2g"),
        ('"3g"', "3g"),
        ("5g", None),
        ("wifi", None),
        ("", None),
    ],
)
def test_ect_is_read_tolerantly(raw: str, normalised: str | None) -> None:
    assert signals(WINDOWS, ect=raw).ect == normalised


def test_header_names_are_matched_whatever_their_case() -> None:
    got = signals_from_headers(
        {"User-Agent": IPHONE, "Sec-CH-UA-Mobile": "?0", "Save-Data": "on", "ECT": "2g"}, {}
    )
    assert got == Signals(IPHONE, "?0", "on", "2g", None)


def test_no_user_agent_is_an_unknown_device_on_full() -> None:
    decision = decide(signals_from_headers({}, {}), Policy.default())
    assert (decision.device, decision.tier, decision.reason) == (
        "unknown",
        "full",
        "unknown device",
    )


def test_an_oversized_user_agent_is_cut_before_parsing() -> None:
    got = signals(IPHONE + " x" * 5000)
    assert len(got.user_agent) == hints.MAX_USER_AGENT_LENGTH
    assert device_class(got.user_agent) == "phone"


def test_signals_come_from_a_websocket_scope() -> None:
    scope = {
        "type": "websocket",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"user-agent", IPHONE.encode()),
            (b"Sec-CH-UA-Mobile", b"?1"),
            (b"save-data", b"on"),
            (b"ect", b"3g"),
            # HTTP/2 may split cookies over several headers.
            (b"cookie", b"sessionid=abc"),
            (b"cookie", b"chat_tier=full"),
        ],
    }
    assert signals_from_scope(scope) == Signals(IPHONE, "?1", "on", "3g", "full")


# --- the user's choice ----------------------------------------------------------------------


def test_a_phone_user_without_permission_cannot_choose_full() -> None:
    decision = decide(signals(IPHONE, choice="full"), Policy.default(), allow_full_on_mobile=False)
    assert (decision.tier, decision.reason, decision.can_choose) == ("lite", "phone", False)


def test_a_phone_user_whose_plan_allows_it_gets_full_by_choice() -> None:
    decision = decide(signals(IPHONE, choice="full"), Policy.default(), allow_full_on_mobile=True)
    assert (decision.tier, decision.reason, decision.can_choose) == ("full", CHOICE_REASON, True)
    assert decision.model == settings.CHAT_MODEL_FULL


def test_the_plan_also_lets_a_user_overrule_data_saver() -> None:
    got = decide(
        signals(WINDOWS, save_data="on", choice="full"), Policy.default(), allow_full_on_mobile=True
    )
    assert (got.tier, got.reason) == ("full", CHOICE_REASON)


def test_a_phone_user_whose_plan_allows_it_is_offered_the_choice_before_making_it() -> None:
    decision = decide(signals(IPHONE), Policy.default(), allow_full_on_mobile=True)
    assert (decision.tier, decision.can_choose) == ("lite", True)


def test_anyone_may_choose_lite_on_a_desktop() -> None:
    decision = decide(signals(WINDOWS, choice="lite"), Policy.default())
    assert (decision.tier, decision.reason, decision.can_choose) == ("lite", CHOICE_REASON, True)
    assert decision.model == settings.CHAT_MODEL_LITE


def test_choosing_lite_on_a_phone_keeps_the_rules_reason() -> None:
    decision = decide(signals(IPHONE, choice="lite"), Policy.default(), allow_full_on_mobile=True)
    assert (decision.tier, decision.reason) == ("lite", "phone")


def test_choosing_full_on_a_desktop_changes_nothing() -> None:
    decision = decide(signals(WINDOWS, choice="full"), Policy.default())
    assert (decision.tier, decision.reason, decision.can_choose) == ("full", "desktop", True)


@pytest.mark.parametrize("cookie", ["turbo", "", "FULL ", "1"])
def test_an_odd_choice_cookie_is_ignored_unless_it_names_a_tier(cookie: str) -> None:
    got = signals(IPHONE, choice=cookie).choice
    assert got == ("full" if cookie.strip().lower() == "full" else None)


# --- policies -------------------------------------------------------------------------------


def test_the_first_matching_rule_decides() -> None:
    policy = Policy(
        rules=(Rule.of("device", "phone", "full"), Rule.of("device", "phone", "lite")),
        models={"full": TierModel("big"), "lite": TierModel("small")},
    )
    assert decide(signals(IPHONE), policy).tier == "full"


def test_without_a_matching_rule_the_tier_is_full() -> None:
    policy = Policy(rules=(), models={})
    decision = decide(signals(IPHONE), policy)
    assert (decision.tier, decision.model, decision.reason) == (
        "full",
        settings.CHAT_MODEL_FULL,
        "phone",
    )


def test_rule_values_are_normalised_like_the_headers() -> None:
    policy = Policy(
        rules=(Rule.of("save_data", " ON ", "lite"), Rule.of("ect", "3G", "lite")), models={}
    )
    assert decide(signals(WINDOWS, save_data="on"), policy).tier == "lite"
    assert decide(signals(WINDOWS, ect="3g"), policy).reason == "slow network (3g)"


def test_a_rule_value_that_can_never_match_matches_nothing() -> None:
    policy = Policy(rules=(Rule.of("save_data", "off", "lite"),), models={})
    assert decide(signals(WINDOWS), policy).tier == "full"


def test_the_decision_carries_the_tiers_model_settings() -> None:
    policy = Policy(
        rules=Policy.default().rules,
        models={"full": TierModel("big", 4096, 0.7), "lite": TierModel("small", 512, 0.2)},
    )
    decision = decide(signals(ANDROID_PHONE), policy)
    assert (decision.model, decision.max_tokens, decision.temperature) == ("small", 512, 0.2)


# --- the database ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_migration_seeds_models_rules_and_the_default_plan() -> None:
    assert dict(ModelTier.objects.values_list("tier", "model")) == {
        "full": settings.CHAT_MODEL_FULL,
        "lite": settings.CHAT_MODEL_LITE,
    }
    seeded = list(
        DeviceRule.objects.filter(enabled=True).values_list("order", "signal", "value", "tier")
    )
    assert seeded == list(DEFAULT_RULES)
    assert all(DeviceRule.objects.values_list("note", flat=True))
    plan = Plan.objects.get(name="Standard")
    assert plan.is_default
    assert (plan.rate_limit, plan.daily_tokens, plan.max_concurrent_streams) == ("", None, None)
    assert not plan.allow_full_on_mobile


@pytest.mark.django_db
def test_the_seeded_policy_is_the_default_policy() -> None:
    assert load_policy() == Policy.default()


@pytest.mark.django_db
def test_a_missing_model_tier_falls_back_to_the_settings() -> None:
    ModelTier.objects.filter(tier="lite").delete()
    ModelTier.objects.filter(tier="full").update(model="admin-full")
    policy = load_policy()
    assert policy.model_for("lite").model == settings.CHAT_MODEL_LITE
    assert policy.model_for("full").model == "admin-full"


@pytest.mark.django_db
def test_a_change_without_signals_shows_once_the_cache_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # queryset.update() sends no post_save (and another process's save never reaches this one):
    # the short cache lifetime is what makes those edits appear.
    now = [1000.0]
    monkeypatch.setattr(policy, "_clock", lambda: now[0])
    assert decide(signals(IPHONE), load_policy()).tier == "lite"
    DeviceRule.objects.filter(signal="device", value="phone").update(tier="full")
    assert decide(signals(IPHONE), load_policy()).tier == "lite"  # still cached
    now[0] += policy.POLICY_TTL_SECONDS + 0.1
    assert decide(signals(IPHONE), load_policy()).tier == "full"


# The async tests read the database from channels' worker thread, which has its own connection:
# the data must be committed (transaction=True), and serialized_rollback restores the seeded
# rows that the flush after a transactional test removes.
async_db = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@async_db
async def test_disabling_the_phone_rule_in_the_admin_applies_on_the_next_connection() -> None:
    assert decide(signals(IPHONE), await aload_policy()).tier == "lite"
    rule = await DeviceRule.objects.aget(signal="device", value="phone")
    rule.enabled = False
    await rule.asave()  # what the admin's change form does: a save(), which drops the cache
    decision = decide(signals(IPHONE), await aload_policy())
    assert (decision.tier, decision.reason) == ("full", "phone")


@async_db
async def test_mapping_tablets_to_lite_in_the_admin_catches_chrome_on_android_tablets() -> None:
    assert decide(signals(IPAD), await aload_policy()).tier == "full"
    rule = await DeviceRule.objects.aget(signal="device", value="tablet")
    rule.tier = "lite"
    await rule.asave()
    policy = await aload_policy()
    assert decide(signals(IPAD), policy).tier == "lite"
    # Chrome on an Android tablet sends ?0; the tablet rule sits above the ?0 rule, so the
    # admin's edit reaches it too.
    assert decide(signals(ANDROID_TABLET, ch_mobile="?0"), policy).tier == "lite"
    assert decide(signals(WINDOWS, ch_mobile="?0"), policy).tier == "full"


@async_db
async def test_changing_a_tiers_model_in_the_admin_applies_on_the_next_connection() -> None:
    assert decide(signals(WINDOWS), await aload_policy()).model == settings.CHAT_MODEL_FULL
    row = await ModelTier.objects.aget(tier="full")
    row.model, row.max_tokens, row.temperature = "gpt-big", 2048, 0.5
    await row.asave()
    decision = decide(signals(WINDOWS), await aload_policy())
    assert (decision.model, decision.max_tokens, decision.temperature) == ("gpt-big", 2048, 0.5)


@async_db
async def test_deleting_a_rule_in_the_admin_applies_on_the_next_connection() -> None:
    assert decide(signals(WINDOWS, save_data="on"), await aload_policy()).tier == "lite"
    await DeviceRule.objects.filter(signal="save_data").adelete()
    assert decide(signals(WINDOWS, save_data="on"), await aload_policy()).tier == "full"


def _phone_scope(user: Any, cookie: bytes = b"chat_tier=full") -> dict[str, Any]:
    return {
        "type": "websocket",
        "path": "/ws/chat/",
        "headers": [(b"user-agent", IPHONE.encode()), (b"cookie", cookie)],
        "user": user,
    }


@pytest.fixture
def plan_user(django_user_model: Any) -> Any:
    # Runs inside the async tests' transactional database, before the event loop needs it.
    plan = Plan.objects.create(name="Mobile Pro", allow_full_on_mobile=True)
    user = django_user_model.objects.create_user(username="pro", password="pw-for-tests-only")
    Quota.objects.create(user=user, plan=plan)
    return user


@async_db
async def test_tier_for_scope_honours_a_plan_that_allows_full_on_mobile(plan_user: Any) -> None:
    decision = await tier_for_scope(_phone_scope(plan_user))
    assert (decision.tier, decision.reason, decision.can_choose) == ("full", CHOICE_REASON, True)


@async_db
async def test_tier_for_scope_resolves_a_lazy_user_off_the_event_loop(plan_user: Any) -> None:
    # Channels' AuthMiddleware may hand over a lazy user; touching it on the event loop would
    # raise SynchronousOnlyOperation.
    from django.contrib.auth import get_user_model

    lazy = SimpleLazyObject(lambda: get_user_model().objects.get(pk=plan_user.pk))
    decision = await tier_for_scope(_phone_scope(lazy))
    assert decision.tier == "full"


@async_db
async def test_tier_for_scope_keeps_an_anonymous_phone_on_lite() -> None:
    decision = await tier_for_scope(_phone_scope(AnonymousUser()))
    assert (decision.tier, decision.device, decision.can_choose) == ("lite", "phone", False)


@async_db
async def test_tier_for_scope_uses_the_default_plan_for_a_user_without_a_quota(
    django_user_model: Any,
) -> None:
    user = await django_user_model.objects.acreate_user(
        username="plain", password="pw-for-tests-only"
    )
    assert (await tier_for_scope(_phone_scope(user))).tier == "lite"
    await Plan.objects.filter(name="Standard").aupdate(allow_full_on_mobile=True)
    assert (await tier_for_scope(_phone_scope(user))).tier == "full"


@async_db
async def test_tier_for_scope_reports_the_ready_frames_model(plan_user: Any) -> None:
    scope = _phone_scope(plan_user, cookie=b"")
    scope["headers"] = [(b"user-agent", WINDOWS.encode())]
    decision = await tier_for_scope(scope)
    assert (decision.tier, decision.model, decision.device) == (
        "full",
        settings.CHAT_MODEL_FULL,
        "desktop",
    )


@async_db
async def test_tier_for_request_reads_headers_cookies_and_the_plan(plan_user: Any) -> None:
    request = RequestFactory().get(
        "/", headers={"user-agent": ANDROID_PHONE, "sec-ch-ua-mobile": "?1", "save-data": "on"}
    )
    request.COOKIES["chat_tier"] = "full"
    request.user = AnonymousUser()
    assert (await tier_for_request(request)).tier == "lite"
    request.user = plan_user
    decision = await tier_for_request(request)
    assert (decision.tier, decision.reason) == ("full", CHOICE_REASON)


@pytest.mark.django_db
def test_choosing_a_tier_from_the_page_answers_with_the_new_badge_and_popover(
    plan_user: Any,
) -> None:
    # The page posts with htmx: the answer is the badge and popover as the new choice makes
    # them (out of band), and an event that makes the page reconnect its socket.
    client = Client(headers={"user-agent": IPHONE, "HX-Request": "true"})
    client.force_login(plan_user)
    response = client.post("/tier/", {"tier": "full", "next": "/c/x/"})
    assert response.status_code == 200
    assert response.cookies["chat_tier"].value == "full"
    assert "tier-chosen" in response["HX-Trigger"]
    body = response.content.decode()
    assert 'id="tier-badge" class="tier-badge" data-tier="full"' in body
    assert body.count('hx-swap-oob="true"') == 2
    assert "Chosen by you on this device." in body
    assert 'value="auto">Back to the automatic choice' in body
    assert 'name="next" value="/c/x/"' in body

    response = client.post("/tier/", {"tier": "auto"})
    assert response.cookies["chat_tier"].value == ""  # deleted
    body = response.content.decode()
    assert 'data-tier="lite"' in body
    assert 'value="full">Use the full model on this device' in body


@pytest.mark.django_db
def test_a_phone_whose_plan_forbids_full_is_told_so_in_the_popover(
    django_user_model: Any,
) -> None:
    user = django_user_model.objects.create_user(username="plain", password="pw-for-tests-only")
    client = Client(headers={"user-agent": IPHONE})
    client.force_login(user)
    body = client.get("/").content.decode()
    assert "Your plan keeps this device on the lite model" in body
    assert 'name="tier"' not in body
    # The device is the reason: named once.
    assert "Chosen because this looks like a phone." in body
    assert "Why: phone." not in body  # said in words, not as a bare label (review)
    assert "Detected device" not in body

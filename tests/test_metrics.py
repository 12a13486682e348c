"""/metrics: who may read it, and that the counters of turns, sockets, limits and errors move."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import subprocess
import sys
from typing import Any, get_args

import httpx
import pytest
from django.test import AsyncClient, Client
from prometheus_client.parser import text_string_to_metric_families

from chat import metrics
from chat.limits.limiter import get_limiter
from chat.limits.logins import Which
from chat.limits.refusals import RejectionCode
from chat.ops.metrics_view import address_allowed
from chat.turns import control, streamlog
from chat.upstream.errors import ErrorKind
from tests.conftest import receive_until_done
from tests.servers import ROOT, free_port, running_chatsite

OUTSIDER = "203.0.113.9"  # TEST-NET-3: never in an allow-list


def scrape(remote_addr: str = "127.0.0.1") -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The exported samples as {(name, sorted labels): value}."""
    response = Client(REMOTE_ADDR=remote_addr).get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def ascrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    # Sockets that earlier tests never closed leave the (weak) set of open sockets when they
    # are collected: collect now, so that does not happen between two scrapes of one test.
    gc.collect()
    response = await AsyncClient(REMOTE_ADDR="127.0.0.1").get("/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def prompt(text: str) -> str:
    return json.dumps({"type": "prompt", "conversation": "", "text": text})


# --- who may read it ------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_allow_listed_address_reads_the_metrics() -> None:
    samples = scrape("127.0.0.1")
    assert ("chat_streams_active", ()) in samples
    assert ("process_resident_memory_bytes", ()) in samples


@pytest.mark.django_db
def test_prometheus_can_ask_for_openmetrics() -> None:
    response = Client(REMOTE_ADDR="127.0.0.1").get(
        "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.rstrip().endswith(b"# EOF")


@pytest.mark.django_db
def test_an_anonymous_outsider_is_refused() -> None:
    response = Client(REMOTE_ADDR=OUTSIDER).get("/metrics")
    assert response.status_code == 403
    assert b"chat_" not in response.content


@pytest.mark.django_db
def test_a_logged_in_user_who_is_not_staff_is_refused(owner: Any) -> None:
    client = Client(REMOTE_ADDR=OUTSIDER)
    client.force_login(owner)
    assert client.get("/metrics").status_code == 403


@pytest.mark.django_db
def test_staff_read_the_metrics_from_anywhere(owner: Any) -> None:
    owner.is_staff = True
    owner.save()
    client = Client(REMOTE_ADDR=OUTSIDER)
    client.force_login(owner)
    assert client.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_the_allow_list_takes_networks(settings: Any) -> None:
    settings.CHAT_METRICS_ALLOW = ["10.0.0.0/8", "not-an-address"]
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403


def test_address_matching_refuses_what_is_not_an_address() -> None:
    assert address_allowed("::1", ["127.0.0.1", "::1"])
    assert not address_allowed("unknown", ["0.0.0.0/0"])
    assert not address_allowed("192.168.1.1", ["10.0.0.0/8"])


# --- the counters move ----------------------------------------------------------------------


async def test_a_turn_moves_the_turn_latency_token_and_socket_metrics(
    connect: Any, owner: Any, chat_settings: Any, slow_demo_upstream: str
) -> None:
    # 100 tokens/s: the answer takes long enough to have a speed (an instant one has none).
    chat_settings.LLM_BASE_URL = slow_demo_upstream
    before = await ascrape()
    comm = await connect(owner)
    during = await ascrape()
    await comm.send_to(text_data=prompt("/long 30"))
    result = await receive_until_done(comm)
    after = await ascrape()
    assert result["done"]["status"] == "complete"
    tier = {"tier": "full"}

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert value(during, "chat_sockets_active") == value(before, "chat_sockets_active") + 1
    assert moved("chat_sockets_opened_total", **tier) == 1
    assert moved("chat_turns_started_total", **tier) == 1
    assert moved("chat_turns_finished_total", status="complete", **tier) == 1
    assert moved("chat_ttft_seconds_count", **tier) == 1
    assert moved("chat_added_ttft_seconds_count", **tier) == 1
    assert moved("chat_upstream_ttfb_seconds_count") == 1
    assert moved("chat_completion_tokens_total", **tier) == 30
    assert moved("chat_chunks_total") == result["done"]["seq"]
    assert moved("chat_turn_tokens_per_second_count", **tier) == 1
    assert value(after, "chat_streams_active") == value(before, "chat_streams_active")


@pytest.mark.usefixtures("chat_settings")
async def test_the_added_ttft_leaves_out_the_models_own_wait(connect: Any, owner: Any) -> None:
    stall = 1.0  # the demo model waits this long after the request before its first token
    before = await ascrape()
    comm = await connect(owner)
    loop = asyncio.get_running_loop()
    sent = loop.time()
    await comm.send_to(text_data=prompt(f"/stall {stall:g} /echo late"))
    while True:
        raw = await comm.receive_from(timeout=20)
        if raw.startswith("{") and json.loads(raw)["type"] == "chunk":
            break
    first_chunk = loop.time()
    assert (await receive_until_done(comm))["done"]["status"] == "complete"
    after = await ascrape()
    tier = {"tier": "full"}
    counted = value(after, "chat_added_ttft_seconds_count", **tier) - value(
        before, "chat_added_ttft_seconds_count", **tier
    )
    added = value(after, "chat_added_ttft_seconds_sum", **tier) - value(
        before, "chat_added_ttft_seconds_sum", **tier
    )
    assert counted == 1  # once per turn
    # Our clock brackets chatsite's: the frame arrived after `sent`, its first chunk was handed
    # to the socket before `first_chunk`, and the model took at least `stall` from the request
    # to its first delta. So if the model's wait is left out, what chatsite added is at most
    # the time we saw minus the stall; counted in, it would be about all of it.
    assert 0 <= added <= (first_chunk - sent) - stall


@pytest.mark.usefixtures("chat_settings")
async def test_a_failing_model_counts_an_upstream_error_by_kind(connect: Any, owner: Any) -> None:
    before = await ascrape()
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/fail 503"))
    result = await receive_until_done(comm)
    after = await ascrape()
    assert result["done"]["status"] == "failed"
    kind = {"kind": "http_status"}
    assert value(after, "chat_upstream_errors_total", **kind) == (
        value(before, "chat_upstream_errors_total", **kind) + 1
    )
    failed = {"tier": "full", "status": "failed"}
    assert value(after, "chat_turns_finished_total", **failed) == (
        value(before, "chat_turns_finished_total", **failed) + 1
    )


async def test_rate_limit_rejections_are_counted_by_reason(
    connect: Any, owner: Any, chat_settings: Any
) -> None:
    chat_settings.CHAT_RATE_LIMIT = "1/minute"
    before = await ascrape()
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/echo one"))
    await receive_until_done(comm)
    await comm.send_to(text_data=prompt("/echo two"))
    refused = json.loads(await comm.receive_from(timeout=10))
    after = await ascrape()
    assert refused["code"] == "rate_limited"
    labels = {"reason": "rate_limited", "channel": "socket"}
    assert value(after, "chat_rate_limit_rejections_total", **labels) == (
        value(before, "chat_rate_limit_rejections_total", **labels) + 1
    )


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_limiter_failures_are_exported_when_redis_is_unreachable(settings: Any) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    settings.CHAT_LIMITER_FAILURE = "open"
    before = await ascrape()
    limiter = get_limiter()
    try:
        await limiter.admit(1, estimate_tokens=10)
    finally:
        await limiter.aclose()
    after = await ascrape()
    assert value(after, "chat_limiter_failures_total", operation="admit") == (
        value(before, "chat_limiter_failures_total", operation="admit") + 1
    )
    assert value(
        after, "chat_limiter_failures_total", operation="admit"
    ) == metrics.limiter_failure_count("admit")


@pytest.mark.django_db
def test_the_stream_log_and_control_counters_are_exported_as_they_stand() -> None:
    samples = scrape()
    for field, count in vars(streamlog.stats).items():
        assert value(samples, f"chat_stream_log_{field}_total") == count, field
    for field, count in vars(control.stats).items():
        assert value(samples, f"chat_control_{field}_total") == count, field


# --- series that exist before their first event -----------------------------------------------


def test_a_fresh_process_exports_every_known_label_value_at_zero() -> None:
    """A counter series that appears at 1 hides its first event from rate() and increase():
    the first failed turn, upstream error or refusal of each process would never show on the
    dashboard nor fire an alert. A new process (not this one, whose tests have counted) must
    export them at 0 before anything happens."""
    exported = subprocess.run(
        [
            sys.executable,
            "-c",
            "from prometheus_client import generate_latest; from chat import metrics; "
            "print(generate_latest(metrics.REGISTRY).decode())",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exported)
        for sample in family.samples
    }
    expected = [
        *(
            ("chat_turns_finished_total", (("status", status), ("tier", tier)))
            for tier in ("full", "lite")
            for status in ("complete", "stopped", "failed")
        ),
        *(("chat_turns_started_total", (("tier", tier),)) for tier in ("full", "lite")),
        *(("chat_upstream_errors_total", (("kind", kind),)) for kind in get_args(ErrorKind)),
        *(
            ("chat_rate_limit_rejections_total", (("channel", "socket"), ("reason", code)))
            for code in (*get_args(RejectionCode), "too_many_sockets")
        ),
        *(
            ("chat_rate_limit_rejections_total", (("channel", channel), ("reason", "rate_limited")))
            for channel in ("http", "resume", "signup", "reset")
        ),
        *(
            (
                "chat_rate_limit_rejections_total",
                (("channel", f"login_{which}"), ("reason", "rate_limited")),
            )
            for which in get_args(Which)
            if which not in ("signup", "reset")
        ),
    ]
    assert {key: samples.get(key) for key in expected} == {key: 0.0 for key in expected}


def limiter_operations_in_the_code() -> set[str]:
    """Every operation name the code counts a limiter failure under, read from its source (so
    a new one that is not pre-set fails the test below)."""
    found: set[str] = set()
    for path in (ROOT / "chat").rglob("*.py"):
        source = path.read_text()
        found.update(re.findall(r'(?:limiter_failed|_note_failure)\(\s*"([a-z_]+)"', source))
        if re.search(r'_note_failure\(\s*f"\{which\}_hit"', source):
            found.update(f"{which}_hit" for which in get_args(Which))
    return found


def test_a_fresh_server_exports_every_limiter_operations_failures_at_zero() -> None:
    # A counter that never appeared cannot be alerted on with rate(): Redis's first outage of a
    # process would go unseen. Asked of a fresh daphne over HTTP, as Prometheus asks.
    operations = limiter_operations_in_the_code()
    assert {"admit", "settle", "socket_take", "address_hit", "login_clear"} <= operations
    with running_chatsite() as base:
        response = httpx.get(f"{base}/metrics", timeout=10)
    assert response.status_code == 200
    exported = {
        sample.labels["operation"]: sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name == "chat_limiter_failures_total"
    }
    assert {op: exported.get(op) for op in operations} == dict.fromkeys(operations, 0.0)

"""/metrics: who may read it, and that the counters of turns, sockets, limits and errors move."""

from __future__ import annotations

import gc
import json
from typing import Any

import pytest
from django.test import AsyncClient, Client
from prometheus_client.parser import text_string_to_metric_families

from chat import control, metrics, ratelimit, streamlog
from tests.conftest import receive_until_done
from tests.servers import free_port

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
    assert metrics.address_allowed("::1", ["127.0.0.1", "::1"])
    assert not metrics.address_allowed("unknown", ["0.0.0.0/0"])
    assert not metrics.address_allowed("192.168.1.1", ["10.0.0.0/8"])


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
    assert moved("chat_upstream_ttfb_seconds_count") == 1
    assert moved("chat_completion_tokens_total", **tier) == 30
    assert moved("chat_chunks_total") == result["done"]["seq"]
    assert moved("chat_turn_tokens_per_second_count", **tier) == 1
    assert value(after, "chat_streams_active") == value(before, "chat_streams_active")


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
    limiter = ratelimit.get_limiter()
    try:
        await limiter.admit(1, estimate_tokens=10)
    finally:
        await limiter.aclose()
    after = await ascrape()
    assert value(after, "chat_limiter_failures_total", operation="admit") == (
        value(before, "chat_limiter_failures_total", operation="admit") + 1
    )
    assert (
        value(after, "chat_limiter_failures_total", operation="admit")
        == (ratelimit.limiter_failures["admit"])
    )


@pytest.mark.django_db
def test_the_stream_log_and_control_counters_are_exported_as_they_stand() -> None:
    samples = scrape()
    for field, count in vars(streamlog.stats).items():
        assert value(samples, f"chat_stream_log_{field}_total") == count, field
    for field, count in vars(control.stats).items():
        assert value(samples, f"chat_control_{field}_total") == count, field

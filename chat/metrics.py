"""Prometheus metrics of this process and the `/metrics` view that serves them.

Each daphne process keeps and serves its own numbers (scrape every instance; sum in PromQL).
Updates happen once per turn, socket, rejection or upstream request — never per token or per
chunk — so the hot path pays nothing. Gauges (open sockets, running turns) and the counters
other modules keep as plain dicts or dataclasses (`chat.ratelimit.limiter_failures`,
`chat.streamlog.stats`, `chat.control.stats`) are read when Prometheus scrapes.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

# Our own registry (not the library's global one): nothing another library registers leaks
# into /metrics, and tests can read exactly what we export.
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

# Latency buckets from "instant" to "the user gave up" (seconds).
LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
SPEED_BUCKETS = (1, 5, 10, 20, 30, 50, 75, 100, 150, 250, 500, 1000, 5000)

turns_started = Counter(
    "chat_turns_started",
    "Chat turns started (prompts admitted and sent upstream).",
    ["tier"],
    registry=REGISTRY,
)
turns_finished = Counter(
    "chat_turns_finished",
    "Chat turns ended, by outcome: complete, stopped (by the user) or failed.",
    ["tier", "status"],
    registry=REGISTRY,
)
ttft_seconds = Histogram(
    "chat_ttft_seconds",
    "Time from the start of a turn to its first token (seconds).",
    ["tier"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
upstream_ttfb_seconds = Histogram(
    "chat_upstream_ttfb_seconds",
    "Time from sending a request to the model server to its response headers (seconds).",
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
tokens_per_second = Histogram(
    "chat_turn_tokens_per_second",
    "Completion tokens per second of each answer, from its first token to its end.",
    ["tier"],
    buckets=SPEED_BUCKETS,
    registry=REGISTRY,
)
completion_tokens = Counter(
    "chat_completion_tokens", "Completion tokens streamed to users.", ["tier"], registry=REGISTRY
)
prompt_tokens = Counter(
    "chat_prompt_tokens", "Prompt tokens sent to the model server.", ["tier"], registry=REGISTRY
)
chunks = Counter(
    "chat_chunks", "Chunk frames produced by turns (coalesced deltas).", registry=REGISTRY
)
sockets_opened = Counter(
    "chat_sockets_opened",
    "Chat sockets accepted, by the tier they were given.",
    ["tier"],
    registry=REGISTRY,
)
rate_limit_rejections = Counter(
    "chat_rate_limit_rejections",
    "Prompts (socket) and requests (http) refused by the limiter, by reason.",
    ["reason", "channel"],
    registry=REGISTRY,
)
upstream_errors = Counter(
    "chat_upstream_errors",
    "Turns the model server failed, by kind (http_status, timeout, connect, protocol, ...).",
    ["kind"],
    registry=REGISTRY,
)
ws_slow_reader_closed = Counter(
    "chat_ws_slow_reader_closed",
    "Websockets aborted because their client stopped reading: daphne held more than "
    "CHAT_SEND_BUFFER_BYTES for them (chat/backpressure.py).",
    registry=REGISTRY,
)


def turn_started(tier: str) -> None:
    turns_started.labels(tier=tier).inc()


def turn_finished(
    *,
    tier: str,
    status: str,
    ttft_ms: int | None,
    prompt: int,
    completion: int,
    chunk_count: int,
    seconds: float,
) -> None:
    """Everything a turn reports, once, when it ends."""
    turns_finished.labels(tier=tier, status=status).inc()
    chunks.inc(chunk_count)
    prompt_tokens.labels(tier=tier).inc(prompt)
    completion_tokens.labels(tier=tier).inc(completion)
    if ttft_ms is None:
        return
    ttft_seconds.labels(tier=tier).observe(ttft_ms / 1000)
    streaming = seconds - ttft_ms / 1000
    # A one-chunk answer has no meaningful speed (it would divide by ~0).
    if completion > 1 and streaming > 0.001:
        tokens_per_second.labels(tier=tier).observe(completion / streaming)


def upstream_error(kind: str) -> None:
    upstream_errors.labels(kind=kind).inc()


def upstream_responded(seconds: float) -> None:
    upstream_ttfb_seconds.observe(seconds)


def socket_opened(tier: str) -> None:
    sockets_opened.labels(tier=tier).inc()


def rejected(reason: str, channel: str) -> None:
    rate_limit_rejections.labels(reason=reason, channel=channel).inc()


def slow_reader_closed() -> None:
    ws_slow_reader_closed.inc()


class _StateCollector(Collector):
    """Numbers that exist elsewhere as state, read at scrape time."""

    def describe(self) -> Iterable[Metric]:
        # Nothing to check names against at registration: collect() imports the models,
        # which this module must not need at import time (the upstream client imports it).
        return []

    def collect(self) -> Iterable[Metric]:
        from chat import control, ratelimit, shutdown, streamlog
        from chat.turns import registry

        yield _gauge("chat_sockets_active", "Chat sockets open here.", len(shutdown.sockets))
        yield _gauge("chat_streams_active", "Turns running here.", len(registry.turns))
        yield _gauge("chat_draining", "1 while shutting down gracefully.", int(shutdown.draining()))
        failures = CounterMetricFamily(
            "chat_limiter_failures",
            "Limiter operations that could not reach their storage (Redis).",
            labels=["operation"],
        )
        for operation, count in sorted(ratelimit.limiter_failures.items()):
            failures.add_metric([operation], count)
        yield failures
        yield from _dataclass_counters("chat_stream_log", "Stream log", streamlog.stats)
        yield from _dataclass_counters("chat_control", "Control channel", control.stats)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _dataclass_counters(prefix: str, what: str, stats: Any) -> Iterator[CounterMetricFamily]:
    for field in dataclasses.fields(stats):
        name = field.name.removesuffix("_total")
        yield CounterMetricFamily(
            f"{prefix}_{name}",
            f"{what}: {name.replace('_', ' ')} (see {type(stats).__module__}).",
            value=getattr(stats, field.name),
        )


REGISTRY.register(_StateCollector())


# --- the view ---------------------------------------------------------------------------------


def address_allowed(address: str, allowed: Iterable[str]) -> bool:
    """Is `address` one of `allowed` (addresses or networks such as 10.0.0.0/8)?"""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    for entry in allowed:
        try:
            if ip in ipaddress.ip_network(entry.strip(), strict=False):
                return True
        except ValueError:
            continue
    return False


async def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus metrics, for staff or an address in CHAT_METRICS_ALLOW; 403 otherwise.

    Behind nginx, REMOTE_ADDR is the client's address only when daphne runs with
    `--proxy-headers` and nginx overwrites X-Forwarded-For (deploy/nginx.conf does).
    """
    address = str(request.META.get("REMOTE_ADDR", ""))
    if not address_allowed(address, settings.CHAT_METRICS_ALLOW):
        user = await request.auser()
        if not (user.is_authenticated and user.is_staff):
            return HttpResponse(
                "Metrics are for staff and allow-listed addresses.\n",
                status=403,
                content_type="text/plain",
            )
    # The format Prometheus asks for (text or OpenMetrics), as prometheus-client's own server.
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encode(REGISTRY), content_type=content_type)

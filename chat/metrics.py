"""The counters of this process (Prometheus): a leaf every module may count into.

Updates happen once per turn, socket, rejection or upstream request — never per token or per
chunk — so the hot path pays nothing. What exists elsewhere as state (open sockets, running
turns, the stream log's and control channel's trouble counts) is read at scrape time by the
collector in chat/ops/metrics_view.py, which also serves `/metrics`.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

# Our own registry (not the library's global one): nothing another library registers leaks
# into /metrics, and tests can read exactly what we export.
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

# Latency buckets from "instant" to "the user gave up" (seconds).
LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
# What chatsite adds is meant to be milliseconds: finer buckets at the low end.
ADDED_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
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
added_ttft_seconds = Histogram(
    "chat_added_ttft_seconds",
    "Time chatsite adds to the model's own time to first token: from the prompt frame's "
    "arrival to the first chunk frame handed to the socket, minus the model server's time "
    "from request sent to first delta (seconds).",
    ["tier"],
    buckets=ADDED_BUCKETS,
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
    "CHAT_SEND_BUFFER_BYTES for them (chat/sockets/backpressure.py).",
    registry=REGISTRY,
)

limiter_failures = Counter(
    "chat_limiter_failures",
    "Limiter operations that could not reach their storage (Redis), by operation.",
    ["operation"],
    registry=REGISTRY,
)


# Every label value known in advance has its series from the start, at 0 (Prometheus'
# instrumentation guide: "avoid missing metrics"). A series born at 1 hides its first event
# from rate() and increase(): the first failed turn, upstream error or refusal of a process
# would never show on the dashboard or fire an alert.
TIERS = ("full", "lite")
TURN_STATUSES = ("complete", "stopped", "failed")
UPSTREAM_ERROR_KINDS = ("http_status", "timeout", "connect", "protocol", "stream_error", "empty")
REJECTIONS = (  # the (reason, channel) pairs the code counts
    ("rate_limited", "socket"),
    ("quota_exceeded", "socket"),
    ("too_many_streams", "socket"),
    ("too_many_sockets", "socket"),
    ("unauthenticated", "socket"),
    ("rate_limited", "stranger"),
    ("rate_limited", "http"),
    ("rate_limited", "resume"),
    ("rate_limited", "signup"),
    ("rate_limited", "login_address"),
    ("rate_limited", "login_username"),
    ("rate_limited", "login_device"),
    ("rate_limited", "reset"),
)
for _tier in TIERS:
    turns_started.labels(tier=_tier)
    for _status in TURN_STATUSES:
        turns_finished.labels(tier=_tier, status=_status)
for _kind in UPSTREAM_ERROR_KINDS:
    upstream_errors.labels(kind=_kind)
for _reason, _channel in REJECTIONS:
    rate_limit_rejections.labels(reason=_reason, channel=_channel)
# The limiter's operations that count a failure to reach their storage (chat/limits/): an
# alert on rate(chat_limiter_failures_total[5m]) must see Redis's first outage of a process.
LIMITER_OPERATIONS = (
    *("admit", "settle", "refresh", "resize", "release_dead", "tokens_today", "reset_today"),
    *("hit_http", "hit_page", "hit_resume", "hit_socket", "hit_stranger"),
    *("address_hit", "username_hit", "device_hit", "signup_hit", "reset_hit", "login_clear"),
    *("socket_take", "socket_release", "socket_extend"),
)
for _operation in LIMITER_OPERATIONS:
    limiter_failures.labels(operation=_operation)


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
    added_ttft: float | None = None,
) -> None:
    """Everything a turn reports, once, when it ends."""
    turns_finished.labels(tier=tier, status=status).inc()
    if added_ttft is not None:
        added_ttft_seconds.labels(tier=tier).observe(added_ttft)
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


def limiter_failed(operation: str) -> None:
    limiter_failures.labels(operation=operation).inc()


def limiter_failure_count(operation: str) -> float:
    """How often `operation` could not reach the limiter's storage in this process (tests)."""
    return limiter_failures.labels(operation=operation)._value.get()

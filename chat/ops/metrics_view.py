"""The `/metrics` view, and the collector that reads at scrape time what exists as state."""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Iterator
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from chat import metrics
from chat.sockets import draining
from chat.turns import control, streamlog
from chat.turns.registry import registry


class _StateCollector(Collector):
    """Numbers that exist elsewhere as state, read at scrape time."""

    def describe(self) -> Iterable[Metric]:
        return []  # names are not checked at registration: collect() reads live state

    def collect(self) -> Iterable[Metric]:
        yield _gauge("chat_sockets_active", "Chat sockets open here.", len(draining.sockets))
        yield _gauge("chat_streams_active", "Turns running here.", len(registry.turns))
        yield _gauge("chat_draining", "1 while shutting down gracefully.", int(draining.draining()))
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


_collector = _StateCollector()
metrics.REGISTRY.register(_collector)


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
    return HttpResponse(encode(metrics.REGISTRY), content_type=content_type)

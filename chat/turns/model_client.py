"""The model server's client of this process, built from the LLM_* settings, one per event loop."""

from __future__ import annotations

from collections.abc import Hashable

from django.conf import settings

from chat.loops import PerLoop
from chat.upstream.client import UpstreamClient


def _config() -> Hashable:
    return (
        settings.LLM_BASE_URL,
        settings.LLM_API_KEY,
        settings.LLM_CONNECT_TIMEOUT,
        settings.LLM_READ_TIMEOUT,
        settings.LLM_TOTAL_TIMEOUT,
        settings.LLM_POOL_SIZE,
        settings.LLM_HTTP2,
        settings.LLM_HTTP_BACKEND,
    )


def build_client() -> UpstreamClient:
    """An upstream client as the LLM_* settings describe it."""
    return UpstreamClient(
        settings.LLM_BASE_URL,
        settings.LLM_API_KEY,
        connect_timeout=settings.LLM_CONNECT_TIMEOUT,
        read_timeout=settings.LLM_READ_TIMEOUT,
        total_timeout=settings.LLM_TOTAL_TIMEOUT,
        pool_size=settings.LLM_POOL_SIZE,
        http2=settings.LLM_HTTP2,
        backend=settings.LLM_HTTP_BACKEND,
    )


async def _close(client: UpstreamClient) -> None:
    await client.aclose()


# A change of the LLM_* settings (tests override them) builds a new client; the old one closes.
model_clients: PerLoop[UpstreamClient] = PerLoop(
    "model client", build_client, _close, config=_config
)


def get_client() -> UpstreamClient:
    """This loop's upstream client (one pooled client per process and loop)."""
    return model_clients.get()

"""The admin's checks of the model tiers against the model server: the models it lists (kept
for a moment, as the admin's tier pages ask on every view), and a one-line answer from a tier's
model.

Each check has a client of its own, closed at its end: the admin's views are sync, and
`async_to_sync` may run them on a loop of their own (in tests, always), where the turns'
per-loop client would be built and never closed."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

from chat.turns.model_client import build_client
from chat.upstream.client import UpstreamError
from chat.upstream.errors import failure
from chat.upstream.items import Delta

# An admin page waits for these: short, whatever the LLM_* timeouts of a turn are.
LIST_SECONDS = 3.0
# How long the model server's list (or its failure to give one) is kept: every view of the
# admin's tier pages shows its warnings without asking again (docs/configuration.md).
LISTED_CACHE_SECONDS = 30
TEST_SECONDS = 30.0
TEST_PROMPT = "Say hello in one short line."
TEST_MAX_TOKENS = 60
LINE_CHARS = 200


@dataclass(frozen=True)
class TierTest:
    """What a tier's model answered to the test prompt, or why it did not."""

    ok: bool
    line: str  # the answer's first line, or the failure in plain words
    seconds: float


async def listed_models() -> list[str]:
    """The models the model server lists. Raises `UpstreamError` when it cannot say."""
    client = build_client()
    try:
        async with asyncio.timeout(LIST_SECONDS):
            return await client.list_models()
    except TimeoutError as exc:
        raise failure(
            "timeout", f"The model server did not list its models within {LIST_SECONDS:g} s"
        ) from exc
    finally:
        await client.aclose()


def _listed_key() -> str:
    # Per model server and key (another key may be shown other models); the key itself is
    # never stored in a cache key.
    server = f"{settings.LLM_BASE_URL}\n{settings.LLM_API_KEY}".encode()
    return "chat:tier-check:listed:" + hashlib.sha256(server).hexdigest()[:32]


async def served_models() -> list[str]:
    """`listed_models()`, asked at most once per LISTED_CACHE_SECONDS (in Django's cache):
    the list, or the failure, is kept, so a model server that is down or slow costs one
    page view at most LIST_SECONDS, not every one. Raises `UpstreamError` as it does."""
    key = _listed_key()
    kept = await cache.aget(key)
    if kept is None:
        try:
            kept = {"models": await listed_models()}
        except UpstreamError as exc:
            kept = {"kind": exc.kind, "message": exc.message}
        await cache.aset(key, kept, LISTED_CACHE_SECONDS)
    if "models" not in kept:
        raise UpstreamError(kept["kind"], kept["message"])
    return list(kept["models"])


async def try_tier(model: str, temperature: float | None = None) -> TierTest:
    """Stream a one-line answer from `model`; the stream is closed at the end of its first
    line, so the model server stops generating."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    text = ""
    client = build_client()
    try:
        async with asyncio.timeout(TEST_SECONDS):
            stream = client.stream_chat(
                model=model,
                messages=[{"role": "user", "content": TEST_PROMPT}],
                max_tokens=TEST_MAX_TOKENS,
                temperature=temperature,
            )
            async with contextlib.aclosing(stream) as items:
                async for item in items:
                    if isinstance(item, Delta):
                        text += item.text
                        if "\n" in text.lstrip() or len(text) > LINE_CHARS:
                            break
    except UpstreamError as exc:
        return TierTest(False, exc.message, loop.time() - started)
    except TimeoutError:
        return TierTest(False, f"No answer within {TEST_SECONDS:g} s", loop.time() - started)
    finally:
        await client.aclose()
    lines = text.strip().splitlines()
    if not lines:
        return TierTest(False, "The model answered nothing", loop.time() - started)
    return TierTest(True, lines[0][:LINE_CHARS], loop.time() - started)

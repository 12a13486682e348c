"""Limits as a user meets them: over the socket, over HTTP, and as admins change them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from chat.models import Message, Plan, Quota
from tests.conftest import REDIS_URL, assistant_mid, receive_until_done

pytestmark = pytest.mark.usefixtures("chat_settings")


@pytest.fixture(params=["memory", "redis"])
def backend(request: Any, settings: Any, redis_prefix: str) -> str:
    """Every socket test here runs on the in-memory limiter and on the real Redis."""
    if request.param == "redis":
        settings.REDIS_URL = REDIS_URL
    return str(request.param)


def prompt(text: str) -> str:
    return json.dumps({"type": "prompt", "conversation": "", "text": text})


async def next_json(comm: Any) -> dict[str, Any]:
    while True:
        raw = await comm.receive_from(timeout=10)
        if raw.startswith("{"):
            return json.loads(raw)


async def test_a_prompt_over_the_rate_limit_is_refused_with_retry_after(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_RATE_LIMIT = "2/minute"
    comm = await connect(owner)
    for _ in range(2):
        await comm.send_to(text_data=prompt("/echo ok"))
        assert (await receive_until_done(comm))["done"]["status"] == "complete"
    await comm.send_to(text_data=prompt("/echo one too many"))
    error = await next_json(comm)
    assert error["code"] == "rate_limited"
    assert 1 <= error["retry_after"] <= 60
    assert "2 messages per minute" in error["message"]
    # The refused prompt never reached the consumer: nothing was stored for it.
    texts = await database_sync_to_async(list)(
        Message.objects.filter(role="user").values_list("text", flat=True)
    )
    assert "/echo one too many" not in texts


async def test_the_window_slides(connect: Any, owner: Any, settings: Any, backend: str) -> None:
    settings.CHAT_RATE_LIMIT = "2/2second"
    comm = await connect(owner)
    for _ in range(2):
        await comm.send_to(text_data=prompt("/echo ok"))
        await receive_until_done(comm)
    await comm.send_to(text_data=prompt("/echo wait"))
    error = await next_json(comm)
    assert error["code"] == "rate_limited"
    await asyncio.sleep(error["retry_after"] + 0.1)
    await comm.send_to(text_data=prompt("/echo again"))
    assert (await receive_until_done(comm))["text"] == "again"


async def test_the_concurrent_stream_cap_frees_its_slot_when_an_answer_is_stopped(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str, backend: str
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    settings.CHAT_MAX_CONCURRENT_STREAMS = 1
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/long 3000"))
    mid = assistant_mid(await comm.receive_from(timeout=10))
    await comm.send_to(text_data=prompt("/echo second"))
    # The first answer's chunks may come before the refusal: note how far they got.
    seen = -1
    error = await next_json(comm)
    while error["type"] != "error":
        if error["type"] == "chunk" and error["mid"] == mid:
            seen = error["seq"]
        error = await next_json(comm)
    assert error["code"] == "too_many_streams"
    # The block lasts until an answer ends: the frame says so; its retry_after (every limited
    # prompt has one, ARCHITECTURE §6) is only the least wait, not a moment to count down to.
    assert error["retry_after"] == 1
    assert error["retry_when"] == "stream_ends"
    assert "when it ends" in error["message"]
    await comm.send_to(text_data=json.dumps({"type": "stop", "mid": mid}))
    assert (await receive_until_done(comm, mid, after=seen))["done"]["status"] == "stopped"
    await comm.send_to(text_data=prompt("/echo second"))
    assert (await receive_until_done(comm))["text"] == "second"


async def test_the_slot_is_freed_when_an_answer_ends_even_if_its_socket_dropped(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_MAX_CONCURRENT_STREAMS = 1
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/echo bye"))
    mid = assistant_mid(await comm.receive_from(timeout=10))
    await comm.disconnect()
    # The turn goes on without the socket, finishes and gives its slot back.
    for _ in range(100):
        status = await database_sync_to_async(lambda: Message.objects.get(mid=mid).status)()
        if status != "streaming":
            break
        await asyncio.sleep(0.05)
    again = await connect(owner)
    await again.send_to(text_data=prompt("/echo next"))
    assert (await receive_until_done(again))["text"] == "next"


async def test_a_daily_token_quota_is_enforced_and_named(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_DAILY_TOKENS = 100
    comm = await connect(owner)
    # The answer may use what is left and no more: it stops there, and says why.
    await comm.send_to(text_data=prompt("/long 500"))
    first = (await receive_until_done(comm))["done"]
    assert first["status"] == "stopped"
    assert "daily quota reached" in first["error"]
    assert first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] <= 100
    assert first["tokens_left"] == 0  # too few left for another turn
    await comm.send_to(text_data=prompt("/echo more"))
    error = await next_json(comm)
    assert error["code"] == "quota_exceeded"
    assert "00:00 UTC" in error["message"]
    assert error["retry_after"] >= 1


async def test_a_failed_answer_refunds_its_reservation(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    from chat.limits.limiter import get_limiter

    settings.CHAT_DAILY_TOKENS = 5000
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/fail 503"))
    assert (await receive_until_done(comm))["done"]["status"] == "failed"
    used, quota = await get_limiter().tokens_today(owner.pk)
    assert (used, quota) == (0, 5000)


async def test_an_admin_edit_of_the_plan_applies_on_the_next_prompt(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_RATE_LIMIT = "100/minute"
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/echo before"))
    await receive_until_done(comm)

    def tighten() -> None:
        plan = Plan.objects.create(name="Tight", rate_limit="1/minute")
        Quota.objects.create(user=owner, plan=plan)

    await database_sync_to_async(tighten)()
    # A changed limit starts its own window (the limits library keys a window by its rate),
    # so the first prompt under the new plan passes and the second meets it.
    await comm.send_to(text_data=prompt("/echo after"))
    await receive_until_done(comm)
    await comm.send_to(text_data=prompt("/echo once more"))
    error = await next_json(comm)
    assert error["code"] == "rate_limited"
    assert "1 message per minute" in error["message"]


@pytest.mark.django_db
def test_http_posts_over_the_limit_get_429_with_retry_after(
    owner: Any, settings: Any, redis_prefix: str
) -> None:
    # The sync test client runs each request on a new event loop, so an in-memory limiter
    # would start empty every time: this one counts in the real Redis.
    settings.REDIS_URL = REDIS_URL
    settings.CHAT_HTTP_RATE_LIMIT = "2/minute"
    client = Client()
    client.force_login(owner)
    codes = [client.post("/tier/", {"tier": "lite"}).status_code for _ in range(3)]
    assert codes[:2] == [302, 302]
    limited = client.post("/tier/", {"tier": "lite"}, headers={"HX-Request": "true"})
    assert limited.status_code == 429
    assert int(limited["Retry-After"]) >= 1
    assert limited["HX-Retarget"] == "#alerts"
    assert "2 messages per minute" in limited.content.decode() or "per minute" in (
        limited.content.decode()
    )


async def test_done_tells_the_usage_meter_how_many_tokens_are_left(
    connect: Any, owner: Any, settings: Any, backend: str
) -> None:
    settings.CHAT_DAILY_TOKENS = 10_000
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/echo count me"))
    done = (await receive_until_done(comm))["done"]
    spent = done["usage"]["prompt_tokens"] + done["usage"]["completion_tokens"]
    assert done["tokens_left"] == 10_000 - spent

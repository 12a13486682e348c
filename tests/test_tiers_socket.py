"""The tier policy as the socket applies it: the `ready` frame for every UA of the corpus."""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from tests.conftest import session_key_for
from tests.test_tiers import _read_corpus

pytestmark = pytest.mark.usefixtures("chat_settings", "closed_services")


async def ready_for(
    session: str, headers: list[tuple[bytes, bytes]], cookies: str = ""
) -> dict[str, Any]:
    from chatsite.asgi import application

    comm = WebsocketCommunicator(
        application,
        "/ws/chat/",
        headers=[
            (b"host", b"127.0.0.1:8000"),
            (b"origin", b"http://127.0.0.1:8000"),
            (b"cookie", f"sessionid={session}{cookies}".encode()),
            *headers,
        ],
    )
    connected, _ = await comm.connect(timeout=10)
    assert connected
    try:
        return json.loads(await comm.receive_from(timeout=10))
    finally:
        await comm.disconnect()


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_every_user_agent_of_the_corpus_gets_its_tier_in_the_ready_frame(
    owner: Any, settings: Any
) -> None:
    settings.CHAT_SOCKET_RATE = "10000/minute"  # one user's many handshakes, on purpose
    session = await database_sync_to_async(session_key_for)(owner)
    wrong = []
    for row in _read_corpus():
        ready = await ready_for(session, [(b"user-agent", row["user_agent"].encode())])
        model = (
            settings.CHAT_MODEL_LITE if row["expected_tier"] == "lite" else settings.CHAT_MODEL_FULL
        )
        if (ready["tier"], ready["model"], ready["device"]) != (
            row["expected_tier"],
            model,
            row["expected_device"],
        ):
            wrong.append((row["label"], ready["tier"], ready["device"]))
    assert wrong == []


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.parametrize(
    ("hints", "tier", "reason_word"),
    [
        ([(b"sec-ch-ua-mobile", b"?1")], "lite", "mobile"),
        ([(b"save-data", b"on")], "lite", "data"),
        ([(b"ect", b"2g")], "lite", "2g"),
        ([(b"ect", b"4g")], "full", "desktop"),
    ],
)
async def test_client_hints_on_the_handshake_choose_the_tier(
    owner: Any, hints: list[tuple[bytes, bytes]], tier: str, reason_word: str
) -> None:
    session = await database_sync_to_async(session_key_for)(owner)
    desktop = (
        b"user-agent",
        b"Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/131.0 Safari/537.36",
    )
    ready = await ready_for(session, [desktop, *hints])
    assert ready["tier"] == tier
    assert reason_word in ready["reason"].lower()


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_the_users_choice_cookie_picks_the_lite_model_on_a_desktop(owner: Any) -> None:
    session = await database_sync_to_async(session_key_for)(owner)
    ready = await ready_for(session, [], cookies="; chat_tier=lite")
    assert ready["tier"] == "lite"

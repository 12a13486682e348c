"""Strangers at the socket: handshakes that cannot be a user's are refused before the session
lookup (a hop onto the one ORM thread every user's turns pass through), and an address whose
handshakes carry invalid sessions in a loop is refused for a while (CHAT_STRANGER_SOCKET_RATE).

The sixth hostile review sent ~355 handshakes a second without a session and slowed another
user's first token; every rate and cap was per user (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from tests.conftest import session_key_for
from tests.servers import running_chatsite, signup

pytestmark = pytest.mark.usefixtures("chat_settings")

CLOSE_UNAUTHENTICATED = 4401
CLOSE_TOO_MANY_SOCKETS = 4429


@pytest.fixture
def session_lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every session-and-user lookup Channels' auth middleware makes (each one is a hop onto
    the ORM thread): the thing a stranger must not cost."""
    import channels.auth

    calls: list[str] = []
    real = channels.auth.get_user

    async def counting(scope: Any) -> Any:
        calls.append(scope.get("path", ""))
        return await real(scope)

    monkeypatch.setattr(channels.auth, "get_user", counting)
    return calls


async def handshake(cookie: str | None, address: str) -> tuple[bool, int | None]:
    """One handshake on the real ASGI app from `address`; (accepted, close code)."""
    from chatsite.asgi import application

    headers = [(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000")]
    if cookie is not None:
        headers.append((b"cookie", cookie.encode()))
    comm = WebsocketCommunicator(application, "/ws/chat/", headers=headers)
    comm.scope["client"] = (address, 40000)
    connected, code = await comm.connect(timeout=10)
    if connected:
        await comm.disconnect()
    return connected, code


async def test_a_handshake_without_a_session_cookie_is_refused_without_a_lookup(
    session_lookups: list[str],
) -> None:
    for cookie in (None, "", "csrftoken=abc", "sessionid=", "other=1; sessionid="):
        assert await handshake(cookie, "203.0.113.5") == (False, CLOSE_UNAUTHENTICATED), cookie
    assert session_lookups == []


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_an_address_sending_invalid_sessions_in_a_loop_is_refused_before_the_lookup(
    settings: Any, owner: Any, session_lookups: list[str]
) -> None:
    settings.CHAT_STRANGER_SOCKET_RATE = "3/minute"
    valid = "sessionid=" + await database_sync_to_async(session_key_for)(owner)
    attacker, neighbour = "198.51.100.7", "198.51.100.8"
    for _ in range(3):  # forged, expired or logged-out sessions: each costs one lookup
        forged = "sessionid=" + secrets.token_hex(16)
        assert await handshake(forged, attacker) == (False, CLOSE_UNAUTHENTICATED)
    assert len(session_lookups) == 3
    # Over the rate: this address's handshakes are refused before any lookup, even with a
    # valid session (one address, many strangers: the trade-off docs/security.md names).
    assert await handshake("sessionid=" + secrets.token_hex(16), attacker) == (
        False,
        CLOSE_TOO_MANY_SOCKETS,
    )
    assert await handshake(valid, attacker) == (False, CLOSE_TOO_MANY_SOCKETS)
    assert len(session_lookups) == 3
    # Another address, and valid sessions are never counted: the user connects as before.
    for _ in range(5):
        assert (await handshake(valid, neighbour))[0] is True
    assert len(session_lookups) == 8


async def test_over_a_real_socket_strangers_get_refused_handshakes_and_a_neighbour_connects() -> (
    None
):
    """Over daphne: a refused handshake is an HTTP 403 (the browser's "could not connect"),
    the rate's too; a signed-in user on another address (127.0.0.2) is not affected, one on
    the strangers' address is until the window frees (the documented trade-off)."""
    with running_chatsite(CHAT_STRANGER_SOCKET_RATE="2/minute") as base:
        url = f"ws://{base.removeprefix('http://')}/ws/chat/"
        client = signup(base, "neighbour")
        user = {"Cookie": f"sessionid={client.cookies['sessionid']}"}
        statuses = []
        for cookie in [None] + ["sessionid=" + secrets.token_hex(16) for _ in range(4)]:
            headers = {"Cookie": cookie} if cookie else {}
            with pytest.raises(InvalidStatus) as refused:
                async with ws_connect(url, origin=base, additional_headers=headers):  # type: ignore[arg-type]
                    pass
            statuses.append(refused.value.response.status_code)
        assert statuses == [403] * 5
        with pytest.raises(InvalidStatus):
            async with ws_connect(url, origin=base, additional_headers=user):  # type: ignore[arg-type]
                pass
        async with ws_connect(
            url,
            origin=base,  # type: ignore[arg-type]
            additional_headers=user,
            local_addr=("127.0.0.2", 0),
            open_timeout=10,
        ) as socket:
            ready = json.loads(await asyncio.wait_for(socket.recv(), 10))
            assert ready["type"] == "ready"
        client.close()

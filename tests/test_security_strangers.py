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
from websockets.exceptions import ConnectionClosed, InvalidStatus

from chat.socket_caps import LOOKUPS_IN_FLIGHT, LOOKUPS_PER_ADDRESS, stranger_key
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
    """One handshake on the real ASGI app from `address`: (accepted, close code). Accepted to
    be told it is logged out: (True, 4401) after an `unauthenticated` error; a user's socket:
    (True, None)."""
    from chatsite.asgi import application

    headers = [(b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000")]
    if cookie is not None:
        headers.append((b"cookie", cookie.encode()))
    comm = WebsocketCommunicator(application, "/ws/chat/", headers=headers)
    comm.scope["client"] = (address, 40000)
    connected, code = await comm.connect(timeout=10)
    if not connected:
        return False, code
    frame = json.loads(await comm.receive_from(timeout=10))
    if frame["type"] == "ready":
        await comm.disconnect()
        return True, None
    assert frame["type"] == "error" and frame["code"] == "unauthenticated", frame
    closed = await comm.receive_output(timeout=10)
    assert closed["type"] == "websocket.close"
    return True, closed["code"]


@pytest.mark.usefixtures("closed_services")
async def test_a_handshake_without_a_session_cookie_is_refused_without_a_lookup(
    session_lookups: list[str],
) -> None:
    for cookie in (None, "", "csrftoken=abc", "sessionid=", "other=1; sessionid="):
        assert await handshake(cookie, "203.0.113.5") == (False, CLOSE_UNAUTHENTICATED), cookie
    assert session_lookups == []


@pytest.mark.usefixtures("closed_services")
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_an_address_sending_invalid_sessions_in_a_loop_is_refused_before_the_lookup(
    settings: Any, owner: Any, session_lookups: list[str]
) -> None:
    settings.CHAT_STRANGER_SOCKET_RATE = "3/minute"
    valid = "sessionid=" + await database_sync_to_async(session_key_for)(owner)
    attacker, neighbour = "198.51.100.7", "198.51.100.8"
    for _ in range(3):  # forged, expired or logged-out sessions: each costs one lookup, and
        # is told so (4401: the page goes to the login form instead of reconnecting forever)
        forged = "sessionid=" + secrets.token_hex(16)
        assert await handshake(forged, attacker) == (True, CLOSE_UNAUTHENTICATED)
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
        assert await handshake(valid, neighbour) == (True, None)
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
        with pytest.raises(InvalidStatus) as refused:  # no cookie: 403 at once
            async with ws_connect(url, origin=base):  # type: ignore[arg-type]
                pass
        assert refused.value.response.status_code == 403
        for _ in range(2):  # a cookie without a session: told so (4401), and counted
            forged = {"Cookie": "sessionid=" + secrets.token_hex(16)}
            async with ws_connect(url, origin=base, additional_headers=forged) as socket:  # type: ignore[arg-type]
                frame = json.loads(await asyncio.wait_for(socket.recv(), 10))
                assert frame["code"] == "unauthenticated"
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(socket.recv(), 10)
                assert socket.close_code == CLOSE_UNAUTHENTICATED
        for headers in ({"Cookie": "sessionid=" + secrets.token_hex(16)}, user):
            with pytest.raises(InvalidStatus) as refused:  # over the rate: 403, even the user
                async with ws_connect(url, origin=base, additional_headers=headers):  # type: ignore[arg-type]
                    pass
            assert refused.value.response.status_code == 403
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


@pytest.mark.usefixtures("closed_services")
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_a_burst_from_one_address_cannot_run_ahead_of_the_count(
    settings: Any, session_lookups: list[str]
) -> None:
    """The hostile review's burst: 400 forged sessions at once got 319 lookups past a rate of
    30. The lookups of one address now wait their turn, and the rate is checked at it."""
    settings.CHAT_STRANGER_SOCKET_RATE = "3/minute"
    results = await asyncio.gather(
        *(handshake("sessionid=" + secrets.token_hex(16), "192.0.2.9") for _ in range(40))
    )
    # The rate (3), plus the rest of the first turn of the address's slots (4 at once).
    assert LOOKUPS_PER_ADDRESS == 4 and len(session_lookups) <= 3 + 3
    assert results.count((True, CLOSE_UNAUTHENTICATED)) == len(session_lookups)
    assert results.count((False, CLOSE_TOO_MANY_SOCKETS)) == 40 - len(session_lookups)


@pytest.mark.usefixtures("closed_services")
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_many_addresses_at_once_never_have_more_lookups_in_flight_than_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Strangers from many addresses (a botnet, an IPv6 range) each stay under their rate;
    their lookups queue at the gate, never on the ORM thread ahead of a turn's start."""
    import channels.auth

    real = channels.auth.get_user
    in_flight, most = 0, 0

    async def slow(scope: Any) -> Any:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.05)
            return await real(scope)
        finally:
            in_flight -= 1

    monkeypatch.setattr(channels.auth, "get_user", slow)
    results = await asyncio.gather(
        *(handshake("sessionid=" + secrets.token_hex(16), f"10.0.{i}.1") for i in range(60))
    )
    assert results == [(True, CLOSE_UNAUTHENTICATED)] * 60  # all answered, none lost
    assert most == LOOKUPS_IN_FLIGHT


def test_an_ipv6_host_counts_by_its_64_and_ipv4_as_itself() -> None:
    assert stranger_key("2001:db8:1:2:aaaa::1") == stranger_key("2001:db8:1:2:bbbb::9")
    assert stranger_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert stranger_key("2001:db8:1:3::1") != stranger_key("2001:db8:1:2::1")
    assert stranger_key("::ffff:198.51.100.7") == "198.51.100.7"
    assert stranger_key("198.51.100.7") == "198.51.100.7"
    assert stranger_key("unknown") == "unknown"

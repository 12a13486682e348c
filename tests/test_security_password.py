"""An open socket does not survive a password change (issue 13, finding 3).

The review opened a socket with a stolen session; after the victim changed their password it
kept receiving the victim's new exchanges, could `resume` their answers and could prompt.
Here, on two real daphne instances sharing PostgreSQL and Redis: a password changed through
the admin's own form closes the other sessions' sockets on both instances (4401), and a
password changed behind the signals' back (a bulk update, a lost event) still refuses the
stolen socket its next prompt, resume or delivered exchange.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from django.contrib.auth.hashers import make_password
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from tests.servers import signup
from tests.test_daphne import (
    PAIR_ENV,
    POSTGRES_ADMIN_URL,
    Pair,
    chat_socket,
    handshake_status,
    new_username,
    postgres_available,
    read_answer,
    ready,
    send_prompt,
    two_instances,
)

PASSWORD = "a-long-test-passphrase-42"
CLOSE_UNAUTHENTICATED = 4401


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    if not postgres_available():
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL}")
    # Titles on: a conversation's title, generated after its first answer, is news for every
    # tab of the user too, and must not reach a socket whose session no longer verifies.
    env = {**PAIR_ENV, "CHAT_RATE_LIMIT": "100/minute", "CHAT_TITLES": "1"}
    with two_instances(**env) as instances:
        yield instances


def login(base: str, username: str, password: str = PASSWORD) -> httpx.Client:
    """Log in through the real form: another session of the same user (another device)."""
    client = httpx.Client(base_url=base, follow_redirects=True, timeout=10)
    client.get("/accounts/login/")
    response = client.post(
        "/accounts/login/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
    )
    response.raise_for_status()
    assert "sessionid" in client.cookies, "the login failed"
    return client


def sql(database_url: str, query: str, *params: Any) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(query, params)


def change_password_in_the_admin(client: httpx.Client, new: str) -> None:
    """The admin's own "Change password" form, as a staff user fills it in."""
    page = client.get("/admin/password_change/")
    assert page.status_code == 200, page.status_code
    response = client.post(
        "/admin/password_change/",
        data={
            "old_password": PASSWORD,
            "new_password1": new,
            "new_password2": new,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
    )
    assert response.status_code == 200 and "/admin/password_change/done/" in str(response.url)


async def expect_closed_unauthenticated(ws: ClientConnection) -> list[str]:
    """The socket says why and closes with 4401; returns the HTML frames it got meanwhile."""
    html: list[str] = []
    told = False
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            raw = await asyncio.wait_for(ws.recv(), 10)
            assert isinstance(raw, str)
            if not raw.startswith("{"):
                html.append(raw)
                continue
            frame = json.loads(raw)
            assert frame["type"] in ("error", "ready"), frame
            told = told or frame.get("code") == "unauthenticated"
    assert told, "no `unauthenticated` error before the close"
    assert closed.value.rcvd is not None and closed.value.rcvd.code == CLOSE_UNAUTHENTICATED
    return html


async def sidebar_title(ws: ClientConnection, title: str) -> None:
    """Wait for the conversation's new title in this tab's sidebar."""
    while True:
        raw = await asyncio.wait_for(ws.recv(), 15)
        if isinstance(raw, str) and not raw.startswith("{") and title in raw:
            return


@pytest.mark.timeout(120)
async def test_a_password_change_closes_the_other_sessions_sockets_on_every_instance(
    pair: Pair,
) -> None:
    username = new_username()
    victim = await asyncio.to_thread(signup, pair.web1.base, username)
    sql(pair.database_url, "UPDATE auth_user SET is_staff = true WHERE username = %s", username)
    # The attacker holds another session of the victim (stolen from another device).
    stolen = await asyncio.to_thread(login, pair.web2.base, username)
    async with (
        chat_socket(pair.web1.base, stolen) as on_web1,
        chat_socket(pair.web2.base, stolen) as on_web2,
    ):
        await ready(on_web1)
        await ready(on_web2)
        await asyncio.to_thread(change_password_in_the_admin, victim, "a-new-passphrase-77-x")
        # Within seconds, on both instances, without the attacker sending anything.
        await expect_closed_unauthenticated(on_web1)
        await expect_closed_unauthenticated(on_web2)
    # The stolen session gets no new socket (told it is logged out, 4401); the victim's own
    # session goes on.
    async with chat_socket(pair.web2.base, stolen, origin="same") as again:
        await expect_closed_unauthenticated(again)
    assert await handshake_status(pair.web1.base, victim, "same") == "open"
    victim.close()
    stolen.close()


@pytest.mark.timeout(120)
async def test_a_password_changed_behind_the_signals_back_still_locks_the_stolen_socket_out(
    pair: Pair,
) -> None:
    username = new_username()
    victim = await asyncio.to_thread(signup, pair.web1.base, username)
    stolen = await asyncio.to_thread(login, pair.web2.base, username)
    async with chat_socket(pair.web1.base, victim) as mine:
        await ready(mine)
        await send_prompt(mine, "/echo my private answer")
        answer = await read_answer(mine)
        assert answer.done is not None and answer.done["status"] == "complete"
        # The conversation's title follows its first answer; it goes to every tab whose
        # session still verifies, which the stolen ones do until the password changes. Let it
        # land first, so that what the stolen sockets get afterwards is only what they must not.
        await sidebar_title(mine, "My private answer")

    async with (
        chat_socket(pair.web2.base, stolen) as resumer,
        chat_socket(pair.web2.base, stolen) as prompter,
        chat_socket(pair.web1.base, stolen) as listener,
    ):
        for ws in (resumer, prompter, listener):
            await ready(ws)
        # A bulk update sends no signal (a script, an event lost while Redis was away): only
        # the per-frame session check stands between the stolen socket and the account.
        sql(
            pair.database_url,
            "UPDATE auth_user SET password = %s WHERE username = %s",
            make_password("a-new-passphrase-77-y"),
            username,
        )
        await resumer.send(json.dumps({"type": "resume", "mid": answer.mid, "after": -1}))
        html = await expect_closed_unauthenticated(resumer)
        assert not any("my private answer" in h for h in html)

        await send_prompt(prompter, "/echo sent with a stolen session")
        assert await expect_closed_unauthenticated(prompter) == []

        # The victim logs in with the new password and asks something: the stolen socket
        # that only listens is closed instead of being handed the new exchange.
        fresh = await asyncio.to_thread(login, pair.web1.base, username, "a-new-passphrase-77-y")
        async with chat_socket(pair.web1.base, fresh) as own:
            await ready(own)
            await send_prompt(own, "/echo a secret after the change")
            mine_again = await read_answer(own)
            assert mine_again.done is not None and mine_again.done["status"] == "complete"
        html = await expect_closed_unauthenticated(listener)
        assert not any(re.search("secret after the change", h) for h in html)
        fresh.close()
    victim.close()
    stolen.close()

"""Authentication on the chat socket: who may open one, and who loses it (and when).

Origin checks over a real socket live with the daphne tests; these cover the session: no
session, a logout, a deactivation, and the production settings that keep the origin check on.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from chat.models import Message
from tests.conftest import receive_until_done
from tests.demo_server import demo_stats, running_demo_server
from tests.servers import ROOT, running_chatsite, signup

pytestmark = pytest.mark.usefixtures("chat_settings")

CLOSE_UNAUTHENTICATED = 4401


@pytest.fixture(scope="module")
def counting_upstream() -> Iterator[str]:
    """The demo model with its request counters, to prove no upstream call was made."""
    with running_demo_server(stats=True) as url:
        yield url


def prompt(text: str) -> str:
    return json.dumps({"type": "prompt", "conversation": "", "text": text})


async def expect_logged_out(comm: WebsocketCommunicator) -> None:
    """The socket says why, then closes with 4401 — within a few seconds, not at its next use."""
    frame = json.loads(await comm.receive_from(timeout=5))
    assert frame["type"] == "error" and frame["code"] == "unauthenticated", frame
    closed = await comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}


def logged_in_client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def session_cookie(client: Client) -> list[tuple[bytes, bytes]]:
    return [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


async def test_a_socket_without_a_session_or_with_a_forged_one_is_refused(connect: Any) -> None:
    assert not (await connect(None, expect_ready=False)).connected
    forged = [(b"cookie", b"sessionid=" + secrets.token_hex(16).encode())]
    # A cookie without a session (forged, expired) is told so: its tab goes to the login form.
    await expect_logged_out(await connect(None, extra_headers=forged, expect_ready=False))


async def test_logging_out_closes_every_open_socket_of_that_session_within_seconds(
    connect: Any, owner: Any, other_user: Any, settings: Any, counting_upstream: str
) -> None:
    settings.LLM_BASE_URL = counting_upstream
    client = await database_sync_to_async(logged_in_client)(owner)
    tabs = [await connect(None, extra_headers=session_cookie(client)) for _ in range(2)]
    bystander = await connect(other_user)
    started = demo_stats(counting_upstream)["started"]

    # The real logout view (POST, as the page's form does); its signal closes the sockets.
    response = await database_sync_to_async(client.post)("/accounts/logout/")
    assert response.status_code == 302
    # A prompt racing the logout on the first tab is refused too: the session is re-checked.
    await tabs[0].send_to(text_data=prompt("/echo sneaky"))
    for tab in tabs:
        await expect_logged_out(tab)

    assert demo_stats(counting_upstream)["started"] == started, "an upstream call was made"
    assert await database_sync_to_async(Message.objects.count)() == 0
    # Someone else's socket is not touched.
    await bystander.send_to(text_data=prompt("/echo still here"))
    assert (await receive_until_done(bystander))["text"] == "still here"


async def test_a_user_deactivated_in_the_admin_loses_their_open_sockets(
    connect: Any, owner: Any, settings: Any, counting_upstream: str
) -> None:
    settings.LLM_BASE_URL = counting_upstream
    comm = await connect(owner)
    started = demo_stats(counting_upstream)["started"]

    def deactivate() -> None:
        # What the admin's change form does on save: the model's save(), hence post_save.
        user = get_user_model().objects.get(pk=owner.pk)
        user.is_active = False
        user.save()

    await database_sync_to_async(deactivate)()
    await expect_logged_out(comm)
    # A new socket with the same session is told it is logged out: the user is inactive.
    await expect_logged_out(await connect(owner, expect_ready=False))
    assert demo_stats(counting_upstream)["started"] == started


async def test_a_deactivation_that_skips_signals_still_refuses_the_next_prompt(
    connect: Any, owner: Any, settings: Any, counting_upstream: str
) -> None:
    # queryset.update() sends no post_save (a bulk edit, a script): the per-prompt session
    # check is the second lock.
    settings.LLM_BASE_URL = counting_upstream
    comm = await connect(owner)
    started = demo_stats(counting_upstream)["started"]
    await database_sync_to_async(get_user_model().objects.filter(pk=owner.pk).update)(
        is_active=False
    )
    await comm.send_to(text_data=prompt("/echo should not be answered"))
    await expect_logged_out(comm)
    assert demo_stats(counting_upstream)["started"] == started
    assert await database_sync_to_async(Message.objects.count)() == 0


async def test_logging_out_in_the_browser_closes_a_real_socket_on_daphne() -> None:
    with running_chatsite() as base:
        client = signup(base, "leaver")
        host = base.removeprefix("http://")
        async with ws_connect(
            f"ws://{host}/ws/chat/",
            origin=base,  # type: ignore[arg-type]
            additional_headers={"Cookie": f"sessionid={client.cookies['sessionid']}"},
            open_timeout=10,
        ) as socket:
            ready = json.loads(await asyncio.wait_for(socket.recv(), 10))
            assert ready["type"] == "ready"
            token = client.cookies["csrftoken"]
            response = await asyncio.to_thread(
                client.post,
                "/accounts/logout/",
                data={"csrfmiddlewaretoken": token},
                follow_redirects=False,
            )
            assert response.status_code == 302
            frame = json.loads(await asyncio.wait_for(socket.recv(), 5))
            assert frame["code"] == "unauthenticated"
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(socket.recv(), 5)
            assert socket.close_code == CLOSE_UNAUTHENTICATED
        client.close()


# --- production settings -----------------------------------------------------------------


def run_settings(**env: str) -> subprocess.CompletedProcess[str]:
    """Load the settings in a fresh interpreter with exactly this environment."""
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CHAT_", "REDIS"))
    }
    environment.update(DJANGO_SETTINGS_MODULE="chatsite.settings", **env)
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); print('loaded')"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


PRODUCTION = {
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
    "DJANGO_ALLOWED_HOSTS": "chat.example.com",
}


def test_production_settings_load_with_a_key_and_named_hosts() -> None:
    # The control: the two refusals below fail for their reason, not for any other.
    result = run_settings(**PRODUCTION)
    assert result.returncode == 0, result.stderr
    assert "loaded" in result.stdout


def test_production_settings_refuse_allowed_hosts_star() -> None:
    # '*' would switch off the websocket origin check (AllowedHostsOriginValidator).
    result = run_settings(**{**PRODUCTION, "DJANGO_ALLOWED_HOSTS": "chat.example.com,*"})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "DJANGO_ALLOWED_HOSTS" in result.stderr


def test_production_settings_refuse_a_missing_secret_key() -> None:
    env = {k: v for k, v in PRODUCTION.items() if k != "DJANGO_SECRET_KEY"}
    result = run_settings(**env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "DJANGO_SECRET_KEY" in result.stderr
    # An empty value is no better than a missing one.
    result = run_settings(**{**PRODUCTION, "DJANGO_SECRET_KEY": ""})
    assert result.returncode != 0 and "DJANGO_SECRET_KEY" in result.stderr


@pytest.mark.django_db
def test_the_logout_view_ignores_a_get(owner: Any) -> None:
    # A GET (say an <img src=/accounts/logout/> on another site) must not log anyone out.
    client = logged_in_client(owner)
    assert client.get("/accounts/logout/").status_code == 405
    assert client.get("/").status_code == 200

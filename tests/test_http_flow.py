"""A streamed HTTP response waits for its reader on a real daphne (chat/ops/http_flow.py).

The hostile review: an account export's slot came back once its whole body was handed to
daphne, about 4 s after the request, while a client that never read kept it all in daphne's
memory; one user could start unread exports one after another (12 in a minute: +536 MB). Here a
raw socket that reads nothing asks for the export; the export must keep its slot (the next one
is refused) for as long as that client is there, and give it back once the client goes.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import struct
import time
from pathlib import Path

import httpx
import pytest

from tests.servers import migrated_sqlite, signup
from tests.test_daphne import (
    chat_socket,
    daphne_instance,
    new_username,
    read_answer,
    ready,
    send_prompt,
)

pytestmark = pytest.mark.timeout(300)
SEND_BUFFER = 4 * 2**20  # CHAT_SEND_BUFFER_BYTES by default


async def long_answers(base: str, client: httpx.Client, count: int) -> None:
    async with chat_socket(base, client, max_size=None) as ws:  # the final HTML is ~2.6 MB
        await ready(ws)
        for _ in range(count):
            await send_prompt(ws, "/long 200000")
            answer = await read_answer(ws, timeout=120)
            assert answer.done is not None and answer.done["status"] == "complete"


def grow_the_answers(database_url: str, times: int) -> None:
    """Make the stored answers `times` as long, in the server's SQLite file (streaming that much
    would take minutes): the export reads them from there."""
    with sqlite3.connect(database_url.removeprefix("sqlite:///")) as db:
        db.execute("UPDATE chat_message SET text = " + " || ".join(["text"] * times))


def unread_request(base: str, client: httpx.Client, path: str) -> socket.socket:
    """Send a GET with the client's cookies over a socket that will read nothing."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a receive window of ~8 KiB
    sock.connect((host, int(port)))
    cookies = "; ".join(f"{name}={value}" for name, value in client.cookies.items())
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nCookie: {cookies}\r\n\r\n".encode())
    return sock


def export_status(client: httpx.Client) -> int:
    with client.stream("GET", "/settings/export.json") as response:
        response.read()
        return response.status_code


def test_an_unread_export_keeps_its_slot_until_its_client_goes(
    tmp_path: Path,
) -> None:
    database_url = migrated_sqlite(tmp_path)
    with daphne_instance(
        "web1",
        database_url=database_url,
        CHAT_DAILY_TOKENS="0",  # no quota: answers as long as the demo makes them
        CHAT_RATE_LIMIT="1000/minute",
    ) as server:
        client = signup(server.base, new_username())
        asyncio.run(long_answers(server.base, client, 1))
        grow_the_answers(database_url, times=8)
        with client.stream("GET", "/settings/export.json") as whole:
            size = len(whole.read())
        assert size > 2 * SEND_BUFFER  # the body is far bigger than what daphne may hold

        stalled = unread_request(server.base, client, "/settings/export.json")
        try:
            # Before: the body was all in daphne within ~4 s and the slot came back.
            time.sleep(8)
            # The unread export still holds its slot: it waits in its `send` for the reader,
            # with at most CHAT_SEND_BUFFER_BYTES of its body in daphne.
            assert export_status(client) == 429
        finally:
            # The client goes away without a goodbye (a reset), as a dropped download does.
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            stalled.close()
        deadline = time.monotonic() + 30
        while (status := export_status(client)) == 429 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert status == 200  # the slot came back with the client's going
        assert "Traceback" not in server.log(), server.log()[-3000:]

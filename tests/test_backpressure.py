"""A tab that stops reading, on a real daphne over a real socket: daphne's buffer is bounded.

Under daphne a consumer's `send` never waits: every frame goes into Twisted's transport, which
buffers without limit (daphne #170). chat/sockets/backpressure.py aborts a websocket once the bytes
waiting for it in user space pass `CHAT_SEND_BUFFER_BYTES`. These tests prove it from the
outside: a raw client socket with a tiny receive buffer (set before connecting, so the kernel
cannot autotune it up) asks for several of the demo model's longest answers (`/long 200000`,
~3.9 MB of frames each: 1.3 MB of chunks, then 2.6 MB of final HTML) and stops reading. That
is far more than the kernel can absorb (the client's 8 KiB or so plus the server's send
buffer, at most `net.ipv4.tcp_wmem`'s 4 MiB; ~2 MB was seen), so the rest piles up in daphne
unless something cuts the connection.

And the other side: a tab that does read gets a 200,000-token answer whole with the default
limit, and the queued-bytes arithmetic is checked against a real Twisted TCP transport.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import socket
import sqlite3
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chat.sockets.backpressure import queued_bytes, transport_queued_bytes
from tests.conftest import DESKTOP_UA
from tests.demo_server import running_demo_server
from tests.servers import migrated_sqlite, signup
from tests.test_daphne import (
    Instance,
    chat_socket,
    daphne_instance,
    daphne_rss_kib,
    new_username,
    read_answer,
    ready,
    send_prompt,
)

LONGEST = 200_000  # the demo model's maximum /long
ANSWERS = 6  # /long 200000 prompts per phase: ~23 MB of frames for the stalled tab
SMALL_LIMIT = 256 * 1024  # CHAT_SEND_BUFFER_BYTES for the stalled tab's server
CLIENT_RCVBUF = 4096  # the kernel doubles it: ~8 KiB of receive window
CUT_LOG = "aborting a websocket that stopped reading"
CUT_METRIC = "chat_ws_slow_reader_closed_total"
# What the stalled tab's phase may grow daphne by, beyond what the same number of answers grew
# it with no tab at all (that varies from ~1 to ~16 MiB from run to run: the allocator). The
# cap lets one tab hold the limit plus one frame written just under it (at most the final
# HTML of one answer, ~2.6 MB); the phase also runs a short answer for the tab beside it.
# Measured with the cap: +1 to +9 MiB. Without it (CHAT_SEND_BUFFER_BYTES=1 GiB, same run):
# +54 MiB — the kernel took ~2 MB of the ~23 MB sent, daphne kept the rest, about twice
# over (the encoded payload, the frame, Twisted's joined buffer). docs/security.md.
RSS_SLACK_MIB = 12


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """The demo model in a process of its own (its work is not the server's memory)."""
    with running_demo_server(ttfb_ms=0, tps=0) as url:
        yield url


def demo_answer(upstream: str, tokens: int) -> str:
    """What the demo model itself answers to `/long N`, asked directly (not streamed)."""
    response = httpx.post(
        f"{upstream}/chat/completions",
        json={"model": "demo-full", "messages": [{"role": "user", "content": f"/long {tokens}"}]},
        timeout=60,
        trust_env=False,
    )
    response.raise_for_status()
    content: str = response.json()["choices"][0]["message"]["content"]
    return content


@contextlib.contextmanager
def chatsite(upstream: str, **env: str) -> Iterator[tuple[Instance, Path]]:
    """A daphne of our own (its log and its SQLite file are read by the tests)."""
    workdir = Path(tempfile.mkdtemp(prefix="chatsite-backpressure-"))
    database_url = migrated_sqlite(workdir)
    settings = {
        "LLM_BASE_URL": upstream,
        "CHAT_MAX_CONCURRENT_STREAMS": "20",
        "CHAT_RATE_LIMIT": "1000/minute",
        "CHAT_DAILY_TOKENS": "0",
        "DATABASE_CONN_MAX_AGE": "60",
        "CHAT_SHUTDOWN_GRACE": "0",
        # RSS is this file's measure, so keep glibc's allocator from blurring it: by default
        # it raises its mmap threshold each time a big block is freed (up to 32 MiB), after
        # which the answers' megabyte strings come from heap arenas that keep their pages
        # (+42 MiB once, on a loaded machine, with the cut working). A fixed threshold sends
        # every block over 128 KiB to mmap and back to the kernel when it is freed; bytes that
        # daphne really holds for a stalled tab are in RSS either way.
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "MALLOC_ARENA_MAX": "2",
        **env,
    }
    with daphne_instance("web1", database_url=database_url, **settings) as instance:
        yield instance, workdir / "db.sqlite3"


# --- a websocket client on a raw socket -----------------------------------------------------


class RawTab:
    """A tab speaking websocket over a plain socket whose reading the test controls.

    `websockets` (or a browser) keeps reading the socket into its own buffers whatever the
    application does; here nothing is read unless the test reads it, and the receive buffer
    is set small before connecting, so the TCP window really closes.
    """

    def __init__(self, base: str, session: str, *, rcvbuf: int | None = None) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            # Before connect(): the window scale is agreed in the SYN, and a set size turns
            # the kernel's receive-buffer autotuning off.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(30)
        self.sock.connect((host, int(port)))
        self.buffer = b""
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET /ws/chat/ HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Origin: {base}\r\nCookie: sessionid={session}\r\nUser-Agent: {DESKTOP_UA}\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        accept = base64.b64encode(
            hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
        )
        headers = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
        received = {k.strip().lower(): v.strip() for k, v in headers.items()}
        assert received[b"sec-websocket-accept"] == accept, head

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("the server closed the connection")
        self.buffer += data

    def _take(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self._fill()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def send_text(self, text: str) -> None:
        payload = text.encode()
        mask = os.urandom(4)
        length = len(payload)
        if length < 126:
            header = struct.pack("!BB", 0x81, 0x80 | length)
        elif length < 65536:
            header = struct.pack("!BBH", 0x81, 0x80 | 126, length)
        else:
            header = struct.pack("!BBQ", 0x81, 0x80 | 127, length)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def recv_frame(self) -> tuple[int, bytes]:
        first, second = self._take(2)
        length = second & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", self._take(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", self._take(8))
        return first & 0x0F, self._take(length)

    def next_json(self) -> dict[str, Any]:
        while True:
            opcode, payload = self.recv_frame()
            if opcode == 0x1 and payload.startswith(b"{"):
                frame: dict[str, Any] = json.loads(payload)
                return frame

    def read_until_cut(self, limit: int) -> tuple[int, str]:
        """Read what is left until the connection ends: (bytes read, how it ended)."""
        read = len(self.buffer)
        self.buffer = b""
        self.sock.settimeout(60)
        while read <= limit:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return read, "reset"
            except TimeoutError:
                return read, "timeout"
            if not data:
                return read, "eof"
            read += len(data)
        return read, "still open"

    def close(self) -> None:
        self.sock.close()


def prompt(text: str) -> str:
    return json.dumps({"type": "prompt", "conversation": "", "text": text})


# --- what the server says about itself --------------------------------------------------------


def metric(base: str, name: str) -> float:
    response = httpx.get(f"{base}/metrics", timeout=10, trust_env=False)  # 127.0.0.1: allowed
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return float(sample.value)
    return 0.0


def _assistant_messages(database: Path, username: str, columns: str) -> list[tuple[Any, ...]]:
    """`columns` of the user's assistant messages, oldest first."""
    with contextlib.closing(sqlite3.connect(database, timeout=30)) as db:
        return db.execute(
            f"SELECT {columns} FROM chat_message m "  # the columns are ours, never input
            "JOIN chat_conversation c ON m.conversation_id = c.id "
            "JOIN auth_user u ON c.user_id = u.id "
            "WHERE u.username = ? AND m.role = 'assistant' ORDER BY m.id",
            (username,),
        ).fetchall()


def answers_of(database: Path, username: str) -> list[tuple[str, str]]:
    """(status, text) of the user's assistant messages."""
    rows = _assistant_messages(database, username, "m.status, m.text")
    return [(str(status), str(text)) for status, text in rows]


def statuses_of(database: Path, username: str) -> list[str]:
    """Their statuses only: polled while answers of megabytes are being written."""
    return [str(status) for (status,) in _assistant_messages(database, username, "m.status")]


async def eventually(condition: Any, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await asyncio.to_thread(condition):
        assert loop.time() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.25)


def server_queue_bytes(port: int) -> int:
    """Bytes in the kernel's send queues of the server's side of its TCP connections."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port:
            total += int(fields[4].split(":")[0], 16)
    return total


# --- the tests --------------------------------------------------------------------------------


async def answers_finished(database: Path, username: str, count: int) -> None:
    def finished() -> bool:
        statuses = statuses_of(database, username)
        return len(statuses) == count and "streaming" not in statuses

    await eventually(finished, 300, f"{count} answers of {username} finished")


async def answers_without_a_tab(base: str, database: Path, count: int) -> None:
    """A tab asks for `count` long answers and leaves at once; the turns finish without it.

    What the process keeps or grows for the answers themselves (turns, rendering, the
    in-memory stream log), with no socket to send them to.
    """
    username = new_username()
    client = await asyncio.to_thread(signup, base, username)
    tab = RawTab(base, client.cookies["sessionid"])
    assert tab.next_json()["type"] == "ready"
    for _ in range(count):
        tab.send_text(prompt(f"/long {LONGEST}"))
    await eventually(lambda: len(statuses_of(database, username)) == count, 60, "prompts taken")
    tab.close()
    await answers_finished(database, username, count)


@dataclass
class Stalled:
    """What one run of a stalled tab showed (the test asserts; a manual run prints)."""

    username: str
    rss_kib: dict[str, int] = field(default_factory=dict)
    cut_line: str | None = None
    read_after_cut: int = 0
    ending: str = ""
    beside: Any = None
    # The server's log and cut count when the stalled tab came: a warm-up tab, which reads
    # nothing either until it leaves, may be cut too on a loaded machine (and rightly so).
    log_before: int = 0
    cuts_before: float = 0

    def growth_mib(self, since: str, until: str) -> float:
        """RSS growth between two samples; "peak before" is the higher of the two before the
        stalled tab came (warm, answers alone)."""
        before = max(self.rss_kib.get("warm", 0), self.rss_kib.get("answers alone", 0))
        rss = {**self.rss_kib, "peak before": before}
        return (rss[until] - rss[since]) / 1024

    def report(self) -> str:
        return (
            f"daphne RSS (MiB): {', '.join(f'{k} {v / 1024:.1f}' for k, v in self.rss_kib.items())}"
            f"; answers alone +{self.growth_mib('warm', 'answers alone'):.1f} MiB, with the "
            f"stalled tab +{self.growth_mib('peak before', 'stalled tab'):.1f} MiB; "
            f"cut: {self.cut_line}; the tab then read {self.read_after_cut} bytes and saw "
            f"{self.ending or '(not read)'}"
        )


async def stall_a_tab(server: Instance, database: Path, *, expect_cut: bool) -> Stalled:
    """Warm up; ANSWERS answers with no tab; then ANSWERS answers for a tab that stops reading.

    RSS is read after each phase, once every answer is finished and saved: the growth of the
    last phase beyond the one before is what the stalled tab costs.
    """
    base = server.base
    await answers_without_a_tab(base, database, ANSWERS)  # warm-up: caches, allocator arenas
    await asyncio.sleep(1)
    seen = Stalled(new_username())
    seen.rss_kib["warm"] = daphne_rss_kib(base)
    await answers_without_a_tab(base, database, ANSWERS)
    await asyncio.sleep(1)
    seen.rss_kib["answers alone"] = daphne_rss_kib(base)

    seen.log_before = len(server.log())
    seen.cuts_before = metric(base, CUT_METRIC)
    slow_client = await asyncio.to_thread(signup, base, seen.username)
    # The tab beside it signs up first: while six answers stream at full speed, a signup page
    # competes with them for the one process (and on a loaded machine took over 10 s).
    other_client = await asyncio.to_thread(signup, base, new_username())
    tab = RawTab(base, slow_client.cookies["sessionid"], rcvbuf=CLIENT_RCVBUF)
    try:
        assert tab.next_json()["type"] == "ready"
        for _ in range(ANSWERS):
            tab.send_text(prompt(f"/long {LONGEST}"))
        # ... and the tab reads nothing more.

        # Another tab on the same server streams normally meanwhile.
        async with chat_socket(base, other_client, max_size=None) as ws:
            await ready(ws)
            await send_prompt(ws, "/long 2000")
            seen.beside = await read_answer(ws, timeout=120)

        if expect_cut:
            await eventually(
                lambda: CUT_LOG in server.log()[seen.log_before :], 240, "the cut is logged"
            )
            stalled_log = server.log()[seen.log_before :]
            seen.cut_line = next(ln for ln in stalled_log.splitlines() if CUT_LOG in ln).strip()
        await answers_finished(database, seen.username, ANSWERS)
        await asyncio.sleep(1)
        seen.rss_kib["stalled tab"] = daphne_rss_kib(base)
        if expect_cut:
            # The tab, reading again, gets what was in its own receive buffer, then a reset
            # (or an end of stream): neither the rest of its answers nor a close frame.
            seen.read_after_cut, seen.ending = await asyncio.to_thread(
                tab.read_until_cut, 8 * 1024 * 1024
            )
    finally:
        tab.close()
    return seen


@pytest.mark.timeout(600)
async def test_a_tab_that_stops_reading_is_aborted_and_daphne_stays_bounded(
    upstream: str,
) -> None:
    expected = await asyncio.to_thread(demo_answer, upstream, LONGEST)
    with chatsite(upstream, CHAT_SEND_BUFFER_BYTES=str(SMALL_LIMIT)) as (server, database):
        seen = await stall_a_tab(server, database, expect_cut=True)
        print(f"\n{seen.report()}")
        log = server.log()[seen.log_before :]
        # The server cut the stalled tab, said so once, and counted it.
        assert log.count(CUT_LOG) == 1, log
        assert metric(server.base, CUT_METRIC) == seen.cuts_before + 1
        # The tab saw its connection aborted (its 4408 close frame sat behind what it never read,
        # and went with the abort), the rest of its answers dropped.
        assert seen.ending in ("reset", "eof"), seen.report()
        # The connection is gone on the server's side too, with its kernel send queue.
        assert server_queue_bytes(int(server.base.rsplit(":", 1)[1])) < 64 * 1024
        # The tab beside it got its whole answer.
        beside = seen.beside
        assert beside.done is not None and beside.done["status"] == "complete"
        assert len(beside.text.split()) == 2000 and expected.startswith(beside.text)
        # The turns went on without the stalled tab: every answer is complete and saved.
        rows = answers_of(database, seen.username)
        assert [status for status, _ in rows] == ["complete"] * ANSWERS
        assert all(text == expected for _, text in rows)

    # Growth beyond the highest the process was before the stalled tab: the allocator may give
    # memory back between phases (answers alone once read 16.6 MiB below warm, on a loaded
    # machine) and the next phase re-grow into it, which is not memory the tab holds.
    answers_alone = max(0.0, seen.growth_mib("warm", "answers alone"))
    stalled = seen.growth_mib("peak before", "stalled tab")
    assert stalled < answers_alone + RSS_SLACK_MIB, seen.report()


@pytest.mark.timeout(300)
async def test_a_tab_that_reads_gets_a_200000_token_answer_whole_with_the_default_limit(
    upstream: str,
) -> None:
    expected = await asyncio.to_thread(demo_answer, upstream, LONGEST)
    with chatsite(upstream) as (server, database):
        user = new_username()
        client = await asyncio.to_thread(signup, server.base, user)
        async with chat_socket(server.base, client, max_size=None) as ws:
            await ready(ws)
            await send_prompt(ws, f"/long {LONGEST}")
            answer = await read_answer(ws, timeout=240)
            assert answer.done is not None
            assert answer.done["status"] == "complete"
            assert answer.text == expected
            assert answer.done["seq"] == len(answer.chunks)
            # The final rendered answer came too, though it is one frame over daphne's 1 MiB
            # message limit (~2.6 MB): that limit is for what clients send, and autobahn
            # applied it to what we send, killing the socket's sender (sockets/backpressure.py).
            final = [h for h in answer.html if f'data-mid="{answer.mid}"' in h]
            assert any('data-status="complete"' in h and len(h) > 1024 * 1024 for h in final)
            # Still open: a short prompt on the same socket is answered.
            await send_prompt(ws, "/echo still here")
            after = await read_answer(ws, timeout=60)
        assert after.text == "still here"
        assert CUT_LOG not in server.log()
        assert metric(server.base, CUT_METRIC) == 0
        assert answers_of(database, user)[0] == ("complete", expected)


def test_queued_bytes_reads_a_real_twisted_tcp_transport() -> None:
    """chat.sockets.backpressure's arithmetic on twisted.internet.tcp, with no reactor run.

    A connected TCP transport whose peer reads nothing: `write` only queues (the reactor is
    never run, so nothing is written), then `doWrite` hands the kernel what it takes and the
    rest must still be counted, `offset` and all.
    """
    from twisted.internet import tcp

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(listener.getsockname())
    server_side, _ = listener.accept()
    server_side.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    server_side.setblocking(False)

    class Reactor:  # what tcp.Connection asks of a reactor here: nothing is scheduled
        def addWriter(self, _: Any) -> None: ...
        def removeWriter(self, _: Any) -> None: ...
        def addReader(self, _: Any) -> None: ...
        def removeReader(self, _: Any) -> None: ...

    transport = tcp.Connection(server_side, protocol=None, reactor=Reactor())  # type: ignore[arg-type]
    transport.connected = 1
    try:
        assert transport_queued_bytes(transport) == 0
        transport.write(b"a" * 100_000)
        transport.writeSequence([b"b" * 50_000, b"c" * 50_000])
        assert transport_queued_bytes(transport) == 200_000  # all in _tempDataBuffer

        transport.doWrite()  # the kernel takes some (its buffers are small), not all
        taken = transport.offset
        assert 0 < taken < 200_000
        assert transport_queued_bytes(transport) == 200_000 - taken
        transport.write(b"d" * 1000)  # on top of a partly written dataBuffer
        assert transport_queued_bytes(transport) == 200_000 - taken + 1000

        # Through a wrapper (TLS is one), and for a protocol with autobahn's send queue.
        class Wrapper:
            def __init__(self, inner: Any) -> None:
                self.transport = inner

        class Protocol:
            def __init__(self, inner: Any) -> None:
                self.transport = inner
                self.send_queue = [(b"e" * 10, False)]

        assert transport_queued_bytes(Wrapper(transport)) == 200_000 - taken + 1000
        assert queued_bytes(Protocol(Wrapper(transport))) == 200_000 - taken + 1000 + 10
        assert transport_queued_bytes(object()) is None
        assert transport_queued_bytes(None) is None
    finally:
        for s in (server_side, client, listener):
            s.close()


def test_the_wrapper_is_installed_once_and_cuts_only_past_the_limit(settings: Any) -> None:
    """serverSend: under the limit the frame goes out; past it the socket is cut once.

    And a frame over daphne's incoming message limit still goes out (autobahn would raise).
    """
    from daphne.ws_protocol import WebSocketProtocol

    from chat import metrics
    from chat.sockets import backpressure

    backpressure.install()
    wrapped = WebSocketProtocol.serverSend
    backpressure.install()
    assert WebSocketProtocol.serverSend is wrapped
    assert getattr(wrapped, "bounds_queued_bytes", False)

    settings.CHAT_SEND_BUFFER_BYTES = 1000
    sent: list[bytes] = []

    class Transport:
        dataBuffer = b""
        offset = 0
        _tempDataLen = 0
        aborted = 0

        def abortConnection(self) -> None:
            self.aborted += 1

    protocol = WebSocketProtocol.__new__(WebSocketProtocol)
    protocol.transport = Transport()
    protocol.state = WebSocketProtocol.STATE_OPEN
    protocol.client_addr = ["127.0.0.1", 5]
    protocol.send_queue = []
    protocol.maxMessagePayloadSize = 100  # daphne's incoming limit, here below a frame's size
    limits_seen: list[int] = []

    def send_message(payload: bytes, binary: bool) -> None:
        limits_seen.append(protocol.maxMessagePayloadSize)
        sent.append(payload)
        protocol.transport._tempDataLen += len(payload)

    protocol.sendMessage = send_message
    closes: list[int] = []
    protocol.sendClose = lambda code, reason: closes.append(code)
    before = metrics.ws_slow_reader_closed._value.get()
    for _ in range(5):
        protocol.serverSend("x" * 400)
    # 0, 400, 800 queued: sent; 1200 > 1000: cut, and nothing more is written or counted.
    # The cut queues a 4408 close (autobahn aborts when it is not answered within 1 s).
    assert sent == [b"x" * 400] * 3
    assert closes == [4408] and protocol.transport.aborted == 0
    assert metrics.ws_slow_reader_closed._value.get() == before + 1
    # A protocol that cannot send a close frame is aborted at once.
    other = WebSocketProtocol.__new__(WebSocketProtocol)
    other.transport = Transport()
    other.transport._tempDataLen = 5000
    other.client_addr = None
    other.send_queue = []

    def cannot_close(code: int, reason: str) -> None:
        raise RuntimeError("closing")

    other.sendClose = cannot_close
    other.serverSend("y")
    assert other.transport.aborted == 1
    # Our own frames are not held to the incoming limit; it is back for the client's.
    assert limits_seen == [0, 0, 0]
    assert protocol.maxMessagePayloadSize == 100

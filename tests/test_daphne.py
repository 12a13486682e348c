"""chatsite under real daphne processes, driven over real sockets with the `websockets` client.

One instance: a chat turn end to end, the Origin check, the frame size limit. Two instances
(web1, web2) sharing Redis and a PostgreSQL database, as in production: a tab resumes on the
other instance, a stop reaches the instance running the turn, a killed instance's answer ends
`failed` with its partial text, and the rate limit is exact across both.

The helpers here (real sockets, daphne processes with a handle, fresh PostgreSQL databases)
are shared with tests/test_shutdown.py and tests/test_cluster.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
from psycopg import sql
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidMessage, InvalidStatus

from tests.servers import ROOT, base_env, free_port, running_chatsite, signup, wait_until_up

REDIS_URL = "redis://127.0.0.1:6379/0"
POSTGRES_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"
ONE_MIB = 1024 * 1024
CLOSE_MESSAGE_TOO_BIG = 1009


# --- real sockets ---------------------------------------------------------------------------


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://", 1) + "/ws/chat/"


@contextlib.asynccontextmanager
async def chat_socket(
    base: str,
    client: httpx.Client | None,
    *,
    origin: str | None = "same",
    **options: Any,
) -> AsyncIterator[ClientConnection]:
    """A websocket to /ws/chat/ with the client's session cookie and (by default) our Origin."""
    headers = {}
    if client is not None:
        headers["Cookie"] = f"sessionid={client.cookies['sessionid']}"
    if origin == "same":
        origin = base
    # proxy=None: a proxy configured in the environment (for package downloads) is not ours.
    started = time.monotonic()
    try:
        async with connect(
            ws_url(base),
            origin=origin,  # type: ignore[arg-type]
            additional_headers=headers,
            proxy=None,
            open_timeout=10,
            **options,
        ) as ws:
            yield ws
    except InvalidMessage as error:
        # The server closed the connection without an HTTP answer: say after how long (daphne
        # drops a handshake its application has not answered in 5 s) for the failure's report.
        raise AssertionError(
            f"{base} closed a handshake after {time.monotonic() - started:.2f} s "
            "without an HTTP answer"
        ) from error


async def next_json(ws: ClientConnection, timeout: float = 10) -> dict[str, Any]:
    """The next JSON frame (HTML frames, meant for htmx, are skipped)."""
    while True:
        raw = await asyncio.wait_for(ws.recv(), timeout)
        assert isinstance(raw, str)
        if raw.startswith("{"):
            frame: dict[str, Any] = json.loads(raw)
            return frame


async def ready(ws: ClientConnection) -> dict[str, Any]:
    frame = await next_json(ws)
    assert frame["type"] == "ready", frame
    return frame


async def send_prompt(ws: ClientConnection, text: str, conversation: str = "") -> None:
    await ws.send(json.dumps({"type": "prompt", "conversation": conversation, "text": text}))


@dataclass
class Answer:
    """What a tab saw of one answer: chunks by seq, the done frame, HTML frames, errors."""

    mid: str | None = None
    chunks: dict[int, str] = field(default_factory=dict)
    done: dict[str, Any] | None = None
    html: list[str] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.chunks[seq] for seq in sorted(self.chunks))

    @property
    def last_seq(self) -> int:
        """The last seq of the contiguous run from 0 (what a tab would resume after)."""
        seq = -1
        while seq + 1 in self.chunks:
            seq += 1
        return seq


async def read_answer(
    ws: ClientConnection,
    answer: Answer | None = None,
    *,
    until_chunks: int | None = None,
    timeout: float = 20,
) -> Answer:
    """Collect frames of one answer until its `done` (or until `until_chunks` chunks arrived).

    Fails on a chunk that arrives twice: exactly-once is what these tests are about.
    """
    answer = answer or Answer()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while answer.done is None:
        if until_chunks is not None and len(answer.chunks) >= until_chunks:
            break
        raw = await asyncio.wait_for(ws.recv(), max(0.01, deadline - loop.time()))
        assert isinstance(raw, str)
        if not raw.startswith("{"):
            answer.html.append(raw)
            continue
        frame = json.loads(raw)
        if frame["type"] == "error":
            answer.errors.append(frame)
            if answer.mid is None:
                return answer  # refused before it started
            continue
        if frame.get("mid") is None or frame["type"] not in ("chunk", "done"):
            continue
        if answer.mid is None:
            answer.mid = frame["mid"]
        if frame["mid"] != answer.mid:
            continue
        if frame["type"] == "chunk":
            assert frame["seq"] not in answer.chunks, f"chunk {frame['seq']} arrived twice"
            answer.chunks[frame["seq"]] = frame["text"]
        else:
            answer.done = frame
    return answer


async def handshake_status(base: str, client: httpx.Client, origin: str | None) -> int | str:
    """101 → "open" (and the ready frame arrived); otherwise the HTTP status of the refusal."""
    try:
        async with chat_socket(base, client, origin=origin) as ws:
            await ready(ws)
            return "open"
    except InvalidStatus as exc:
        return exc.response.status_code


# --- daphne processes with a handle ---------------------------------------------------------


@dataclass
class Instance:
    """A chatsite daphne process: its base URL and the process, to signal it."""

    name: str
    base: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


def daphne_command(port: int, *extra: str) -> list[str]:
    daphne = str(Path(sys.executable).parent / "daphne")
    return [daphne, "-b", "127.0.0.1", "-p", str(port), *extra, "chatsite.asgi:application"]


@contextlib.contextmanager
def daphne_instance(name: str, *, database_url: str, **env: str) -> Iterator[Instance]:
    """Like tests.servers.running_chatsite, but keeps the process so a test can signal it."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix=f"chatsite-{name}-"))
    log_path = workdir / "server.log"
    environment = base_env(DATABASE_URL=database_url, PORT=str(port), CHAT_INSTANCE_ID=name)
    environment.update(env)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            daphne_command(port), cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT
        )
    instance = Instance(name, f"http://127.0.0.1:{port}", proc, log_path)
    try:
        wait_until_up(f"{instance.base}/healthz", proc)
        yield instance
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


# --- PostgreSQL and Redis for several instances ---------------------------------------------


def postgres_available() -> bool:
    try:
        psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=2).close()
    except psycopg.Error:
        return False
    return True


needs_postgres = pytest.mark.skipif(
    not postgres_available(), reason=f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL}"
)


@contextlib.contextmanager
def fresh_postgres_database(prefix: str = "chatsite_test") -> Iterator[str]:
    """A new, migrated PostgreSQL database; dropped afterwards (whoever is still connected)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = f"postgres://postgres@127.0.0.1:5432/{name}"
    try:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=base_env(DATABASE_URL=url),
            check=True,
        )
        yield url
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def query_one(database_url: str, query: str, *params: Any) -> tuple[Any, ...] | None:
    with psycopg.connect(database_url) as conn:
        return conn.execute(query, params).fetchone()


@contextlib.contextmanager
def redis_prefix() -> Iterator[str]:
    """A key prefix of our own on the shared Redis; its keys are deleted afterwards."""
    prefix = f"test:{uuid.uuid4().hex[:10]}:"
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()


@dataclass
class Pair:
    web1: Instance
    web2: Instance
    database_url: str


@contextlib.contextmanager
def two_instances(**env: str) -> Iterator[Pair]:
    """web1 and web2: one PostgreSQL database, one Redis (our prefix), like production."""
    with (
        fresh_postgres_database() as database_url,
        redis_prefix() as prefix,
        daphne_instance(
            "web1",
            database_url=database_url,
            REDIS_URL=REDIS_URL,
            CHAT_REDIS_PREFIX=prefix,
            **env,
        ) as web1,
        daphne_instance(
            "web2",
            database_url=database_url,
            REDIS_URL=REDIS_URL,
            CHAT_REDIS_PREFIX=prefix,
            **env,
        ) as web2,
    ):
        yield Pair(web1, web2, database_url)


# Fast enough to keep tests short, slow enough to act mid-answer: /long 200 takes 1 s.
PAIR_ENV = {
    "DEMO_TOKENS_PER_SECOND": "200",
    "CHAT_RATE_LIMIT": "5/minute",
    "CHAT_MAX_CONCURRENT_STREAMS": "100",
    "CHAT_DAILY_TOKENS": "0",
    "CHAT_LEASE_SECONDS": "2",
    "CHAT_CHECKPOINT_SECONDS": "0.5",
}


def new_username() -> str:
    return f"user{uuid.uuid4().hex[:8]}"


# --- one instance ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


async def test_a_chat_turn_streams_end_to_end_over_a_real_socket(site: str) -> None:
    client = signup(site, new_username())
    async with chat_socket(site, client) as ws:
        hello = await ready(ws)
        assert hello["model"] == "demo-full"
        await send_prompt(ws, "/echo Hello over a real socket, through the demo model.")
        answer = await read_answer(ws)
    assert answer.done is not None
    assert answer.done["status"] == "complete"
    assert answer.text == "Hello over a real socket, through the demo model."
    assert answer.done["seq"] == len(answer.chunks)
    # The final rendered answer came as an htmx fragment carrying the message's id and status.
    assert any(
        f'data-mid="{answer.mid}"' in h and 'data-status="complete"' in h for h in answer.html
    )


async def test_our_origin_is_accepted_and_every_other_is_refused(site: str) -> None:
    client = signup(site, new_username())
    assert await handshake_status(site, client, "same") == "open"
    for origin in (
        "http://evil.example",
        "http://127.0.0.1.evil.example",  # a look-alike: our host as a prefix
        "null",  # sandboxed iframes and file:// pages; daphne passes it through
        None,  # no Origin header at all
    ):
        assert await handshake_status(site, client, origin) == 403, origin


async def test_a_frame_over_one_mib_is_refused_with_close_code_1009(site: str) -> None:
    client = signup(site, new_username())
    # No compression: the limit is on what arrives, and random text does not compress anyway.
    async with chat_socket(site, client, compression=None) as ws:
        await ready(ws)
        await ws.send("x" * (ONE_MIB + 1))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == CLOSE_MESSAGE_TOO_BIG


def daphne_rss_kib(base: str) -> int:
    """Resident memory of the daphne process serving `base` (found by its -p argument)."""
    port = base.rsplit(":", 1)[1]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            status = (proc / "status").read_text()
        except OSError:
            continue
        if any(a.endswith(b"daphne") for a in argv) and port.encode() in argv:
            return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS")))
    raise LookupError(f"no daphne serving port {port}")


async def fragments(count: int, size: int) -> AsyncIterator[str]:
    for _ in range(count):
        yield "z" * size


@pytest.mark.parametrize(
    "message",
    ["2 MiB in one frame", "50 MiB in 1 MiB fragments"],
)
async def test_oversized_messages_are_refused_without_the_server_growing(
    site: str, message: str
) -> None:
    client = signup(site, new_username())
    before = daphne_rss_kib(site)
    async with chat_socket(site, client, compression=None, max_size=None) as ws:
        await ready(ws)
        with pytest.raises(ConnectionClosed) as closed:
            if message.startswith("2 MiB"):
                await ws.send("x" * (2 * ONE_MIB))
            else:
                # One message in fragments: the limit is on the whole message, so the server
                # must refuse it after the first MiB rather than buffer all fifty.
                await ws.send(fragments(50, ONE_MIB))
            while True:
                await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == CLOSE_MESSAGE_TOO_BIG
    growth_mib = (daphne_rss_kib(site) - before) / 1024
    assert growth_mib < 8, f"daphne grew by {growth_mib:.1f} MiB"


async def test_a_frame_just_under_one_mib_is_read_and_answered(site: str) -> None:
    # The other side of the limit: a big (invalid) prompt frame is read and answered.
    client = signup(site, new_username())
    async with chat_socket(site, client, compression=None) as ws:
        await ready(ws)
        await ws.send(json.dumps({"type": "prompt", "text": "y" * (ONE_MIB - 100)}))
        frame = await next_json(ws)
    assert frame["type"] == "error"
    assert frame["code"] == "bad_request"  # over CHAT_MAX_PROMPT_CHARS, but not over 1 MiB


# --- two instances, one Redis, one PostgreSQL -------------------------------------------------


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    if not postgres_available():
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_ADMIN_URL}")
    with two_instances(**PAIR_ENV) as instances:
        yield instances


async def test_sockets_report_the_instance_they_landed_on(pair: Pair) -> None:
    client = signup(pair.web1.base, new_username())
    async with (
        chat_socket(pair.web1.base, client) as one,
        chat_socket(pair.web2.base, client) as two,
    ):
        # The session made on web1 works on web2: one database.
        assert (await ready(one))["instance"] == "web1"
        assert (await ready(two))["instance"] == "web2"


async def test_a_tab_that_drops_on_web1_resumes_on_web2_with_every_character_once(
    pair: Pair,
) -> None:
    client = signup(pair.web1.base, new_username())
    prompt = "/long 200"
    async with chat_socket(pair.web2.base, client) as ws:
        await ready(ws)
        await send_prompt(ws, prompt)
        undisturbed = await read_answer(ws)
    assert undisturbed.done is not None and undisturbed.done["status"] == "complete"

    async with chat_socket(pair.web1.base, client) as ws:
        await ready(ws)
        await send_prompt(ws, prompt)
        before = await read_answer(ws, until_chunks=3)
        assert before.done is None, "the answer must still be streaming when the tab drops"
        ws.transport.abort()  # the network goes away: no closing handshake

    async with chat_socket(pair.web2.base, client) as ws:
        assert (await ready(ws))["instance"] == "web2"
        after = before.last_seq
        await ws.send(json.dumps({"type": "resume", "mid": before.mid, "after": after}))
        resumed = await read_answer(ws, Answer(mid=before.mid))
    assert resumed.done is not None and resumed.done["status"] == "complete"
    kept = {seq: text for seq, text in before.chunks.items() if seq <= after}
    new = {seq: text for seq, text in resumed.chunks.items()}
    assert min(new) == after + 1, "the resume starts right after the last chunk the tab had"
    assert not kept.keys() & new.keys()
    joined = {**kept, **new}
    assert sorted(joined) == list(range(resumed.done["seq"])), "no gap"
    assert "".join(joined[seq] for seq in sorted(joined)) == undisturbed.text


async def test_a_stop_sent_to_web2_stops_the_turn_running_on_web1(pair: Pair) -> None:
    client = signup(pair.web1.base, new_username())
    async with (
        chat_socket(pair.web1.base, client) as asker,
        chat_socket(pair.web2.base, client) as other,
    ):
        await ready(asker)
        await ready(other)
        await send_prompt(asker, "/long 5000")  # 25 s unless stopped
        started = await read_answer(asker, until_chunks=1)
        await other.send(json.dumps({"type": "stop", "mid": started.mid}))
        ended = await read_answer(asker, started, timeout=10)
    assert ended.done is not None
    assert ended.done["status"] == "stopped"
    assert len(ended.text.split()) < 5000
    row = query_one(pair.database_url, "SELECT status FROM chat_message WHERE mid = %s", ended.mid)
    assert row == ("stopped",)


async def test_the_rate_limit_is_exact_across_both_instances(pair: Pair) -> None:
    client = signup(pair.web1.base, new_username())
    limit, sockets_per_instance, prompts_per_socket = 5, 10, 5
    outcomes: list[str] = []

    async def one_tab(base: str) -> None:
        async with chat_socket(base, client) as ws:
            await ready(ws)
            # All prompts leave at once; the limiter middleware sees them in a burst.
            await asyncio.gather(*(send_prompt(ws, "/echo hi") for _ in range(prompts_per_socket)))
            seen = 0
            while seen < prompts_per_socket:
                frame = await next_json(ws, timeout=20)
                if frame["type"] == "error":
                    outcomes.append(frame["code"])
                    seen += 1
                elif frame["type"] == "done":
                    outcomes.append(frame["status"])
                    seen += 1

    tabs = [pair.web1.base] * sockets_per_instance + [pair.web2.base] * sockets_per_instance
    await asyncio.gather(*(one_tab(base) for base in tabs))
    assert len(outcomes) == 100
    assert outcomes.count("complete") == limit
    assert outcomes.count("rate_limited") == 100 - limit


@needs_postgres
async def test_an_answer_whose_instance_is_killed_ends_failed_with_its_partial_text() -> None:
    # A pair of its own: this test kills web1.
    with two_instances(**PAIR_ENV) as instances:
        client = signup(instances.web1.base, new_username())
        async with chat_socket(instances.web1.base, client) as ws:
            await ready(ws)
            await send_prompt(ws, "/long 5000")
            # Past a checkpoint (every 0.5 s): the database holds some of the answer.
            seen = await read_answer(ws, until_chunks=60)
            assert seen.done is None
            instances.web1.kill()

        async with chat_socket(instances.web2.base, client) as ws:
            await ready(ws)
            resume = {"type": "resume", "mid": seen.mid, "after": seen.last_seq}
            await ws.send(json.dumps(resume))
            # Once web1's lease (2 s) runs out, web2 marks the answer failed and says so.
            outcome = await read_answer(ws, Answer(mid=seen.mid), timeout=20)
        assert outcome.done is not None
        assert outcome.done["status"] == "failed"
        row = query_one(
            instances.database_url,
            "SELECT status, text, error FROM chat_message WHERE mid = %s",
            seen.mid,
        )
        assert row is not None
        status, text, error = row
        assert status == "failed"
        assert text, "the partial answer is kept"
        # The saved text is the answer as far as the last checkpoint: a prefix of the stream.
        assert seen.text.startswith(text) or text.startswith(seen.text)
        assert "interrupted" in error
        assert any(
            f'data-mid="{seen.mid}"' in h and 'data-status="failed"' in h for h in outcome.html
        )

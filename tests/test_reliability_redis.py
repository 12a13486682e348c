"""Redis failures: a private redis-server is killed and restarted under a streaming answer.

The machine's shared Redis is never touched: each test starts its own `redis-server` on a free
port and points REDIS_URL (the stream log, the limiter, the stop channel) and the channel layer
at it. While it is down an answer in flight still completes and is saved (the stream log is
best-effort), the limiter follows CHAT_LIMITER_FAILURE, nothing waits without a bound; once it
is back, new sockets work and the log and the limiter are used again.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client

from chat.demo_upstream import long_tokens
from chat.models import Message
from chat.turns.streamlog import Chunk, Done, get_stream_log
from tests.conftest import assistant_mid, receive_until_done
from tests.servers import free_port

pytestmark = [pytest.mark.usefixtures("chat_settings"), pytest.mark.redis]

REDIS_SERVER = shutil.which("redis-server")


class PrivateRedis:
    """A redis-server of our own, on a free port, that a test may kill and start again."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = Path(tempfile.mkdtemp(prefix="chatsite-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        options = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), *options, "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.02)
        client.close()

    def kill(self) -> None:
        """SIGKILL: no goodbye to the clients, as when a machine or container dies."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_redis(settings: Any) -> Iterator[PrivateRedis]:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis()
    server.start()
    settings.REDIS_URL = server.url
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [server.url], "group_expiry": 172800, "capacity": 500},
        }
    }
    try:
        yield server
    finally:
        server.stop()


def prompt(text: str) -> str:
    return json.dumps({"type": "prompt", "conversation": "", "text": text})


async def chunks_until(comm: Any, count: int) -> tuple[str, list[str]]:
    """The answer's mid and its first `count` chunks."""
    mid = assistant_mid(await comm.receive_from(timeout=10))
    texts: list[str] = []
    while len(texts) < count:
        frame = json.loads(await comm.receive_from(timeout=10))
        if frame["type"] == "chunk" and frame["mid"] == mid:
            assert frame["seq"] == len(texts)
            texts.append(frame["text"])
    return mid, texts


async def test_an_answer_in_flight_survives_redis_dying_and_sockets_work_once_it_is_back(
    connect: Any, owner: Any, settings: Any, slow_demo_upstream: str, private_redis: PrivateRedis
) -> None:
    settings.LLM_BASE_URL = slow_demo_upstream
    settings.CHAT_LIMITER_FAILURE = "open"
    comm = await connect(owner)
    await comm.send_to(text_data=prompt("/long 200"))  # ~2 s at 100 tokens/s
    mid, first = await chunks_until(comm, 3)
    private_redis.kill()

    rest = await receive_until_done(comm, mid, after=2, timeout=15)
    expected = "".join(long_tokens(200))
    assert rest["done"]["status"] == "complete"
    assert "".join(first) + rest["text"] == expected
    message = await database_sync_to_async(Message.objects.get)(mid=mid)
    assert (message.status, message.text) == ("complete", expected)

    # Still down: the "open" limiter admits the next prompt, and it is answered; a new tab
    # connects too (without live events from other tabs until Redis is back).
    await comm.send_to(text_data=prompt("/echo while redis is down"))
    down = await receive_until_done(comm, timeout=15)
    assert down["done"]["status"] == "complete"
    newcomer = await connect(owner)
    await newcomer.send_to(text_data=prompt("/echo a new tab"))
    assert (await receive_until_done(newcomer, timeout=15))["text"] == "a new tab"

    private_redis.start()
    again = await connect(owner)
    await again.send_to(text_data=prompt("/echo back again"))
    assert (await receive_until_done(again, timeout=15))["text"] == "back again"
    # The stream log is written again: the new answer can be read back from Redis.
    await again.send_to(text_data=prompt("/long 30"))
    back = await receive_until_done(again, timeout=15)
    entries = [entry async for entry in get_stream_log().read(back["done"]["mid"], block_ms=5000)]
    assert "".join(e.text for e in entries if isinstance(e, Chunk)) == back["text"]
    assert isinstance(entries[-1], Done) and entries[-1].payload["status"] == "complete"
    # The socket that lived through the outage still works, and still gets control events:
    # it joined its group again once Redis answered, so a deactivation reaches it.
    await comm.send_to(text_data=prompt("/echo the old tab"))
    assert (await receive_until_done(comm, timeout=15))["text"] == "the old tab"

    def deactivate() -> None:
        user = get_user_model().objects.get(pk=owner.pk)
        user.is_active = False
        user.save()

    await database_sync_to_async(deactivate)()
    for tab in (comm, again):
        while not (raw := await tab.receive_from(timeout=10)).startswith("{"):
            pass  # the other tab's exchanges, shown live: the group works again
        assert json.loads(raw)["code"] == "unauthenticated"


async def test_logging_out_works_while_redis_is_down_and_the_next_prompt_is_refused(
    connect: Any, owner: Any, private_redis: PrivateRedis
) -> None:
    client = Client()
    await database_sync_to_async(client.force_login)(owner)
    cookie = [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]
    comm = await connect(None, extra_headers=cookie)
    private_redis.kill()
    # The logout signal cannot reach the sockets through the layer, but the logout works.
    response = await database_sync_to_async(client.post)("/accounts/logout/")
    assert response.status_code == 302
    await comm.send_to(text_data=prompt("/echo after logout"))
    frame = json.loads(await comm.receive_from(timeout=10))
    assert frame["code"] == "unauthenticated"
    assert (await comm.receive_output(timeout=5))["code"] == 4401
    assert await database_sync_to_async(Message.objects.count)() == 0


async def test_a_closed_limiter_refuses_prompts_clearly_while_redis_is_down(
    connect: Any, owner: Any, settings: Any, private_redis: PrivateRedis
) -> None:
    settings.CHAT_LIMITER_FAILURE = "closed"
    comm = await connect(owner)
    private_redis.kill()
    await comm.send_to(text_data=prompt("/echo refused"))
    frame = json.loads(await comm.receive_from(timeout=10))  # refused, not left hanging
    assert frame["type"] == "error" and frame["code"] == "rate_limited"
    assert "temporarily unavailable" in frame["message"]
    assert frame["retry_after"] > 0
    assert await database_sync_to_async(Message.objects.count)() == 0
    private_redis.start()
    await comm.send_to(text_data=prompt("/echo admitted again"))
    assert (await receive_until_done(comm, timeout=15))["text"] == "admitted again"


class FlakyLayer:
    """A channel layer that is down, then back, at the exact moments the race needs.

    Mocked on purpose: the race is Redis coming back between a failed group join and the next
    receive, a window of microseconds that a real redis-server cannot be restarted into on cue.
    """

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.adds_to_fail = 2  # the join right after the outage (and its one retry) fails

    async def receive(self) -> dict[str, Any]:
        self.calls.append("receive")
        if self.calls.count("receive") == 1:
            raise redis.exceptions.ConnectionError("Connection closed by server.")
        return {"type": "user.deactivated"}

    async def group_add(self, group: str, channel: str) -> None:
        if self.adds_to_fail:
            self.adds_to_fail -= 1
            self.calls.append("add failed")
            raise redis.exceptions.ConnectionError("Error 111 connecting")
        self.calls.append("add")


async def test_a_tab_joins_its_group_again_before_it_listens_after_an_outage() -> None:
    """The receive that works once Redis is back must not come before the group knows the tab
    again, or its logout and deactivation events go nowhere (seen under load in CI)."""
    from chat.sockets.consumers import ChatConsumer

    layer = FlakyLayer()
    consumer = ChatConsumer()
    consumer.channel_layer = layer
    consumer.channel_name = "tab-1"
    consumer.group = "user-1"
    consumer.joined = True
    consumer.channel_receive = layer.receive
    message = await consumer.channel_receive()
    assert message == {"type": "user.deactivated"}
    assert layer.calls == ["receive", "add failed", "add failed", "add", "receive"]
    assert consumer.joined

"""Client failures: a tab that leaves, and a tab that stops reading.

A tab that disconnects mid-answer does not end the turn (tests/test_consumer.py shows the
answer completes); a **stop** sent afterwards from another tab closes the upstream request at
once and leaves no task or busy pooled connection behind. A tab that stops reading while a
long answer streams is cut off (close code 4408) after a bounded number of queued frames,
while the tabs beside it stream on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from chat.demo_upstream import long_tokens
from chat.models import Message
from chat.turns.model_client import get_client
from chat.turns.registry import registry
from tests.conftest import DESKTOP_UA, assistant_mid, receive_until_done, session_key_for
from tests.demo_server import demo_stats, running_demo_server

pytestmark = pytest.mark.usefixtures("chat_settings")

CLOSE_TOO_SLOW = 4408


@pytest.fixture(scope="module")
def counting_slow_upstream() -> Iterator[str]:
    """The demo model at 100 tokens/s, with its counters (started, cancelled, active …)."""
    with running_demo_server(ttfb_ms=0, tps=100, stats=True) as url:
        yield url


@pytest.fixture(scope="module")
def brisk_upstream() -> Iterator[str]:
    """The demo model at 1000 tokens/s: a 1500-token answer is ~95 coalesced frames in 1.5 s."""
    with running_demo_server(ttfb_ms=0, tps=1000) as url:
        yield url


async def eventually(condition: Callable[[], bool], timeout: float = 10) -> None:
    """Wait until `condition()` holds, at most `timeout` seconds (polling: nothing signals)."""
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - the condition lives in another process
            await asyncio.sleep(0.02)


def prompt(text: str) -> str:
    return json.dumps({"type": "prompt", "conversation": "", "text": text})


async def next_chunk(comm: WebsocketCommunicator) -> dict[str, Any]:
    while True:
        raw = await comm.receive_from(timeout=10)
        if raw.startswith("{"):
            frame: dict[str, Any] = json.loads(raw)
            if frame["type"] == "chunk":
                return frame


async def test_a_stop_after_the_tab_left_closes_the_upstream_at_once_and_leaves_nothing(
    connect: Any, owner: Any, settings: Any, counting_slow_upstream: str
) -> None:
    settings.LLM_BASE_URL = counting_slow_upstream
    before = demo_stats(counting_slow_upstream)
    tab = await connect(owner)
    await tab.send_to(text_data=prompt("/long 5000"))  # 50 s at 100 tokens/s
    mid = assistant_mid(await tab.receive_from(timeout=10))
    await next_chunk(tab)
    await tab.disconnect()  # the tab goes away; the turn goes on
    turn = registry.get(mid)
    assert turn is not None and turn.task is not None and not turn.task.done()
    assert demo_stats(counting_slow_upstream)["active"] == before["active"] + 1

    other_tab = await connect(owner)
    await other_tab.send_to(text_data=json.dumps({"type": "stop", "mid": mid}))
    # The bound: the model server sees the request closed within a second.
    stats: dict[str, Any] = {}

    def upstream_closed() -> bool:
        stats.update(demo_stats(counting_slow_upstream))
        return stats["active"] == before["active"]

    await eventually(upstream_closed, timeout=1.0)
    assert stats["cancelled"] == before["cancelled"] + 1
    assert stats["completed"] == before["completed"], "the answer ran to its end instead"
    sent = stats["tokens_sent"]
    await asyncio.sleep(0.3)
    assert demo_stats(counting_slow_upstream)["tokens_sent"] == sent, "tokens still flowing"

    # No task left behind: the turn and its heartbeat are gone, the registry forgot it.
    await eventually(lambda: registry.get(mid) is None)
    names = {task.get_name() for task in asyncio.all_tasks()}
    assert f"turn {mid}" not in names and f"heartbeat {mid}" not in names
    # No pooled connection still busy with the cancelled request.
    assert get_client().connections_in_use() == 0
    message = await database_sync_to_async(Message.objects.get)(mid=mid)
    assert message.status == "stopped"
    assert 0 < len(message.text.split()) < 5000
    # The same pooled client serves the next answer.
    await other_tab.send_to(text_data=prompt("/echo next"))
    assert (await receive_until_done(other_tab))["text"] == "next"


# --- a tab that stops reading ----------------------------------------------------------------

TRANSPORT_FRAMES = 20  # what the "network" holds before the server's send blocks
OUTBOX_FRAMES = 10  # CHAT_SEND_BUFFER_FRAMES (its minimum)
BESIDE_TABS = 50  # normal tabs streaming beside the slow one (issue #8)


async def slow_reader(user: Any) -> WebsocketCommunicator:
    """A socket whose transport holds TRANSPORT_FRAMES frames, then blocks the server's send.

    Why not a real slow socket: under daphne the app's send never blocks (daphne buffers every
    outgoing frame itself, without bound: PITFALLS, daphne #170), so a slow reader there is not
    visible to the application at all. Servers with backpressure (uvicorn, hypercorn) make
    `send` wait when the client's TCP window is full; a bounded output queue is exactly that.
    """
    from chatsite.asgi import application

    key = await database_sync_to_async(session_key_for)(user)
    comm = WebsocketCommunicator(
        application,
        "/ws/chat/",
        headers=[
            (b"host", b"127.0.0.1:8000"),
            (b"origin", b"http://127.0.0.1:8000"),
            (b"user-agent", DESKTOP_UA.encode()),
            (b"cookie", f"sessionid={key}".encode()),
        ],
    )
    comm._output_queue = asyncio.Queue(maxsize=TRANSPORT_FRAMES)  # before the app starts
    connected, _ = await comm.connect(timeout=10)
    assert connected
    assert json.loads(await comm.receive_from(timeout=10))["type"] == "ready"
    return comm


async def test_a_tab_that_stops_reading_is_cut_off_while_the_others_stream_on(
    connect: Any,
    owner: Any,
    other_user: Any,
    settings: Any,
    brisk_upstream: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.LLM_BASE_URL = brisk_upstream
    settings.CHAT_SEND_BUFFER_FRAMES = OUTBOX_FRAMES
    settings.CHAT_MAX_CONCURRENT_STREAMS = 100
    settings.CHAT_MAX_SOCKETS_PER_USER = 0  # fifty tabs of one user: this is not the cap's test
    slow = await slow_reader(owner)
    try:
        await slow.send_to(text_data=prompt("/long 1500"))
        # Fifty other tabs (another user) stream beside it, and nobody reads the slow one.
        others = [await connect(other_user) for _ in range(BESIDE_TABS)]
        for tab in others:
            await tab.send_to(text_data=prompt("/long 300"))
        results = await asyncio.gather(*(receive_until_done(tab, timeout=30) for tab in others))
        expected = "".join(long_tokens(300))
        for result in results:
            assert (result["text"], result["done"]["status"]) == (expected, "complete")

        # The slow tab's answer is finished and saved in full: the turn never waited for it.
        slow_mid = await database_sync_to_async(
            lambda: Message.objects.get(conversation__user=owner, role="assistant").mid
        )()
        await eventually(lambda: registry.get(slow_mid) is None, timeout=30)
        message = await database_sync_to_async(Message.objects.get)(mid=slow_mid)
        assert (message.status, message.text) == ("complete", "".join(long_tokens(1500)))

        # Now it reads: what was queued for it is bounded by the transport and the outbox
        # (not the ~95 of the answer), in order from the start, then the close says why.
        chunks: list[int] = []
        while True:
            output = await slow.receive_output(timeout=5)
            if output["type"] == "websocket.close":
                assert output["code"] == CLOSE_TOO_SLOW
                break
            text = output["text"]
            if text.startswith("{") and json.loads(text)["type"] == "chunk":
                chunks.append(json.loads(text)["seq"])
        assert chunks == list(range(len(chunks))), "the slow tab got a gap before its close"
        assert 0 < len(chunks) <= TRANSPORT_FRAMES + OUTBOX_FRAMES
        # Said once, not once per frame it could not take.
        overflows = [r for r in caplog.records if "outbox is full" in r.getMessage()]
        assert len(overflows) == 1
    finally:
        await slow.disconnect()

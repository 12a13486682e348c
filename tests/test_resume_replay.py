"""Resuming a long streaming answer (hostile review): the replay is never taken for a slow
reader, and resuming again and again renders the answer once.

The answer is held mid-way by a real TCP hop in front of the demo model (tests/held_upstream.py),
so it is streaming, with thousands of blocks made, for exactly as long as the test needs. A tab
that resumes it from the start gets every chunk once, in order, and every block, whether the
turn runs in this process (the replay comes from the turn) or elsewhere (from this process's
mirror of its stream log, chat/turns/mirror.py); and over a real daphne.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection

from chat.demo_upstream.answers import tokenize
from chat.rendering import LiveRenderer
from chat.sockets import consumers
from chat.turns.mirror import mirrors
from chat.turns.registry import TurnRegistry, registry
from chat.turns.turn import Turn
from tests.conftest import assistant_mid
from tests.held_upstream import HeldAnswers, held_answers
from tests.servers import running_chatsite, signup
from tests.test_daphne import chat_socket, ready, send_prompt
from tests.test_live_blocks import check_blocks

pytestmark = pytest.mark.usefixtures("chat_settings")

# An answer of thousands of one-line headings: each is a block once its line ends. One frame per
# block in a resume's replay overflowed the socket's outbox (CHAT_SEND_BUFFER_FRAMES, 2,000) and
# closed the tab with 4408 on every resume: it could never catch up.
HEADINGS = 2600
LONG = "# h\n" * HEADINGS + "The end."
HELD_BACK = 8  # events of the answer the hop holds back until released


def prompt(text: str) -> str:
    return json.dumps({"type": "prompt", "conversation": "", "text": text})


def resume(mid: str, after: int = -1) -> str:
    return json.dumps({"type": "resume", "mid": mid, "after": after})


class Seen:
    """What a tab was sent of one answer: chunks (each once), blocks, the final frames."""

    def __init__(self, mid: str) -> None:
        self.mid = mid
        self.chunks: dict[int, str] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.html: list[str] = []
        self.done: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        assert sorted(self.chunks) == list(range(len(self.chunks))), "a gap in the chunks"
        return "".join(self.chunks[seq] for seq in sorted(self.chunks))

    def take(self, raw: str, *, once: bool = True) -> None:
        if not raw.startswith("{"):
            self.html.append(raw)
            return
        frame = json.loads(raw)
        if frame.get("mid") != self.mid:
            return
        if frame["type"] == "chunk":
            assert not (once and frame["seq"] in self.chunks), f"chunk {frame['seq']} twice"
            self.chunks[frame["seq"]] = frame["text"]
        elif frame["type"] in ("block", "blocks"):
            for block in frame.get("blocks", [frame]):
                self.blocks[block["index"]] = block
        elif frame["type"] == "done":
            self.done = frame
        else:
            raise AssertionError(f"unexpected frame {frame}")


async def receive_until(comm: Any, seen: Seen, condition: Callable[[], bool]) -> None:
    """Frames into `seen` until `condition` holds. A close (4408) fails: the communicator's
    `receive_from` insists on a `websocket.send`."""
    while not condition():
        seen.take(await comm.receive_from(timeout=20))


async def resumed(comm: Any, mid: str, after: int, feed: Any) -> Seen:
    """Resume `mid` after `after`; what the tab was sent until it has everything `feed` (the
    turn or the mirror) has."""
    seen = Seen(mid)
    await comm.send_to(text_data=resume(mid, after))
    await receive_until(comm, seen, lambda: len(seen.blocks) >= len(feed.block_frames))
    await receive_until(comm, seen, lambda: max(seen.chunks, default=after) == len(feed.chunks) - 1)
    assert min(seen.chunks, default=after + 1) == after + 1  # from right after `after`
    return seen


class Elsewhere:
    """The registry as a process where the turn does not run sees it: without the turn.

    The turn runs in this process (the test reads its render count here), but the consumer is
    made to follow it through the stream log, exactly as a tab on another instance does."""

    def __init__(self, real: TurnRegistry) -> None:
        self.real = real

    def get(self, mid: str) -> Turn | None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture
def held(demo_upstream: str) -> Iterator[HeldAnswers]:
    with held_answers(demo_upstream, len(tokenize(LONG)) - HELD_BACK) as proxy:
        yield proxy


async def held_turn(held: HeldAnswers, mid: str, blocks: int) -> Turn:
    """The turn of `mid`, once its answer is held and it has made `blocks` blocks."""
    await asyncio.to_thread(held.wait_held, 1)
    turn = registry.get(mid)
    assert turn is not None
    for _ in range(1000):
        if len(turn.block_frames) >= blocks:
            return turn
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(turn.block_frames)} blocks of {blocks}")


@pytest.mark.parametrize("where", ["here", "elsewhere"])
async def test_a_tab_resuming_an_answer_of_thousands_of_blocks_gets_it_whole(
    connect: Any,
    owner: Any,
    settings: Any,
    held: HeldAnswers,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    settings.LLM_BASE_URL = held.url
    if where == "elsewhere":
        monkeypatch.setattr(consumers, "registry", Elsewhere(registry))
    held.arm()
    asking = await connect(owner)
    await asking.send_to(text_data=prompt("/echo " + LONG))
    mid = assistant_mid(await asking.receive_from(timeout=10))
    turn = await held_turn(held, mid, HEADINGS - 10)
    shown = "".join(turn.chunks)
    asked = Seen(mid)
    await receive_until(asking, asked, lambda: len(asked.text) == len(shown))

    tab = await connect(owner)
    for _ in range(3):  # every resume succeeds, not only the first
        seen = await resumed(tab, mid, -1, turn)
        assert seen.text == shown
    held.release()
    for comm, result in ((asking, asked), (tab, seen)):
        await receive_until(comm, result, lambda: result.done is not None)  # noqa: B023
        assert result.done is not None and result.done["status"] == "complete"
        assert result.text == LONG
        blocks = [result.blocks[i] for i in sorted(result.blocks)]
        assert len(blocks) == HEADINGS + 1
        check_blocks(blocks, LONG)


def count_rendered(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Characters fed to every live renderer of the process, as a one-item list."""
    fed = [0]
    feed = LiveRenderer.feed

    def counting(self: LiveRenderer, text: str) -> Any:
        fed[0] += len(text)
        return feed(self, text)

    monkeypatch.setattr(LiveRenderer, "feed", counting)
    return fed


async def test_resuming_an_answer_streaming_elsewhere_again_and_again_renders_it_once(
    connect: Any,
    owner: Any,
    settings: Any,
    held: HeldAnswers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings.LLM_BASE_URL = held.url
    monkeypatch.setattr(consumers, "registry", Elsewhere(registry))
    fed = count_rendered(monkeypatch)
    held.arm()
    asking = await connect(owner)
    await asking.send_to(text_data=prompt("/echo " + LONG))
    mid = assistant_mid(await asking.receive_from(timeout=10))
    turn = await held_turn(held, mid, HEADINGS - 10)
    shown = "".join(turn.chunks)
    rendered_by_the_turn = fed[0]
    assert rendered_by_the_turn == len(shown)

    tabs = [await connect(owner) for _ in range(2)]
    resumes = 10
    for round_ in range(resumes):
        for tab in tabs:
            # From the start, or from the middle: the tab ignores the blocks it has.
            after = -1 if round_ % 2 else max(-1, len(turn.chunks) - 2)
            await resumed(tab, mid, after, turn)
    # Twenty resumes by two tabs: the answer so far was rendered once more (by this process's
    # mirror of it), not twenty times (each resume followed the log from its first chunk).
    assert fed[0] - rendered_by_the_turn == len(shown)
    mirror = mirrors.get(mid)
    assert mirror is not None and len(mirror.watchers) == len(tabs)
    held.release()
    for tab in tabs:
        seen = Seen(mid)
        await receive_until(tab, seen, lambda: seen.done is not None)  # noqa: B023
        assert seen.done is not None and seen.done["status"] == "complete"
    assert fed[0] == 2 * len(LONG)
    for _ in range(100):  # it ends with the answer
        if mirrors.get(mid) is None:
            break
        await asyncio.sleep(0.01)
    assert mirrors.get(mid) is None


# --- over a real daphne -------------------------------------------------------------------


async def read_into(ws: ClientConnection, seen: Seen, condition: Callable[[], bool]) -> None:
    while not condition():
        try:
            raw = await asyncio.wait_for(ws.recv(), 20)
        except TimeoutError:
            print("DBG", len(seen.blocks), len(seen.chunks), seen.done)
            raise
        assert isinstance(raw, str)
        seen.take(raw)


async def resumed_over(ws: ClientConnection, asked: Seen) -> Seen:
    seen = Seen(asked.mid)
    await ws.send(resume(asked.mid))
    await read_into(ws, seen, lambda: len(seen.blocks) >= len(asked.blocks))
    await read_into(ws, seen, lambda: len(seen.text) >= len(asked.text))
    return seen


async def test_over_daphne_a_long_answer_resumes_whole_every_time(demo_upstream: str) -> None:
    with (
        held_answers(demo_upstream, len(tokenize(LONG)) - HELD_BACK) as hop,
        # An answer of 5,200 tokens: over the default cap of one answer (4,096).
        running_chatsite(LLM_BASE_URL=hop.url, CHAT_RESERVE_TOKENS="8192") as base,
    ):
        client = signup(base, "replayer")
        hop.arm()
        async with chat_socket(base, client) as asking, chat_socket(base, client) as tab:
            await ready(asking)
            await ready(tab)
            await send_prompt(asking, "/echo " + LONG)
            first: dict[str, Any] = {}
            while first.get("type") != "chunk":
                raw = await asyncio.wait_for(asking.recv(), 20)
                first = json.loads(raw) if isinstance(raw, str) and raw.startswith("{") else {}
            asked = Seen(first["mid"])
            asked.take(json.dumps(first))
            await read_into(asking, asked, lambda: len(asked.blocks) >= HEADINGS - 10)
            await asyncio.to_thread(hop.wait_held, 1)
            for _ in range(3):
                seen = await resumed_over(tab, asked)
            hop.release()
            for ws, result in ((asking, asked), (tab, seen)):
                await read_into(ws, result, lambda: result.done is not None)  # noqa: B023
                assert result.text == LONG
                assert len(result.blocks) == HEADINGS + 1

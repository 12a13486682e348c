"""One user's replays take turns (hostile review): twenty tabs of one user resuming a long answer
at once, again and again, slowed every other user's answers. The outbox sends one user's replays
REPLAYS_PER_USER at a time in a process; every tab still gets every frame once and in order, and
another user's replay does not wait behind them.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator

from chat.sockets import outbox
from chat.sockets.outbox import REPLAY_PAUSE_BYTES, Outbox, replay_turns

FRAME = "x" * REPLAY_PAUSE_BYTES  # every frame of a replay lets the event loop run
FRAMES = 40


class Tab(Outbox):
    """A socket's outbox with a `send` that keeps what it was sent."""

    def __init__(self, owner: str) -> None:
        self.open_outbox(owner)
        self.frames: list[str] = []
        self.closed: int | None = None

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        assert text_data is not None
        self.frames.append(text_data)

    async def close(self, code: int | None = None, reason: str | None = None) -> None:
        self.closed = code

    async def drained(self) -> None:
        """Until its sender has sent everything queued (everything is queued before)."""
        if self.sender is not None:
            await self.sender


class Replays:
    """Replays that note, per user, how many are being sent at once, and when each ran."""

    def __init__(self) -> None:
        self.sending: dict[str, int] = defaultdict(int)
        self.most: dict[str, int] = defaultdict(int)
        self.events: list[tuple[str, str, int]] = []  # (what, owner, tab)

    def of(self, owner: str, tab: int) -> Iterator[str]:
        """A replay, counted from its first frame on (made as it is sent, as a resume's is)."""
        self.sending[owner] += 1
        self.most[owner] = max(self.most[owner], self.sending[owner])
        self.events.append(("start", owner, tab))
        try:
            for n in range(FRAMES):
                yield f"{owner}{tab}:{n}:{FRAME}"
        finally:
            self.sending[owner] -= 1
            self.events.append(("end", owner, tab))


def frames_of(owner: str, n: int) -> list[str]:
    return [f"{owner}{n}:{i}:{FRAME}" for i in range(FRAMES)]


async def test_twenty_tabs_of_one_user_resuming_at_once_take_turns_and_get_everything() -> None:
    replays = Replays()
    tabs = [Tab("alice") for _ in range(20)]
    for n, tab in enumerate(tabs):
        tab.push("before")
        tab.push_replay(replays.of("alice", n))
        tab.push("after")  # a live frame queued behind the replay comes after it
    await asyncio.gather(*(tab.drained() for tab in tabs))

    assert replays.most["alice"] == outbox.REPLAYS_PER_USER == 1
    for n, tab in enumerate(tabs):  # whole, once, in order
        assert tab.frames == ["before", *frames_of("alice", n), "after"]
        assert tab.closed is None
    starts = [tab for what, _, tab in replays.events if what == "start"]
    assert starts == list(range(20))  # first come, first served
    assert not replay_turns._loops.get(asyncio.get_running_loop())  # nothing held after


async def test_another_users_replay_does_not_wait_behind_them() -> None:
    replays = Replays()
    storm = [Tab("alice") for _ in range(20)]
    for n, tab in enumerate(storm):
        tab.push_replay(replays.of("alice", n))
    await asyncio.sleep(0)  # alice's first replay is being sent, nineteen wait
    bob = Tab("bob")
    bob.push_replay(replays.of("bob", 0))
    bob.push("after")
    await bob.drained()

    assert bob.frames == [*frames_of("bob", 0), "after"]
    ended = replays.events.index(("end", "bob", 0))
    alice_started = [e for e in replays.events[:ended] if e[0] == "start" and e[1] == "alice"]
    assert len(alice_started) <= 2  # bob's replay went alongside alice's, not after her twenty
    assert replays.most["bob"] == 1
    await asyncio.gather(*(tab.drained() for tab in storm))
    assert replays.most["alice"] == 1


async def test_a_tab_that_goes_away_while_waiting_its_turn_lets_the_others_go_on() -> None:
    replays = Replays()
    tabs = [Tab("alice") for _ in range(3)]
    for n, tab in enumerate(tabs):
        tab.push_replay(replays.of("alice", n))
    await asyncio.sleep(0)
    waiting = tabs[1].sender
    assert waiting is not None
    waiting.cancel()  # the tab closed (ChatConsumer._release cancels its sender)
    await asyncio.gather(tabs[0].drained(), tabs[2].drained())

    assert tabs[1].frames == []
    assert tabs[0].frames == frames_of("alice", 0)
    assert tabs[2].frames == frames_of("alice", 2)
    assert replays.most["alice"] == 1
    assert not replay_turns._loops.get(asyncio.get_running_loop())

"""Thread hops per turn: every trip a turn makes off the event loop, counted like queries.

All ORM work runs on one thread (asgiref's thread-sensitive executor, through Channels'
`database_sync_to_async`); every user's turn queues on it, and each trip there or to a worker
thread (`sync_to_async(thread_sensitive=False)`, `asyncio.to_thread`) costs a hand-off to the
executor, a wake-up of the event loop (`call_soon_threadsafe` → `_write_to_self`) and a fight
for the GIL on the way back. Exact lists, so a change that adds a hop to every turn is seen and
argued for (update the list in the same commit, with the reason).

A turn, one tab, a 50-token answer of the demo model (memory limiter and stream log, as
`make run` and the bench's chatsite side; Redis adds network round trips, not thread hops):

- ORM thread, `resolve_limits`: the admission (FrameASGIMiddleware) resolves the user's limits
  (quota, plan) — only when the 2 s per-process cache missed, as for every user of a burst;
- ORM thread, `_begin_exchange`: the session re-check, the exchange's rows (and a fork's
  bubbles) in one trip (chat/turns/start.py);
- (no worker thread: the asking tab's frame, a new conversation's too, is written on the event
  loop by chat/bubbles.py in tens of microseconds, less than the trip; it went to a worker
  thread while it took the template engine a millisecond, docs/decisions/performance.md);
- ORM thread, `save_answer`: the answer, its usage and its final frame in one trip.

Gone (docs/decisions/performance.md, "Thread hops per turn"): Channels' `dispatch` sent
`close_old_connections` to the ORM thread before every message (the frame, and the
`chat.exchange` event echoed to the asking socket: two per turn, one per other tab), which
`database_sync_to_async` does itself around each call; the last live block went to a worker
thread however small; the memory limiter's clean-up sent each user's window to a worker
thread (limits' `asyncio.to_thread`), about two hops per admission in a burst.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from asgiref.sync import SyncToAsync
from channels.db import DatabaseSyncToAsync
from limits import parse
from limits.aio.strategies import MovingWindowRateLimiter

from chat.limits import limiter, plans
from chat.turns.registry import registry
from tests.conftest import receive_until_done

pytestmark = pytest.mark.usefixtures("chat_settings")

ORM = "orm thread"
WORKER = "worker thread"


def _name(func: Any) -> str:
    while isinstance(func, functools.partial):
        func = func.func
    return str(getattr(func, "__qualname__", func)).rsplit(".", 1)[-1]


class Hops:
    """The hops seen: through asgiref (where, what), and every executor hand-off of the loop."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.outside_database_sync_to_async: list[str] = []
        self.handed_off = 0  # loop.run_in_executor calls: asgiref's, and any other

    def names(self) -> list[tuple[str, str]]:
        return sorted(self.seen)


@contextmanager
def recorded_hops() -> Iterator[Hops]:
    hops = Hops()
    original = SyncToAsync.__call__

    async def recording(self: SyncToAsync[Any, Any], *args: Any, **kwargs: Any) -> Any:
        where = ORM if self._thread_sensitive else WORKER
        hops.seen.append((where, _name(self.func)))
        if where == ORM and not isinstance(self, DatabaseSyncToAsync):
            hops.outside_database_sync_to_async.append(_name(self.func))
        return await original(self, *args, **kwargs)

    loop = asyncio.get_running_loop()
    run_in_executor = loop.run_in_executor

    def handing_off(executor: Any, func: Any, *args: Any) -> Any:
        hops.handed_off += 1
        return run_in_executor(executor, func, *args)

    SyncToAsync.__call__ = recording  # type: ignore[method-assign]
    loop.run_in_executor = handing_off  # type: ignore[method-assign]
    try:
        yield hops
    finally:
        SyncToAsync.__call__ = original  # type: ignore[method-assign]
        del loop.run_in_executor  # the class's method again


async def _turn(comm: Any, frame: dict[str, Any], *, limits_cached: bool = False) -> Any:
    """Hops from the frame sent until its turn has ended (saved, `done`, out of the registry)
    and every socket has handled what the turn sent it."""
    if not limits_cached:
        plans.forget_cached_limits()
    with recorded_hops() as hops:
        await comm.send_to(text_data=json.dumps(frame))
        result = await receive_until_done(comm)
        turn = registry.get(result["done"]["mid"])
        if turn is not None and turn.task is not None:
            await turn.task  # its stream log closed, its metrics reported
        await comm.receive_nothing(timeout=0.2)  # the `chat.exchange` echo, handled
    assert result["done"]["status"] == "complete"
    assert len(result["text"].split()) == 50
    return hops, result


def prompt(text: str, conversation: str = "") -> dict[str, Any]:
    return {"type": "prompt", "conversation": conversation, "text": text}


async def test_a_turn_makes_three_trips_to_the_orm_thread_and_none_to_a_worker(
    connect: Any, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    comm = await connect(owner)
    hops, result = await _turn(comm, prompt("/long 50"))
    # A new conversation, the user's limits not cached (every user of a burst).
    assert hops.names() == [
        (ORM, "_begin_exchange"),
        (ORM, "resolve_limits"),
        (ORM, "save_answer"),
    ], hops.seen
    # No hop but these: none around asgiref (the memory limiter's clean-up was one per window).
    assert hops.handed_off == len(hops.seen)
    # Connection hygiene without Channels' per-message hop: every trip to the ORM thread closes
    # stale connections before and after itself (CONN_MAX_AGE, health checks).
    assert hops.outside_database_sync_to_async == []

    conversation = re.search(r'id="conversation-id" value="([^"]+)"', "".join(result["html"]))
    assert conversation
    # A follow-up a moment later: the limits come from the cache.
    monkeypatch.setattr(plans, "LIMITS_CACHE_SECONDS", 60.0)
    await _turn(comm, prompt("/long 50", conversation.group(1)))  # fills the cache for sure
    hops, _ = await _turn(comm, prompt("/long 50", conversation.group(1)), limits_cached=True)
    assert hops.names() == [(ORM, "_begin_exchange"), (ORM, "save_answer")], hops.seen
    assert hops.handed_off == len(hops.seen)
    assert hops.outside_database_sync_to_async == []


async def test_another_tab_of_the_user_makes_one_trip_for_the_new_exchange(
    connect: Any, owner: Any
) -> None:
    other_tab = await connect(owner)
    comm = await connect(owner)
    hops, _ = await _turn(comm, prompt("/long 50"))
    html = await other_tab.receive_from(timeout=10)  # its sidebar gets the new conversation
    assert not html.startswith("{")
    assert hops.names() == [
        (ORM, "_begin_exchange"),
        (ORM, "_exchange_for_watchers"),  # the other tab: the session check and its HTML
        (ORM, "resolve_limits"),
        (ORM, "save_answer"),
    ], hops.seen
    assert hops.handed_off == len(hops.seen)
    assert hops.outside_database_sync_to_async == []


async def test_a_turn_resolves_its_limits_once_even_when_the_cache_ran_out(
    connect: Any, owner: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a burst the ORM thread's queue is seconds long, longer than the limits' 2 s cache:
    the turn's start checked the plan (the full model allowed?) with a second resolution. It
    uses the limits its admission resolved instead."""
    monkeypatch.setattr(plans, "LIMITS_CACHE_SECONDS", 0.0)  # every lookup misses
    comm = await connect(owner)
    hops, _ = await _turn(comm, prompt("/long 50"))
    assert [name for _, name in hops.seen].count("resolve_limits") == 1, hops.seen


async def test_the_memory_limiter_still_drops_expired_hits_without_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its clean-up moved onto the loop: windows whose hits have all expired still go (memory
    stays bounded), and no executor is used for it."""
    monkeypatch.setattr(limiter, "MEMORY_EXPIRY_SECONDS", 0.0)
    storage = limiter.LoopMemoryStorage()
    window = MovingWindowRateLimiter(storage)
    with recorded_hops() as hops:
        assert await window.hit(parse("1/second"), "old")
        await asyncio.sleep(1.1)  # the window of "old" is over
        assert await window.hit(parse("1/second"), "new")  # starts a clean-up
        assert storage.timer is not None
        await storage.timer
    assert "old" not in str(list(storage.events)) and "new" in str(list(storage.events))
    assert hops.handed_off == 0

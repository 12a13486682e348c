"""The turns running in this process: found by message id, stopped from anywhere, drained."""

from __future__ import annotations

import asyncio
import weakref

from chat.turns.control import Control, get_control
from chat.turns.turn import Turn


class TurnRegistry:
    """The turns running in this process: found by message id, stopped, drained on shutdown."""

    def __init__(self) -> None:
        self.turns: dict[str, Turn] = {}
        # The control channel each loop listens on for stops asked on other instances.
        self._listening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Control]
        self._listening = weakref.WeakKeyDictionary()
        self._starting: set[asyncio.Task[None]] = set()

    def get(self, mid: str) -> Turn | None:
        return self.turns.get(mid)

    def count(self) -> int:
        return len(self.turns)

    def start(self, turn: Turn) -> Turn:
        self._listen_for_stops()
        self.turns[turn.mid] = turn
        turn.on_end = self._ended
        turn.streaming = self.count
        turn.start()
        return turn

    def _ended(self, turn: Turn) -> None:
        if self.turns.get(turn.mid) is turn:
            del self.turns[turn.mid]

    def _listen_for_stops(self) -> None:
        loop = asyncio.get_running_loop()
        control = get_control()
        if self._listening.get(loop) is control:
            return
        self._listening[loop] = control
        control.on_stop(self._stop_asked_elsewhere)
        task = loop.create_task(control.start())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def _stop_asked_elsewhere(self, mid: str) -> None:
        self.stop_local(mid)

    def stop_local(self, mid: str) -> bool:
        turn = self.turns.get(mid)
        return turn.stop() if turn is not None else False

    async def stop(self, mid: str) -> None:
        """Stop a turn wherever it runs: here at once, elsewhere through the control channel."""
        if not self.stop_local(mid):
            await get_control().request_stop(mid)

    async def drain(self, grace: float) -> None:
        """Let running turns end within `grace` seconds, then stop the rest (saved as failed)."""
        tasks = [t.task for t in self.turns.values() if t.task is not None]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=10)


registry = TurnRegistry()

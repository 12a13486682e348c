"""Answers streaming on another instance, as this process shows them: one follower of the stream
log per answer (chat/turns/follow.py), shared by every tab of the process that resumes it.

A tab that resumes such an answer attaches to its mirror as it would to a local turn: it gets
the chunks after its `after` and the blocks so far from memory, then the live ones. So the log
is read and the answer's blocks are rendered once per process, not once per resume: a tab that
resumed every half second used to make the event loop render the whole answer every time
(hostile review). A mirror that loses its last tab lingers a while (a tab that resumes, or
reconnects, finds it), then stops; it ends with the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref

from chat.turns.feed import Feed, Watcher
from chat.turns.follow import follow

# How long a mirror no tab watches goes on reading the log (a reconnecting tab comes back).
LINGER_SECONDS = 30.0


class Mirror(Feed):
    """One answer streaming elsewhere, followed through its log for this process's tabs."""

    def __init__(self, mid: str) -> None:
        super().__init__(mid)
        self.task: asyncio.Task[None] | None = None
        self._idle: asyncio.TimerHandle | None = None

    def attach(self, watcher: Watcher, after: int, first_block: int = 0) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        super().attach(watcher, after, first_block)

    def detach(self, watcher: Watcher) -> None:
        super().detach(watcher)
        if not self.watchers and self.final_frames is None and self._idle is None:
            self._idle = asyncio.get_running_loop().call_later(LINGER_SECONDS, self._stop_idle)

    def _stop_idle(self) -> None:
        self._idle = None
        if not self.watchers and self.task is not None:
            self.task.cancel()


class Mirrors:
    """The mirrors of each event loop (production runs one; tests run servers in threads)."""

    def __init__(self) -> None:
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Mirror]]
        self._loops = weakref.WeakKeyDictionary()

    def follow(self, mid: str) -> Mirror:
        """The mirror of `mid`, started now if this loop has none running."""
        mirrors = self._loops.setdefault(asyncio.get_running_loop(), {})
        mirror = mirrors.get(mid)
        if mirror is not None and mirror.task is not None and not mirror.task.done():
            return mirror
        mirror = Mirror(mid)
        mirrors[mid] = mirror
        mirror.task = asyncio.get_running_loop().create_task(
            follow(mid, mirror), name=f"mirror {mid}"
        )
        mirror.task.add_done_callback(lambda _task: self._ended(mirrors, mirror))
        return mirror

    def get(self, mid: str) -> Mirror | None:
        return self._loops.get(asyncio.get_running_loop(), {}).get(mid)

    def _ended(self, mirrors: dict[str, Mirror], mirror: Mirror) -> None:
        if mirrors.get(mirror.mid) is mirror:
            del mirrors[mirror.mid]
        if mirror._idle is not None:
            mirror._idle.cancel()
            mirror._idle = None

    async def stop_all(self) -> None:
        """Shutdown: stop this loop's followers (their tabs reconnect elsewhere and resume)."""
        tasks = [m.task for m in self._loops.get(asyncio.get_running_loop(), {}).values() if m.task]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


mirrors = Mirrors()

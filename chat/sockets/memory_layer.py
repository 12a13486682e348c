"""The channel layer of one process (no REDIS_URL): Channels' in-memory layer, swept less often.

Channels' `InMemoryChannelLayer` sweeps every channel and every group for expired messages and
memberships on each `receive` and each `group_send`. Every open tab waits in a `receive` and
every turn's start is a `group_send`, so with N tabs open each of those walks N channels and
N groups: 2-3 % of a turn's CPU with 200 tabs, growing with the tabs (bench/turn_cpu.py's
profile, docs/decisions/performance.md). Here the sweep runs at most once a second. Messages
expire after `expiry` (60 s) and memberships after `group_expiry` (a day): a sweep up to a
second late changes nothing a tab can see.
"""

from __future__ import annotations

import time

from channels.layers import InMemoryChannelLayer


class MemoryChannelLayer(InMemoryChannelLayer):
    """`InMemoryChannelLayer` whose expiry sweep runs at most every `sweep_every` seconds."""

    sweep_every = 1.0

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._next_sweep = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.sweep_every
        super()._clean_expired()

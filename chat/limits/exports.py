"""How many exports run at once: per user and per instance, counted in this process.

An export streams (chat.json_pieces) with bounded memory, but each holds a database
connection's worth of work for as long as it runs: one person starting many at once, or many
people at once, must not take the instance's database thread (issue 19's review, finding 2).
"""

from __future__ import annotations

import threading
from collections import Counter

from django.conf import settings

_lock = threading.Lock()
_per_user: Counter[int] = Counter()


class ExportSlot:
    """One running export's place; `release` gives it back (once, however often it is called)."""

    def __init__(self, user_id: int) -> None:
        self.user_id = user_id
        self._held = True

    def release(self) -> None:
        with _lock:
            if not self._held:
                return
            self._held = False
            _per_user[self.user_id] -= 1
            if _per_user[self.user_id] <= 0:
                del _per_user[self.user_id]


def take_export_slot(user_id: int) -> ExportSlot | None:
    """A place for an export by this user, or None when the user (CHAT_EXPORTS_PER_USER) or
    the instance (CHAT_EXPORTS_PER_INSTANCE) already runs as many as allowed."""
    with _lock:
        if _per_user[user_id] >= settings.CHAT_EXPORTS_PER_USER:
            return None
        if _per_user.total() >= settings.CHAT_EXPORTS_PER_INSTANCE:
            return None
        _per_user[user_id] += 1
    return ExportSlot(user_id)


def running_exports() -> int:
    with _lock:
        return _per_user.total()

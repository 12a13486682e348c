"""What a turn holds from the limiter while it runs (chat.limits.limiter.Admission), as the
turn and its start see it."""

from __future__ import annotations

from typing import Any, Protocol


class Settlement(Protocol):
    """A stream slot and a token reservation: fitted once the prompt is known, refreshed while
    the answer streams, settled exactly once when it ends."""

    limited: bool  # a budget caps the turn: fit the reservation with resize()
    settled: bool

    def record(self) -> dict[str, Any] | None:
        """What releasing it needs, kept with the answer for when this process dies."""
        ...

    async def resize(self, tokens: int) -> int:
        """Make the reservation `tokens` (at most what is left); return what it holds now."""
        ...

    async def refresh(self) -> None: ...

    async def settle(self, used_tokens: int | None) -> int | None:
        """Release the slot and reconcile the tokens; return today's tokens left (or None)."""
        ...

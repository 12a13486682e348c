"""What an admitted prompt holds until its turn ends (chat.limits.limiter admits it): a stream
slot and reserved tokens, refreshed while the turn runs and settled when it ends."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from chat.limits.budget import usable
from chat.limits.plans import UserLimits
from chat.limits.storage import Backend, Budgets, Pool, Settled
from chat.redis_clients import REDIS_DOWN


class Limiter(Protocol):
    """What an admission uses of the limiter that admitted it (chat.limits.limiter.Limiter)."""

    lease_seconds: float
    _backend: Backend

    def _note_failure(self, operation: str, exc: BaseException) -> None: ...


logger = logging.getLogger("chat.limits.limiter")  # the limiter's own log lines, as before


class Admission:
    """What an admitted prompt holds until its turn ends: a stream slot and reserved tokens.

    The turn calls `refresh()` every `refresh_interval` seconds and `settle()` exactly when it
    ends (settling twice is harmless). A turn that dies without settling loses its slot when
    the lease runs out; its reservation stays charged (the safe side of a quota).
    """

    def __init__(
        self,
        limiter: Limiter,
        user_id: int,
        *,
        reserved: int,
        slot_id: str,
        day: str,
        limits: UserLimits,
        budgets: Budgets | None = None,
        degraded: bool = False,
        pool: Pool = "streams",
    ) -> None:
        self.user_id = user_id
        self.pool: Pool = pool  # the slot set it holds a slot in
        self.reserved = reserved
        self.slot_id = slot_id
        self.day = day
        self.limits = limits
        self.budgets = budgets or Budgets(max(0, limits.daily_tokens), 0)
        # Admitted while the storage was down ("open" policy): nothing to refresh or settle.
        self.degraded = degraded
        self._limiter = limiter
        self.settled = False
        # Whether a budget (the user's quota, the site's) caps this turn: then its answer's
        # `max_tokens` must fit the reservation. Not while the storage is down (open policy).
        self.limited = not degraded and (self.budgets.quota > 0 or self.budgets.everyone > 0)

    def __repr__(self) -> str:
        return (
            f"<Admission user={self.user_id} reserved={self.reserved} slot={self.slot_id}"
            f"{' degraded' if self.degraded else ''}{' settled' if self.settled else ''}>"
        )

    @property
    def refresh_interval(self) -> float:
        """A third of the lease: two refreshes may be lost before the slot expires."""
        return self._limiter.lease_seconds / 3

    def record(self) -> dict[str, Any] | None:
        """What releasing this admission needs, to store with the answer: if the process
        holding it dies, whoever marks the answer failed releases it (Limiter.release_dead).
        None when there is nothing to release (admitted while the storage was down)."""
        if self.degraded:
            return None
        return {"slot": self.slot_id, "day": self.day, "reserved": self.reserved}

    async def refresh(self) -> None:
        """Extend the stream slot's lease; the turn calls this while it streams."""
        if self.settled or self.degraded:
            return
        try:
            held = await self._limiter._backend.refresh(self.user_id, self.slot_id, pool=self.pool)
        except REDIS_DOWN as exc:
            self._limiter._note_failure("refresh", exc)
            return
        if not held:
            # The lease ran out (a long pause, a Redis failover); the turn goes on, but the
            # slot is not recreated: that could push the user over the cap.
            logger.info("stream slot %s of user %s had expired", self.slot_id, self.user_id)

    async def resize(self, tokens: int) -> int:
        """Make the reservation `tokens`, once the turn knows its prompt: give back what it
        does not need, or take more, at most what is left of the budgets (atomically).
        Returns the reservation now held."""
        tokens = max(0, tokens)
        if self.settled or self.degraded or tokens == self.reserved:
            return self.reserved
        try:
            held = await self._limiter._backend.resize(
                self.user_id, self.slot_id, day=self.day, target=tokens, budgets=self.budgets
            )
            if held is not None:  # None: released meanwhile (a reaper took it for dead)
                self.reserved = held
        except REDIS_DOWN as exc:
            # Keep what is held: a cap still applies to the answer, and settle reconciles.
            self._limiter._note_failure("resize", exc)
        return self.reserved

    async def settle(self, used_tokens: int | None) -> int | None:
        """Free the slot and reconcile: refund the unused reservation, or charge the excess
        (never past the budgets: what a user is limited by never exceeds their quota).

        `used_tokens` None or 0 means the turn failed and delivered nothing: refund it all.
        Returns today's usable tokens for the usage meter (None: no budget, or unknown), so
        the turn never has to ask the limiter again.
        """
        if self.settled:
            return None
        # Mark first: a second settle racing this one (stop + the turn's own finally) must
        # not refund twice.
        self.settled = True
        if self.degraded:
            return None
        try:
            settled = await self._limiter._backend.release(
                self.user_id,
                self.slot_id,
                day=self.day,
                spent=max(0, used_tokens or 0),
                budgets=self.budgets,
                pool=self.pool,
            )
        except REDIS_DOWN as exc:
            # The slot will expire with its lease; the reservation stays charged.
            self._limiter._note_failure("settle", exc)
            return None
        return usable_left(self.budgets, settled)


def usable_left(budgets: Budgets, counted: Settled) -> int | None:
    """Tokens a user can still spend today under both budgets (0 when too few for a turn);
    None when neither budget applies."""
    lefts = []
    if budgets.quota > 0:
        lefts.append(budgets.quota - counted.charged)
    if budgets.everyone > 0:
        lefts.append(budgets.everyone - counted.spent_by_all)
    return usable(max(0, min(lefts))) if lefts else None

"""Where stream slots and token reservations are counted: Redis (shared by every instance, one
atomic Lua script per step) or this process's memory."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Literal, NamedTuple, Protocol

import redis.asyncio as aioredis

# A day's token counter must outlive the day (turns that settle after midnight reconcile
# against the day they reserved on) but not linger: two days.
TOKEN_KEY_TTL_SECONDS = 2 * 86400

Status = Literal["ok", "streams", "tokens", "budget"]
# Which of a user's slot sets a turn takes: "streams" (their answers, capped by their plan) or
# "titles" (a conversation's title, asked for in the background: its own set, so a title never
# takes the slot of the user's next prompt; see docs/decisions/continue-and-titles.md).
Pool = Literal["streams", "titles"]


class Verdict(NamedTuple):
    status: Status
    streams: int  # live slots (after ours, when admitted)
    charged: int  # the user's tokens counted today (after our reservation, when admitted)
    granted: int  # tokens reserved for us (admitted), or what was left (refused for tokens)


class Settled(NamedTuple):
    charged: int  # the user's tokens counted today, after this turn
    spent_by_all: int  # every user's tokens counted today (the global budget's count)


class Budgets(NamedTuple):
    """The two daily budgets a reservation must fit: the user's quota and the whole site's.

    0 = unlimited. Both are counted whatever they are, so a budget switched on mid-day (or a
    user moved to a limited plan) sees the day's true count.
    """

    quota: int
    everyone: int


class Reservation(NamedTuple):
    """What an admission asks to hold, the same for every storage and slot set: a slot among
    at most `cap` in `pool`, and `want` tokens of the `budgets` on `day` — or what is left if
    that is less, but never less than `at_least` (else refused)."""

    cap: int
    want: int
    at_least: int
    budgets: Budgets
    day: str
    pool: Pool = "streams"


class Backend(Protocol):
    async def reserve(self, user_id: int, slot_id: str, ask: Reservation) -> Verdict: ...
    async def resize(
        self, user_id: int, slot_id: str, *, day: str, target: int, budgets: Budgets
    ) -> int | None: ...
    async def refresh(self, user_id: int, slot_id: str, *, pool: Pool = "streams") -> bool: ...
    async def release(
        self,
        user_id: int,
        slot_id: str,
        *,
        day: str,
        spent: int,
        budgets: Budgets,
        pool: Pool = "streams",
    ) -> Settled: ...
    async def tokens_used(self, user_id: int, day: str) -> tuple[int, int]: ...
    async def forgive(self, user_id: int, day: str) -> int: ...
    async def close(self) -> None: ...


# Keys of one user share a hash tag, so a script may touch several on a Redis Cluster; the
# site-wide counter does not (see docs/decisions/rate-limiting.md: no Cluster with channels-redis).
# Per user and UTC day: `tokens` counts what was spent or is reserved; `forgiven` is what an
# admin's reset forgave of it (what counts against the quota is tokens - forgiven: the reset
# keeps the count and the Usage history, and records an allowance instead of deleting); `held`
# maps each turn's slot id to what it holds reserved, so whoever settles it — the turn, or
# the reaper for a turn whose process died — settles exactly what it holds, exactly once.
_HEAD = """
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
local forgiven = tonumber(redis.call('GET', KEYS[3]) or '0')
local spent_all = tonumber(redis.call('GET', KEYS[4]) or '0')
local function room(quota, everyone, charged, all)
  local left = -1  -- unlimited
  if quota > 0 then left = math.max(0, quota - charged) end
  if everyone > 0 then
    local all_left = math.max(0, everyone - all)
    if left < 0 or all_left < left then left = all_left end
  end
  return left
end
"""

# Slots: a sorted set of slot ids scored by lease expiry (ms, Redis's clock, so instances'
# clock skew cannot expire each other's slots early). The reservation takes what the turn
# wants, or what is left if less, but never less than `at_least`: all in one atomic step, so
# concurrent turns (tabs, instances) cannot both take the same remainder.
_RESERVE_LUA = (
    _HEAD
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
local want, at_least = tonumber(ARGV[4]), tonumber(ARGV[5])
local quota, everyone, ttl = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local streams = redis.call('ZCARD', KEYS[1])
local charged = math.max(0, used - forgiven)
if streams >= cap then return {1, streams, charged, 0} end
if quota > 0 and quota - charged < at_least then
  return {2, streams, charged, math.max(0, quota - charged)}
end
if everyone > 0 and everyone - spent_all < at_least then
  return {3, streams, charged, math.max(0, everyone - spent_all)}
end
local left = room(quota, everyone, charged, spent_all)
local take = want
if left >= 0 and left < take then take = left end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease + 1000)
redis.call('SET', KEYS[2], used + take, 'EX', ttl)
redis.call('SET', KEYS[4], spent_all + take, 'EX', ttl)
redis.call('HSET', KEYS[5], ARGV[1], take)
redis.call('EXPIRE', KEYS[5], ttl)
return {0, streams + 1, charged + take, take}
"""
)

# A reservation made to measure once the prompt is known: shrinking gives back the
# difference; growing takes at most what is left of both budgets. Returns the new size, or -1
# when the slot holds nothing any more (settled, or released as a dead turn's).
_RESIZE_LUA = (
    _HEAD
    + """
local held = tonumber(redis.call('HGET', KEYS[5], ARGV[1]) or '-1')
if held < 0 then return -1 end
local target = tonumber(ARGV[2])
local quota, everyone, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local delta = target - held
if delta > 0 then
  local left = room(quota, everyone, math.max(0, used - forgiven), spent_all)
  if left >= 0 and left < delta then delta = left end
end
if delta == 0 then return held end
used = math.max(0, used + delta)
redis.call('SET', KEYS[2], used, 'EX', ttl)
-- Giving back after an admin's reset: the allowance never exceeds what is counted.
if forgiven > used then redis.call('SET', KEYS[3], used, 'EX', ttl) end
redis.call('SET', KEYS[4], math.max(0, spent_all + delta), 'EX', ttl)
redis.call('HSET', KEYS[5], ARGV[1], held + delta)
return held + delta
"""
)

_REFRESH_LUA = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease + 1000)
return 1
"""

# Settling: free the slot, take the reservation back out, and charge what the turn spent,
# but never past either budget: the count a user is limited by never exceeds their quota,
# even when an upstream reports more than the turn reserved (the Usage history keeps the truth).
_RELEASE_LUA = (
    _HEAD
    + """
if ARGV[1] ~= '' then redis.call('ZREM', KEYS[1], ARGV[1]) end
local held = redis.call('HGET', KEYS[5], ARGV[1])
if not held then
  -- Settled before (by the turn, or by a reaper): nothing is held, nothing more is charged.
  return {math.max(0, used - forgiven), spent_all}
end
redis.call('HDEL', KEYS[5], ARGV[1])
held = tonumber(held)
local spent = tonumber(ARGV[2])
local quota, everyone, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
used = math.max(0, used - held)
if forgiven > used then
  forgiven = used
  redis.call('SET', KEYS[3], used, 'EX', ttl)
end
spent_all = math.max(0, spent_all - held)
local left = room(quota, everyone, used - forgiven, spent_all)
if left >= 0 and left < spent then spent = left end
redis.call('SET', KEYS[2], used + spent, 'EX', ttl)
redis.call('SET', KEYS[4], spent_all + spent, 'EX', ttl)
return {used + spent - forgiven, spent_all + spent}
"""
)

# An admin's reset: forgive everything counted so far (spent and reserved). Returns how much.
_FORGIVE_LUA = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local forgiven = tonumber(redis.call('GET', KEYS[2]) or '0')
redis.call('SET', KEYS[2], used, 'EX', ARGV[1])
return math.max(0, used - forgiven)
"""


class RedisBackend:
    def __init__(self, client: aioredis.Redis, prefix: str, lease_seconds: float) -> None:
        self._client = client
        self._prefix = prefix
        self._lease_ms = max(1, int(lease_seconds * 1000))
        self._reserve = client.register_script(_RESERVE_LUA)
        self._resize = client.register_script(_RESIZE_LUA)
        self._refresh = client.register_script(_REFRESH_LUA)
        self._release = client.register_script(_RELEASE_LUA)
        self._forgive = client.register_script(_FORGIVE_LUA)

    def _slots_key(self, user_id: int, pool: Pool = "streams") -> str:
        return f"{self._prefix}{{u:{user_id}}}:{pool}"

    def _token_keys(self, user_id: int, day: str) -> list[str]:
        return [
            f"{self._prefix}{{u:{user_id}}}:tokens:{day}",
            f"{self._prefix}{{u:{user_id}}}:forgiven:{day}",
            f"{self._prefix}everyone:tokens:{day}",
            f"{self._prefix}{{u:{user_id}}}:held:{day}",
        ]

    async def reserve(self, user_id: int, slot_id: str, ask: Reservation) -> Verdict:
        code, streams, charged, granted = await self._reserve(
            keys=[self._slots_key(user_id, ask.pool), *self._token_keys(user_id, ask.day)],
            args=[
                slot_id,
                self._lease_ms,
                ask.cap,
                ask.want,
                ask.at_least,
                ask.budgets.quota,
                ask.budgets.everyone,
                TOKEN_KEY_TTL_SECONDS,
            ],
        )
        statuses: tuple[Status, ...] = ("ok", "streams", "tokens", "budget")
        return Verdict(statuses[int(code)], int(streams), int(charged), int(granted))

    async def resize(
        self, user_id: int, slot_id: str, *, day: str, target: int, budgets: Budgets
    ) -> int | None:
        size = await self._resize(
            keys=[self._slots_key(user_id), *self._token_keys(user_id, day)],
            args=[slot_id, target, budgets.quota, budgets.everyone, TOKEN_KEY_TTL_SECONDS],
        )
        return None if int(size) < 0 else int(size)

    async def refresh(self, user_id: int, slot_id: str, *, pool: Pool = "streams") -> bool:
        held = await self._refresh(
            keys=[self._slots_key(user_id, pool)], args=[slot_id, self._lease_ms]
        )
        return bool(held)

    async def release(
        self,
        user_id: int,
        slot_id: str,
        *,
        day: str,
        spent: int,
        budgets: Budgets,
        pool: Pool = "streams",
    ) -> Settled:
        """Free the slot, return what it holds, charge what was spent (within the budgets)."""
        charged, spent_by_all = await self._release(
            keys=[self._slots_key(user_id, pool), *self._token_keys(user_id, day)],
            args=[slot_id, spent, budgets.quota, budgets.everyone, TOKEN_KEY_TTL_SECONDS],
        )
        return Settled(max(0, int(charged)), max(0, int(spent_by_all)))

    async def tokens_used(self, user_id: int, day: str) -> tuple[int, int]:
        """(the user's tokens counted today, every user's tokens counted today)."""
        used, forgiven, spent_by_all = await self._client.mget(self._token_keys(user_id, day)[:3])
        return max(0, int(used or 0) - int(forgiven or 0)), int(spent_by_all or 0)

    async def forgive(self, user_id: int, day: str) -> int:
        keys = self._token_keys(user_id, day)[:2]
        return int(await self._forgive(keys=keys, args=[TOKEN_KEY_TTL_SECONDS]))

    async def close(self) -> None:
        await self._client.aclose()


def _room(budgets: Budgets, charged: int, spent_by_all: int) -> int | None:
    """Tokens left under both budgets; None when neither applies."""
    lefts = []
    if budgets.quota > 0:
        lefts.append(max(0, budgets.quota - charged))
    if budgets.everyone > 0:
        lefts.append(max(0, budgets.everyone - spent_by_all))
    return min(lefts) if lefts else None


class MemoryBackend:
    """The same semantics inside one process: for `make run` without Redis, and the tests.

    One asyncio.Lock and no await inside it: each step is as atomic as a Redis script.
    """

    def __init__(self, lease_seconds: float) -> None:
        self._lease = lease_seconds
        self._lock = asyncio.Lock()
        # (user, pool) → slot → expiry (monotonic)
        self._slots: dict[tuple[int, Pool], dict[str, float]] = {}
        self._tokens: dict[tuple[int, str], int] = {}  # (user, UTC day) → tokens counted
        self._forgiven: dict[tuple[int, str], int] = {}  # (user, UTC day) → forgiven by a reset
        self._everyone: dict[str, int] = {}  # UTC day → every user's tokens
        self._held: dict[tuple[int, str], dict[str, int]] = {}  # (user, day) → slot → held
        self._pruned_day = ""

    def _live_slots(self, user_id: int, now: float, pool: Pool = "streams") -> dict[str, float]:
        slots = {s: exp for s, exp in self._slots.get((user_id, pool), {}).items() if exp > now}
        self._slots[(user_id, pool)] = slots
        return slots

    def _prune(self, day: str) -> None:
        if day == self._pruned_day:
            return
        # A new day: yesterday stays for late settles, older days go (like the TTL).
        yesterday = (datetime.strptime(day, "%Y-%m-%d") - timedelta(days=1)).strftime("%Y-%m-%d")
        self._tokens = {k: v for k, v in self._tokens.items() if k[1] >= yesterday}
        self._forgiven = {k: v for k, v in self._forgiven.items() if k[1] >= yesterday}
        self._everyone = {k: v for k, v in self._everyone.items() if k >= yesterday}
        self._held = {k: v for k, v in self._held.items() if k[1] >= yesterday}
        self._slots = {u: s for u, s in self._slots.items() if s}
        self._pruned_day = day

    def _charged(self, key: tuple[int, str]) -> int:
        return max(0, self._tokens.get(key, 0) - self._forgiven.get(key, 0))

    def _add(self, key: tuple[int, str], delta: int) -> None:
        used = max(0, self._tokens.get(key, 0) + delta)
        self._tokens[key] = used
        # Giving back after an admin's reset: the allowance never exceeds what is counted.
        if self._forgiven.get(key, 0) > used:
            self._forgiven[key] = used
        self._everyone[key[1]] = max(0, self._everyone.get(key[1], 0) + delta)

    async def reserve(self, user_id: int, slot_id: str, ask: Reservation) -> Verdict:
        cap, want, at_least, budgets, day, pool = ask
        async with self._lock:
            self._prune(day)
            slots = self._live_slots(user_id, time.monotonic(), pool)
            key = (user_id, day)
            charged, spent_by_all = self._charged(key), self._everyone.get(day, 0)
            if len(slots) >= cap:
                return Verdict("streams", len(slots), charged, 0)
            if budgets.quota > 0 and budgets.quota - charged < at_least:
                return Verdict("tokens", len(slots), charged, max(0, budgets.quota - charged))
            if budgets.everyone > 0 and budgets.everyone - spent_by_all < at_least:
                all_left = max(0, budgets.everyone - spent_by_all)
                return Verdict("budget", len(slots), charged, all_left)
            left = _room(budgets, charged, spent_by_all)
            take = want if left is None else min(want, left)
            slots[slot_id] = time.monotonic() + self._lease
            self._add(key, take)
            self._held.setdefault(key, {})[slot_id] = take
            return Verdict("ok", len(slots), charged + take, take)

    async def resize(
        self, user_id: int, slot_id: str, *, day: str, target: int, budgets: Budgets
    ) -> int | None:
        async with self._lock:
            key = (user_id, day)
            holds = self._held.get(key, {})
            if slot_id not in holds:
                return None
            delta = target - holds[slot_id]
            if delta > 0:
                left = _room(budgets, self._charged(key), self._everyone.get(day, 0))
                if left is not None:
                    delta = min(delta, left)
            self._add(key, delta)
            holds[slot_id] += delta
            return holds[slot_id]

    async def refresh(self, user_id: int, slot_id: str, *, pool: Pool = "streams") -> bool:
        async with self._lock:
            slots = self._live_slots(user_id, time.monotonic(), pool)
            if slot_id not in slots:
                return False
            slots[slot_id] = time.monotonic() + self._lease
            return True

    async def release(
        self,
        user_id: int,
        slot_id: str,
        *,
        day: str,
        spent: int,
        budgets: Budgets,
        pool: Pool = "streams",
    ) -> Settled:
        async with self._lock:
            self._slots.get((user_id, pool), {}).pop(slot_id, None)
            key = (user_id, day)
            held = self._held.get(key, {}).pop(slot_id, None)
            if held is None:  # settled before: nothing is held, nothing more is charged
                return Settled(self._charged(key), self._everyone.get(day, 0))
            self._add(key, -held)
            left = _room(budgets, self._charged(key), self._everyone.get(day, 0))
            self._add(key, spent if left is None else min(spent, left))
            return Settled(self._charged(key), self._everyone.get(day, 0))

    async def tokens_used(self, user_id: int, day: str) -> tuple[int, int]:
        return self._charged((user_id, day)), self._everyone.get(day, 0)

    async def forgive(self, user_id: int, day: str) -> int:
        async with self._lock:
            key = (user_id, day)
            forgiven = self._charged(key)
            self._forgiven[key] = self._tokens.get(key, 0)
            return forgiven

    async def close(self) -> None:
        return None

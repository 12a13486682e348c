"""One chat turn: stream the upstream, number and coalesce chunks, log them, persist the answer.

A turn runs as its own task, decoupled from any socket: a dropped socket does not end it, an
explicit stop does (and closes the upstream request at once). Watchers — the tab that asked,
other tabs on this instance — attach to the turn and get frames pushed to them; watchers on
other instances read the stream log, which the turn appends to once per coalesced frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

from channels.db import database_sync_to_async
from django.conf import settings

from chat import frames, metrics, services
from chat.control import get_control
from chat.logging import bind_turn
from chat.models import Message
from chat.streamlog import get_stream_log
from chat.upstream import Delta, Finish, UpstreamError, Usage, get_client

log = logging.getLogger(__name__)

FAILED_INTERNAL = "Something went wrong on our side; the partial answer is saved. You can retry."


class Watcher(Protocol):
    """Something that shows a turn: a socket. `push` must not block (it queues)."""

    def push(self, frame: str) -> None: ...


class Settlement(Protocol):
    """What the limiter holds for a turn (chat.ratelimit.Admission)."""

    async def refresh(self) -> None: ...

    async def settle(self, used_tokens: int | None) -> None: ...


# Adaptive coalescing (docs/decisions/performance.md): a relayed answer costs CPU per socket
# frame (a send system call and a websocket frame per watcher), hardly per token. With few
# answers streaming, frames go out every CHAT_COALESCE_MS; beyond COALESCE_BUSY_TURNS answers
# in this process the window widens with the load, up to COALESCE_MAX_MS, so the frame rate
# of the whole process stops growing with the number of answers. At 50 tokens/s a token comes
# every 20 ms, so a 16 ms window merges nothing: from 16 answers on the window widens (32 ms at
# 32, 50 ms from 50), which took turns/s at 100 clients from 60 to 77 (performance.md).
COALESCE_BUSY_TURNS = 16
COALESCE_MAX_MS = 50.0


def coalesce_interval(base: float, streaming: int) -> float:
    """Seconds between two chunk frames of one answer while `streaming` answers run here."""
    if streaming <= COALESCE_BUSY_TURNS or base <= 0:
        return base  # 0 switches coalescing off, and stays off under load
    return min(max(base, COALESCE_MAX_MS / 1000), base * streaming / COALESCE_BUSY_TURNS)


def estimate_tokens(text: str) -> int:
    # ~4 characters per token for English; only used when the upstream reports no usage.
    return max(1, (len(text) + 3) // 4) if text else 0


class Turn:
    def __init__(
        self,
        *,
        mid: str,
        conversation_id: str,
        user_id: int,
        model: str,
        tier: str,
        messages: list[dict[str, str]],
        max_tokens: int | None = None,
        temperature: float | None = None,
        admission: Settlement | None = None,
        on_end: Callable[[Turn], None] | None = None,
    ) -> None:
        self.mid = mid
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.model = model
        self.tier = tier
        self.messages = messages
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.admission = admission
        self.on_end = on_end
        self.chunks: list[str] = []
        self.watchers: set[Watcher] = set()
        self.final_frames: list[str] | None = None
        self.status: str = Message.Status.STREAMING
        self.stop_requested = False
        self.task: asyncio.Task[None] | None = None
        self._pending: list[str] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._last_flush = float("-inf")
        self._interval = settings.CHAT_COALESCE_MS / 1000
        self._usage: Usage | None = None
        self._finish_reason = ""
        self._ttft_ms: int | None = None
        self._started = 0.0
        self._log = get_stream_log()

    # --- watchers -----------------------------------------------------------------------
    def attach(self, watcher: Watcher, after: int = -1) -> None:
        """Replay the chunks after `after`, then follow live: synchronous, so no seam."""
        for seq in range(after + 1, len(self.chunks)):
            watcher.push(frames.chunk(self.mid, seq, self.chunks[seq]))
        if self.final_frames is not None:
            for frame in self.final_frames:
                watcher.push(frame)
        else:
            self.watchers.add(watcher)

    def detach(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"turn {self.mid}")
        return self.task

    def stop(self) -> bool:
        """Stop the turn now; the upstream request is closed when its task unwinds."""
        if self.task is None or self.task.done() or self.final_frames is not None:
            return False
        self.stop_requested = True
        self.task.cancel()
        return True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        started = self._started = loop.time()
        # Every log line of this task (and of the tasks and threads it starts) names the turn.
        bind_turn(self.mid, conversation=self.conversation_id, user=self.user_id)
        metrics.turn_started(self.tier)
        heartbeat = loop.create_task(self._heartbeat(), name=f"heartbeat {self.mid}")
        status, error = Message.Status.COMPLETE, ""
        try:
            stream = get_client().stream_chat(
                model=self.model,
                messages=self.messages,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
            )
            # aclosing: a cancel between two items closes the upstream response at once.
            async with contextlib.aclosing(stream):
                async for item in stream:
                    if isinstance(item, Delta):
                        if self._ttft_ms is None:
                            self._ttft_ms = int((loop.time() - started) * 1000)
                        self._pending.append(item.text)
                        self._schedule_flush(loop)
                    elif isinstance(item, Usage):
                        self._usage = item
                    elif isinstance(item, Finish):
                        self._finish_reason = item.reason
            if self._finish_reason == "length":
                error = "The answer reached the model's length limit."
        except asyncio.CancelledError:
            if self.stop_requested:
                status = Message.Status.STOPPED
            else:  # the process is shutting down
                status, error = Message.Status.FAILED, services.INTERRUPTED
        except UpstreamError as exc:
            status, error = Message.Status.FAILED, exc.message
            metrics.upstream_error(exc.kind)
            log.warning("turn %s upstream %s: %s", self.mid, exc.kind, exc.message)
        except Exception:
            log.exception("turn %s failed", self.mid)
            status, error = Message.Status.FAILED, FAILED_INTERNAL
        finally:
            heartbeat.cancel()
        # Shielded: a second cancel (shutdown) must not lose the answer half-saved.
        await asyncio.shield(self._finish(status, error))

    def _schedule_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        # The first delta goes out at once; later ones wait at most one interval, coalesced.
        if self._flush_handle is not None:
            return
        interval = coalesce_interval(self._interval, len(registry.turns))
        delay = self._last_flush + interval - loop.time()
        if delay <= 0:
            self._flush()
        else:
            self._flush_handle = loop.call_later(delay, self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending.clear()
        seq = len(self.chunks)
        self.chunks.append(text)
        self._last_flush = asyncio.get_running_loop().time()
        frame = frames.chunk(self.mid, seq, text)
        for watcher in self.watchers:
            watcher.push(frame)
        self._log.append(self.mid, seq, text)

    async def _heartbeat(self) -> None:
        """Checkpoint the partial answer, extend the lease and the stream slot, poll stop."""
        control = get_control()
        while True:
            await asyncio.sleep(settings.CHAT_CHECKPOINT_SECONDS)
            try:
                await database_sync_to_async(services.do_checkpoint)(
                    self.mid, "".join(self.chunks), len(self.chunks)
                )
                if self.admission is not None:
                    await self.admission.refresh()
                if await control.stop_requested(self.mid):
                    self.stop()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("turn %s checkpoint failed", self.mid)

    async def _finish(self, status: str, error: str) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush()
        text = "".join(self.chunks)
        self.status = status
        usage = self._usage
        if usage is None:
            prompt_chars = sum(len(m["content"]) for m in self.messages)
            usage = Usage(estimate_tokens("x" * prompt_chars), estimate_tokens(text), True)
        metrics.turn_finished(
            tier=self.tier,
            status=status,
            ttft_ms=self._ttft_ms,
            prompt=usage.prompt_tokens,
            completion=usage.completion_tokens,
            chunk_count=len(self.chunks),
            seconds=asyncio.get_running_loop().time() - self._started,
        )
        # One trip to the ORM thread: save the answer, record its usage, render it.
        final_html: str | None = None
        try:
            final_html = await database_sync_to_async(_save_answer)(
                self.mid,
                dict(
                    text=text,
                    status=status,
                    error=error,
                    chunk_count=len(self.chunks),
                    prompt_tokens=usage.prompt_tokens,
                    completion_tokens=usage.completion_tokens,
                    usage_estimated=usage.estimated,
                    ttft_ms=self._ttft_ms,
                ),
                usage=(
                    (
                        self.user_id,
                        self.model,
                        self.tier,
                        usage.prompt_tokens,
                        usage.completion_tokens,
                    )
                    if self._charged(status, usage)
                    else None
                ),
            )
        except Exception:
            # _save_answer logs its own failures; this is the trip itself failing. The tab
            # still gets its `done`; the lease marks the answer failed with its checkpoint.
            log.exception("turn %s could not reach the database to finish", self.mid)
        tokens_left = await self._settle_limits(status, usage)
        done = frames.done(
            self.mid,
            len(self.chunks),
            status,
            usage.prompt_tokens,
            usage.completion_tokens,
            error=error,
            tokens_left=tokens_left,
        )
        final: list[str] = []
        if final_html is not None:
            final.append(final_html)
        final.append(json.dumps(done))
        self.final_frames = final
        for watcher in self.watchers:
            for frame in final:
                watcher.push(frame)
        self.watchers.clear()
        try:
            await self._log.finish(self.mid, done)
        except Exception:
            log.exception("turn %s could not close its stream log", self.mid)
        if self.on_end is not None:
            self.on_end(self)

    def _charged(self, status: str, usage: Usage) -> int:
        if status == Message.Status.FAILED and not self.chunks:
            return 0  # nothing delivered: refund the whole reservation
        return usage.prompt_tokens + usage.completion_tokens

    async def _settle_limits(self, status: str, usage: Usage) -> int | None:
        """Reconcile the token reservation; return today's tokens left (None: no quota)."""
        if self.admission is None:
            return None
        try:
            await self.admission.settle(self._charged(status, usage) or None)
            limits = getattr(self.admission, "limits", None)
            if limits is None or not limits.daily_tokens:
                return None
            from chat.ratelimit import get_limiter

            used, quota = await get_limiter().tokens_today(self.user_id)
            return max(0, quota - used)
        except Exception:
            log.exception("turn %s could not settle its limits", self.mid)
            return None


def _save_answer(
    mid: str, save: dict[str, Any], *, usage: tuple[int, str, str, int, int] | None
) -> str | None:
    """Save a finished answer, add its usage to today's row, and render it (its final frame).

    One call on the ORM thread for the three: that thread is a queue every turn passes
    through. Each part fails on its own (logged): an answer that could not be saved is marked
    failed with its last checkpoint once its lease runs out; usage that could not be recorded
    must not lose the answer. Returns None when there is nothing to show (the conversation was
    deleted meanwhile, or the save failed).
    """
    from chat.usage import add_usage

    message: Message | None = None
    try:
        message = services.do_finish_message(mid, **save)
    except Exception:
        log.exception("turn %s could not save its answer", mid)
    if usage is not None:
        try:
            add_usage(*usage)
        except Exception:
            log.exception("turn %s could not record its usage", mid)
    if message is None:
        return None
    try:
        return frames.final_message_html_sync(message)
    except Exception:
        log.exception("turn %s could not render its answer", mid)
        return None


class TurnRegistry:
    """The turns running in this process: found by message id, stopped, drained on shutdown."""

    def __init__(self) -> None:
        self.turns: dict[str, Turn] = {}
        self._control_loops: set[int] = set()
        self._control_start: asyncio.Task[None] | None = None

    def get(self, mid: str) -> Turn | None:
        return self.turns.get(mid)

    def start(self, turn: Turn) -> Turn:
        self._listen_for_stops()
        self.turns[turn.mid] = turn
        turn.on_end = self._ended
        turn.start()
        return turn

    def _ended(self, turn: Turn) -> None:
        if self.turns.get(turn.mid) is turn:
            del self.turns[turn.mid]

    def _listen_for_stops(self) -> None:
        loop = asyncio.get_running_loop()
        if id(loop) in self._control_loops:
            return
        self._control_loops.add(id(loop))
        control = get_control()
        control.on_stop(self._stop_requested_elsewhere)
        self._control_start = loop.create_task(control.start())

    def _stop_requested_elsewhere(self, mid: str) -> None:
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

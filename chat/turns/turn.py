"""One chat turn: stream the upstream, number and coalesce chunks, log them, persist the answer.

A turn runs as its own task, decoupled from any socket: a dropped socket does not end it, an
explicit stop does (and closes the upstream request at once). Watchers — the tab that asked,
other tabs on this instance — attach to the turn and get frames pushed to them; watchers on
other instances read the stream log, which the turn appends to once per coalesced frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from channels.db import database_sync_to_async
from django.conf import settings

from chat import conversations, metrics, protocol
from chat.limits.budget import QUOTA_REACHED, AnswerMeter, Fitted, QuotaReached
from chat.logging import bind_turn
from chat.models import LENGTH_LIMITED, Message
from chat.rendering import Block
from chat.tokens import chars_to_tokens
from chat.tokens import estimate_streamed_tokens as _estimate
from chat.turns.control import get_control
from chat.turns.feed import Feed
from chat.turns.feed import Watcher as Watcher  # where the turn's callers find it
from chat.turns.live_blocks import LiveBlocks
from chat.turns.model_client import get_client
from chat.turns.saving import clamp_tokens as _clamp_tokens
from chat.turns.saving import render_off_thread as _render_off_thread
from chat.turns.saving import save_answer as _save_answer
from chat.turns.settlement import Settlement as Settlement  # where the turn's callers find it
from chat.turns.streamlog import get_stream_log
from chat.upstream.errors import UpstreamError
from chat.upstream.items import Delta, Finish, StreamTiming, Usage

log = logging.getLogger(__name__)

FAILED_INTERNAL = "Something went wrong on our side; the partial answer is saved. You can retry."
DELETED = conversations.DELETED  # the error of an answer stopped by its chat's deletion


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


class Turn(Feed):
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
        budget: Fitted | None = None,
        on_end: Callable[[Turn], None] | None = None,
        streaming: Callable[[], int] = lambda: 1,
        received: float | None = None,
        earlier: tuple[list[str], Usage] | None = None,
        only_version: bool = False,
    ) -> None:
        super().__init__(mid)
        self.conversation_id = conversation_id
        self.user_id = user_id
        self.model = model
        self.tier = tier
        self.messages = messages
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.admission = admission
        self.budget = budget  # what a budget lets it use (None: no budget); stopped there
        self._meter = AnswerMeter(budget) if budget is not None else None
        self.on_end = on_end
        self.streaming = streaming  # turns streaming in this process: coalescing widens
        # The answer of a prompt this turn asked: no other version, so its end asks for none.
        self._only_version = only_version
        # Continue starts from the answer's earlier chunks and usage; it saves the whole answer.
        earlier_chunks, self._earlier_usage = earlier or ([], Usage(0, 0, False))
        self.chunks: list[str] = list(earlier_chunks)
        self._base = len(self.chunks)
        # The answer's final blocks, rendered once as their text arrives (docs/protocol.md).
        self._blocks = LiveBlocks(mid, self.add_blocks)
        self._primed = 0  # block frames of a continuation's earlier text (`open_earlier`)
        self.status: str = Message.Status.STREAMING
        self.stop_requested = False
        self.task: asyncio.Task[None] | None = None
        self._pending: list[str] = []
        self._flush_handle: asyncio.TimerHandle | None = None
        self._last_flush = float("-inf")
        self._interval = settings.CHAT_COALESCE_MS / 1000
        self._usage: Usage | None = None
        self._deltas = 0  # the upstream's text deltas: its tokens, if it sends no usage
        self._finish_reason = ""
        self._ttft_ms: int | None = None
        self._started = 0.0
        # The time chatsite adds before the first chunk (loop clock): the frame's arrival, the
        # model's own wait (noted by the upstream client), the first chunk handed to watchers.
        self._received = received
        self._upstream = StreamTiming()
        self._first_chunk_at: float | None = None
        self._log = get_stream_log()

    # --- watchers -----------------------------------------------------------------------
    def attach(self, watcher: Watcher, after: int | None = None, first_block: int = 0) -> None:
        """Replay the chunks after `after` and every block so far, then follow live (Feed).
        Without `after`, from this turn's own first chunk and block (a continuation's tab shows
        the earlier ones: its shell holds them)."""
        if after is None:
            after, first_block = self._base - 1, self._primed
        super().attach(watcher, after, first_block)

    async def open_earlier(self) -> list[Block] | None:
        """A continuation, before `start`: feed the answer's earlier text to the live renderer
        and return the blocks it makes final (None: live rendering is off, the answer ends
        with one swap). Its last block stays open for the continuation to extend, so the
        blocks are those of the whole answer's text (docs/decisions/live-rendering.md)."""
        blocks, frames = await self._blocks.prime("".join(self.chunks[: self._base]))
        self.block_frames.extend(frames)
        self._primed = len(frames)
        return blocks if self._blocks.live else None

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> asyncio.Task[None]:
        for seq in range(self._base):  # a continuation's log is written again from seq 0
            self._log.append(self.mid, seq, self.chunks[seq])
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
            if self.budget is not None and self.budget.max_tokens < 1:
                raise QuotaReached  # not even a short answer fits: nothing goes upstream
            stream = get_client().stream_chat(
                model=self.model,
                messages=self.messages,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                timing=self._upstream,
            )
            # aclosing: a cancel between two items closes the upstream response at once.
            async with contextlib.aclosing(stream):
                async for item in stream:
                    if isinstance(item, Delta):
                        if self._meter is not None:
                            self._meter.spend(item.text)
                        if self._ttft_ms is None:
                            self._ttft_ms = int((loop.time() - started) * 1000)
                        # PostgreSQL text cannot hold NUL: dropped here, before the chunk is
                        # sent or logged, so what a tab shows is exactly what is stored.
                        delta = item.text.replace("\x00", "")
                        if delta:
                            self._deltas += 1
                            self._pending.append(delta)
                            self._schedule_flush(loop)
                    elif isinstance(item, Usage):
                        self._usage = item
                    elif isinstance(item, Finish):
                        self._finish_reason = item.reason
            if self._finish_reason == "length" and self.budget and self.budget.cut_by_budget:
                status, error = Message.Status.STOPPED, QUOTA_REACHED
            elif self._finish_reason == "length":
                error = LENGTH_LIMITED
        except QuotaReached:
            status, error = Message.Status.STOPPED, QUOTA_REACHED
        except asyncio.CancelledError:
            if self.stop_requested:
                status = Message.Status.STOPPED
            else:  # the process is shutting down
                status, error = Message.Status.FAILED, conversations.INTERRUPTED
        except UpstreamError as exc:
            status, error = Message.Status.FAILED, exc.message
            metrics.upstream_error(exc.kind)
            status_part = f" (HTTP {exc.status})" if exc.status else ""
            log.warning("turn %s upstream %s%s: %s", self.mid, exc.kind, status_part, exc.message)
        except Exception:
            log.exception("turn %s failed", self.mid)
            status, error = Message.Status.FAILED, FAILED_INTERNAL
        finally:
            heartbeat.cancel()
        try:
            # Shielded: a second cancel (shutdown) must not lose the answer half-saved.
            await asyncio.shield(self._finish(status, error))
        finally:  # a finish that failed before settling still gives the reservation back
            if self.admission is not None and not self.admission.settled:
                usage = self._usage_of(self._new_text())
                await self._settle_limits(Message.Status.FAILED, usage)

    def _schedule_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        # The first delta goes out at once; later ones wait at most one interval, coalesced.
        if self._flush_handle is not None:
            return
        interval = coalesce_interval(self._interval, self.streaming())
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
        self.send_chunk(seq, text)
        if self._first_chunk_at is None:
            self._first_chunk_at = self._last_flush
        self._log.append(self.mid, seq, text)
        self._blocks.push(text)

    async def _heartbeat(self) -> None:
        """Checkpoint the partial answer, extend the lease and the stream slot, poll stop."""
        control = get_control()
        while True:
            await asyncio.sleep(settings.CHAT_CHECKPOINT_SECONDS)
            try:
                await database_sync_to_async(conversations.do_checkpoint)(
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
        """Save the answer and tell every watcher `done`, whatever the bookkeeping does.

        The order is the guarantee: the save and the `done` come first and cannot be stopped
        by anything after them. Metrics, usage, limits and logs each fail on their own (logged)
        and none of them can keep the answer from being saved and its tabs from being told, or
        the turn from leaving the registry (13.11: a negative usage once raised in the metrics
        before the save, and the answer, its slot and its reservation were lost).
        """
        try:
            if self._flush_handle is not None:
                self._flush_handle.cancel()
            self._flush()
            text = "".join(self.chunks)
            self.status = status
            usage = self._usage_of(self._new_text())
            html, blocks = await self._render_rest(text)
            final_frame, gone = await self._save(text, status, error, usage, html, blocks)
            if gone:
                error = DELETED
            tokens_left = await self._settle_limits(status, usage)
            total = self._total(usage)
            done = protocol.done(
                self.mid,
                len(self.chunks),
                status,
                total.prompt_tokens,
                total.completion_tokens,
                error=error,
                tokens_left=tokens_left,
            )
            # The finished answer's HTML frame, unless there is nothing to show (deleted).
            final = [final_frame] if final_frame is not None else []
            final.append(protocol.dumps(done))
            self.end(final)
            try:
                await self._log.finish(self.mid, done)
            except Exception:
                log.exception("turn %s could not close its stream log", self.mid)
            self._report(status, usage)
        finally:
            if self.on_end is not None:
                self.on_end(self)

    async def _render_rest(self, text: str) -> tuple[str | None, int | None]:
        """Send the last blocks; the answer's HTML and, when it is exactly its blocks joined,
        how many (the page then keeps what it rendered live: nothing moves at the end)."""
        await self._blocks.finish()
        html = self._blocks.final_html
        if html is not None:
            return html, self._blocks.count
        return await _render_off_thread(self.mid, text), None

    def _new_text(self) -> str:
        """What this turn added (all of it, unless it continues an answer)."""
        return "".join(self.chunks[self._base :])

    def _total(self, usage: Usage) -> Usage:
        """The answer's usage as saved: a continuation adds what it had (estimated if either is)."""
        earlier = self._earlier_usage
        return Usage(
            _clamp_tokens(usage.prompt_tokens + earlier.prompt_tokens),
            _clamp_tokens(usage.completion_tokens + earlier.completion_tokens),
            usage.estimated or earlier.estimated,
        )

    def _usage_of(self, text: str) -> Usage:
        """The upstream's counts, clamped (a hostile upstream may send any), else an estimate."""
        usage = self._usage
        if usage is None:
            prompt_chars = sum(len(m["content"]) for m in self.messages)
            return Usage(chars_to_tokens(prompt_chars), _estimate(text, self._deltas), True)
        return Usage(
            _clamp_tokens(usage.prompt_tokens), _clamp_tokens(usage.completion_tokens), False
        )

    async def _save(
        self, text: str, status: str, error: str, usage: Usage, html: str | None, blocks: int | None
    ) -> tuple[str | None, bool]:
        """One trip to the ORM thread: save the answer (with its HTML), record its usage, and
        make its final frame (None: nothing to show); True when the answer is gone (its
        conversation was deleted meanwhile)."""
        try:
            return await database_sync_to_async(_save_answer)(
                self.mid,
                dict(
                    text=text,
                    html=html,
                    status=status,
                    error=error,
                    chunk_count=len(self.chunks),
                    prompt_tokens=self._total(usage).prompt_tokens,
                    completion_tokens=self._total(usage).completion_tokens,
                    usage_estimated=self._total(usage).estimated,
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
                blocks=blocks,
                only_version=self._only_version,
            )
        except Exception:
            # The trip itself failed (_save_answer logs its own failures): the tab still gets
            # its `done`; the lease marks the answer failed with its checkpoint.
            log.exception("turn %s could not reach the database to finish", self.mid)
            return None, False

    def _report(self, status: str, usage: Usage) -> None:
        try:
            metrics.turn_finished(
                tier=self.tier,
                status=status,
                ttft_ms=self._ttft_ms,
                prompt=usage.prompt_tokens,
                completion=usage.completion_tokens,
                chunk_count=len(self.chunks),
                seconds=asyncio.get_running_loop().time() - self._started,
                added_ttft=self._added_ttft(),
            )
        except Exception:
            log.exception("turn %s could not report its metrics", self.mid)

    def _added_ttft(self) -> float | None:
        """Arrival of the frame → first chunk frame handed out, minus the model's own wait."""
        model = self._upstream.model_seconds
        if self._received is None or self._first_chunk_at is None or model is None:
            return None
        return max(0.0, self._first_chunk_at - self._received - model)

    def _charged(self, status: str, usage: Usage) -> int:
        if self.budget is not None and self.budget.max_tokens < 1:
            return 0  # stopped before anything went upstream
        if status == Message.Status.FAILED and len(self.chunks) == self._base:
            return 0  # nothing delivered: refund the whole reservation
        return usage.prompt_tokens + usage.completion_tokens

    async def _settle_limits(self, status: str, usage: Usage) -> int | None:
        """Reconcile the token reservation; return today's tokens left (None: no quota)."""
        if self.admission is None:
            return None
        try:
            return await self.admission.settle(self._charged(status, usage) or None)
        except Exception:
            log.exception("turn %s could not settle its limits", self.mid)
            return None

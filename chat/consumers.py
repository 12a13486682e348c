"""ChatConsumer: frames in, frames out; the work is done by chat.services and chat.turns."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from redis.exceptions import RedisError

from chat import frames, metrics, services, shutdown
from chat.models import Message
from chat.startup import ensure_started
from chat.streamlog import Chunk, StreamLogUnavailable, get_stream_log
from chat.turns import Turn, registry

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_TOO_SLOW = 4408  # the tab stopped reading; it reconnects and resumes
# What the channel layer raises while Redis is away (restarting, failing over). The layer only
# carries rare control events, so a socket goes on without them rather than dying.
LAYER_DOWN = (RedisError, OSError)


class ChatConsumer(AsyncWebsocketConsumer):
    """One per tab. Everything it sends goes through one ordered outbox."""

    # Channels sets this to the layer's receive and lets any exception it raises end the
    # consumer: a Redis restart would close every socket. Wrapped, it waits the outage out.
    @property
    def channel_receive(self) -> Callable[[], Awaitable[dict[str, Any]]]:
        return self._channel_receive

    @channel_receive.setter
    def channel_receive(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        async def through_outages() -> dict[str, Any]:
            delay = 0.1
            while True:
                try:
                    return await receive()
                except LAYER_DOWN as exc:
                    if delay == 0.1:  # once per outage, not once per retry
                        log.warning("channel layer receive failed (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                # A restarted Redis has forgotten the group: join again once it answers.
                if hasattr(self, "group"):
                    await self._join_group(quiet=True)

        self._channel_receive = through_outages

    async def _join_group(self, *, quiet: bool = False) -> bool:
        """Join the user's group (logout, other tabs' exchanges); False while it is down."""
        for _ in range(2):  # a pooled connection that a restarted Redis dropped fails once
            try:
                await self.channel_layer.group_add(self.group, self.channel_name)
                return True
            except LAYER_DOWN as exc:
                error = exc
        if not quiet:
            log.warning("channel layer unavailable; no live events for now: %s", error)
        return False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        ensure_started()
        self.user_id: int = user.pk
        self.tier = self.scope["tier"]
        self.outbox: deque[str | int] = deque()  # an int is a close code, sent in order
        self.sealed = False  # a close is queued or sent: no more frames are taken
        # The task that drains the outbox, only while it has frames: an idle socket holds no
        # task and no event (memory per idle socket, docs/benchmarks.md).
        self.sender: asyncio.Task[None] | None = None
        self.watching: dict[str, asyncio.Task[None] | Turn] = {}
        self.group = f"user.{self.user_id}"
        await self.accept()
        shutdown.sockets.add(self)  # a graceful shutdown closes it (4503: reconnect)
        metrics.socket_opened(self.tier.tier)
        await self._join_group()
        self.push(
            frames.ready(
                self.tier.tier,
                self.tier.model,
                settings.CHAT_INSTANCE_ID,
                device=self.tier.device,
                reason=self.tier.reason,
            )
        )

    async def disconnect(self, code: int) -> None:
        if not hasattr(self, "outbox"):
            return
        # Turns go on without us: the answer is still completed and saved.
        for mid, watch in list(self.watching.items()):
            if isinstance(watch, Turn):
                watch.detach(self)
            else:
                watch.cancel()
            self.watching.pop(mid, None)
        if self.sender is not None:
            self.sender.cancel()
        self.sealed = True
        shutdown.socket_closed(self)
        with contextlib.suppress(*LAYER_DOWN):  # a restarted Redis forgot the group anyway
            await self.channel_layer.group_discard(self.group, self.channel_name)

    # --- the ordered outbox ---------------------------------------------------------------
    def push(self, frame: str) -> None:
        """Queue a frame (turns call this from their flush); never blocks."""
        if self.sealed:
            return  # its close is queued; the tab resumes from the log once it reconnects
        if len(self.outbox) >= settings.CHAT_SEND_BUFFER_FRAMES:
            # A tab that stops reading must not grow our memory without bound (PITFALLS).
            log.warning("closing a socket whose outbox is full (%d frames)", len(self.outbox))
            self.outbox.clear()
            self.close_after_sending(CLOSE_TOO_SLOW)
            return
        self.outbox.append(frame)
        if self.sender is None:
            self.sender = asyncio.get_running_loop().create_task(self._drain())

    def close_after_sending(self, code: int) -> None:
        if self.sealed:
            return
        self.sealed = True
        self.outbox.append(code)
        if self.sender is None:
            self.sender = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Send what the outbox holds, in order, then end (the next push starts another)."""
        outbox = self.outbox
        try:
            while outbox:
                item = outbox.popleft()
                if isinstance(item, int):
                    outbox.clear()
                    await self.close(code=item)
                    return
                await self.send(text_data=item)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A socket that cannot send must not stay open and silent: close it; the tab
            # reconnects and resumes from the stream log.
            log.exception("socket send failed; closing it")
            self.sealed = True
            outbox.clear()
            with contextlib.suppress(Exception):
                await self.close(code=1011)
        finally:
            self.sender = None

    def send_error(self, code: str, message: str, **extra: Any) -> None:
        self.push(frames.error(code, message, **extra))

    # --- frames in ------------------------------------------------------------------------
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None:
            self.send_error("bad_request", "Frames must be JSON text.")
            return
        try:
            frame = json.loads(text_data)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than json goes
            self.send_error("bad_request", "That frame is not valid JSON.")
            return
        if not isinstance(frame, dict):
            self.send_error("bad_request", "A frame must be a JSON object with a type.")
            return
        kind = frame.get("type")
        try:
            if kind == "prompt":
                await self.on_prompt(frame)
            elif kind == "stop":
                await self.on_stop(frame)
            elif kind == "resume":
                await self.on_resume(frame)
            elif kind == "regenerate":
                await self.on_regenerate(frame)
            else:
                # Only a string is echoed: str() of a deeply nested value can itself recurse.
                named = kind[:40] if isinstance(kind, str) else type(kind).__name__
                self.send_error("bad_request", f"Unknown frame type {named!r}.")
        except services.BadRequest as exc:
            self.send_error("bad_request", str(exc), mid=_echoed_mid(frame))
        except services.NotFound as exc:
            self.send_error("not_found", str(exc), mid=_echoed_mid(frame))

    async def on_prompt(self, frame: dict[str, Any]) -> None:
        await self._start(frame, regenerate=False)

    async def on_regenerate(self, frame: dict[str, Any]) -> None:
        await self._start(frame, regenerate=True)

    async def _start(self, frame: dict[str, Any], *, regenerate: bool) -> None:
        """Store the exchange and start its turn; a prompt, an edit or a regeneration."""
        # The limiter middleware admitted this frame and left what it holds for the turn.
        admissions = self.scope.get("chat.admissions")
        admission = admissions.popleft() if admissions else None
        mid = text = conversation_id = replaces = None
        try:
            if regenerate:
                mid = frame.get("mid")
                if not isinstance(mid, str) or not mid:
                    raise services.BadRequest("A message id is required.")
            else:
                text = services.check_prompt_text(frame.get("text"))
                conversation_id = frame.get("conversation") or None
                replaces = frame.get("replaces") or None
                if conversation_id is not None and not isinstance(conversation_id, str):
                    raise services.BadRequest("The conversation must be an id.")
                if replaces is not None and not isinstance(replaces, str):
                    raise services.BadRequest("`replaces` must be a message id.")
            # One trip to the ORM thread: the session re-check, the exchange and its HTML.
            begun = await database_sync_to_async(_begin_exchange)(
                self.user_id,
                self.scope["session"].session_key,
                regenerate=regenerate,
                mid=mid,
                conversation_id=conversation_id,
                text=text,
                replaces=replaces,
                model=self.tier.model,
                tier=self.tier.tier,
            )
        except Exception:
            if admission is not None:
                await admission.settle(None)
            raise
        if begun is None:  # logged out or deactivated since the socket connected
            await self.chat_logout({})
            if admission is not None:
                await admission.settle(None)
            return
        exchange, html = begun
        answer = exchange.answer
        self.push(html)
        turn = Turn(
            mid=answer.mid,
            conversation_id=str(exchange.conversation.id),
            user_id=self.user_id,
            model=self.tier.model,
            tier=self.tier.tier,
            messages=_trimmed(exchange.history),
            max_tokens=self.tier.max_tokens or settings.LLM_MAX_TOKENS or None,
            temperature=self.tier.temperature,
            admission=admission,
        )
        registry.start(turn)
        self.watching[answer.mid] = turn
        turn.attach(self)
        # Other tabs of this user (on any instance) show the new exchange and follow it.
        try:
            await self.channel_layer.group_send(
                self.group,
                {
                    "type": "chat.exchange",
                    "origin": self.channel_name,
                    "conversation": str(exchange.conversation.id),
                    "answer": answer.mid,
                    "created": exchange.created,
                    "forked": exchange.forked,
                },
            )
        except LAYER_DOWN as exc:  # they show it on their next reload
            log.warning("could not tell other tabs about %s: %s", answer.mid, exc)

    async def on_stop(self, frame: dict[str, Any]) -> None:
        message = await database_sync_to_async(services.check_message)(
            self.user_id, frame.get("mid")
        )
        if message.status == Message.Status.STREAMING:
            await registry.stop(message.mid)
        # A stop for a finished answer is not an error: the done frame already went out.

    async def on_resume(self, frame: dict[str, Any]) -> None:
        after = frame.get("after", -1)
        if isinstance(after, bool) or not isinstance(after, int) or after < -1:
            raise services.BadRequest("`after` must be a whole number ≥ -1.")
        message = await database_sync_to_async(services.check_message)(
            self.user_id, frame.get("mid")
        )
        mid = message.mid
        previous = self.watching.pop(mid, None)
        if isinstance(previous, Turn):
            previous.detach(self)
        elif previous is not None:
            previous.cancel()
        turn = registry.get(mid)
        if turn is not None:
            if after >= len(turn.chunks) and turn.final_frames is None:
                raise services.BadRequest(
                    f"`after` is beyond the last chunk ({len(turn.chunks) - 1})."
                )
            self.watching[mid] = turn
            turn.attach(self, after)
            return
        if message.status != Message.Status.STREAMING:
            if after >= max(message.chunk_count, 1) and message.chunk_count:
                raise services.BadRequest(
                    f"`after` is beyond the last chunk ({message.chunk_count - 1})."
                )
            await self._push_final(message)
            return
        self.watching[mid] = asyncio.get_running_loop().create_task(self._follow_log(mid, after))

    async def _follow_log(self, mid: str, after: int) -> None:
        """Follow an answer whose turn runs on another instance (or died) through the log."""
        quiet = settings.CHAT_LEASE_SECONDS
        try:
            while True:
                # The database decides first: an answer whose instance died (its lease ran
                # out) is marked failed and shown as such, not followed forever.
                await database_sync_to_async(services.do_reap_orphans)()
                message = await database_sync_to_async(Message.objects.get)(mid=mid)
                if message.status != Message.Status.STREAMING:
                    await self._push_final(message)
                    return
                async with contextlib.aclosing(
                    get_stream_log().read(mid, after, block_ms=int(quiet * 1000))
                ) as stream:
                    try:
                        while True:
                            entry = await asyncio.wait_for(anext(stream), quiet)
                            if isinstance(entry, Chunk):
                                after = entry.seq
                                self.push(frames.chunk(mid, entry.seq, entry.text))
                            else:
                                message = await database_sync_to_async(Message.objects.get)(mid=mid)
                                self.push(await frames.final_message_html(message))
                                self.push(json.dumps(entry.payload))
                                return
                    except (StopAsyncIteration, TimeoutError):
                        pass  # no log, or silent for a whole lease: look at the database again
        except StreamLogUnavailable:
            self.send_error(
                "unavailable",
                "Live updates are unavailable right now; reload in a moment.",
                mid=mid,
            )
        except Message.DoesNotExist:
            self.send_error("not_found", "That message was deleted.", mid=mid)
        finally:
            if self.watching.get(mid) is asyncio.current_task():
                self.watching.pop(mid, None)

    async def _push_final(self, message: Message) -> None:
        self.push(await frames.final_message_html(message))
        self.push(
            json.dumps(
                frames.done(
                    message.mid,
                    message.chunk_count,
                    message.status,
                    message.prompt_tokens,
                    message.completion_tokens,
                    error=message.error,
                )
            )
        )

    # --- events from other consumers (channel layer: rare control events only) ----------
    async def chat_exchange(self, event: dict[str, Any]) -> None:
        if event["origin"] == self.channel_name:
            return
        html = await database_sync_to_async(_exchange_for_watchers)(event)
        if html:
            self.push(html)

    async def chat_logout(self, event: dict[str, Any]) -> None:
        self.send_error("unauthenticated", "You have been logged out. Log in again.")
        self.close_after_sending(CLOSE_UNAUTHENTICATED)


def _echoed_mid(frame: dict[str, Any]) -> str | None:
    """The frame's `mid` to echo in an error: only text (any other value came from a hostile
    client and may be nested too deeply to serialise, or not encode as UTF-8)."""
    mid = frame.get("mid")
    return mid if isinstance(mid, str) and services.is_text(mid) else None


def _trimmed(history: list[dict[str, str]]) -> list[dict[str, str]]:
    from chat.upstream import trim_history

    return trim_history(history, settings.LLM_CONTEXT_CHARS)


def _begin_exchange(
    user_id: int,
    session_key: str | None,
    *,
    regenerate: bool,
    mid: str | None,
    conversation_id: str | None,
    text: str | None,
    replaces: str | None,
    model: str,
    tier: str,
) -> tuple[services.Exchange, str] | None:
    """Store a new exchange and render its HTML; None if the session has ended.

    The socket's user was resolved at connect, so the session is re-checked per prompt
    (PITFALLS). All of it runs in one call on the ORM thread: that thread is a queue every
    turn passes through, and each extra trip is a wait on the path to the first token.
    """
    if not services.user_is_active(user_id, session_key):
        return None
    if regenerate:
        assert mid is not None
        exchange = services.do_regenerate(user_id, mid, model=model, tier=tier)
    else:
        assert text is not None
        exchange = services.do_start_exchange(
            user_id, conversation_id, text, model=model, tier=tier, replaces=replaces
        )
    # A fork changed the branch on show: the tab shows the whole thread anew.
    entries = services.thread(exchange.conversation, render=True) if exchange.forked else None
    html = frames.exchange_html(exchange, target="#messages", watch=False, entries=entries)
    return exchange, html


def _exchange_for_watchers(event: dict[str, Any]) -> str | None:
    try:
        answer = Message.objects.select_related("conversation", "parent").get(mid=event["answer"])
    except Message.DoesNotExist:
        return None
    conversation = answer.conversation
    exchange = services.Exchange(
        conversation, event["created"], answer.parent, answer, [], forked=event["forked"]
    )
    entries = services.thread(conversation, render=True) if exchange.forked else None
    return frames.exchange_html(
        exchange,
        target=f'#messages[data-conversation="{conversation.id}"]',
        watch=True,
        entries=entries,
        answer_html=services.rendered_html(answer),
    )

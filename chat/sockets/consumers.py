"""ChatConsumer: one per tab. Parsed frames in (from the frame middleware), frames out through
one ordered outbox; the work is done by chat.turns."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from chat import branches, conversations, fragments, metrics, protocol, sessions
from chat.events import LAYER_DOWN, send_to_user, user_group
from chat.limits.limiter import get_limiter
from chat.models import Message
from chat.sockets import draining
from chat.sockets.outbox import Outbox
from chat.turns.continuation import watcher_shell_html
from chat.turns.feed import Feed
from chat.turns.mirror import mirrors
from chat.turns.registry import registry
from chat.turns.start import start_turn
from chat.turns.turn import Settlement

log = logging.getLogger(__name__)

STOP_NOT_FOUND = (
    "That answer does not exist (any more). If its conversation was deleted, the answer was "
    "stopped with it."
)


class ChatConsumer(AsyncWebsocketConsumer, Outbox):
    """One per tab. Everything it sends goes through one ordered outbox."""

    refusal: object = None  # why the handshake was refused (SocketCapASGIMiddleware), if it was

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
                # A restarted Redis forgot the group: join again before listening, or this tab
                # never hears a logout or a deactivation sent to the group.
                if getattr(self, "joined", True) or await self._join_group(quiet=True):
                    try:
                        return await receive()
                    except LAYER_DOWN as exc:
                        if delay == 0.1:  # once per outage, not once per retry
                            log.warning("channel layer receive failed (%s); retrying", exc)
                        if hasattr(self, "group"):
                            self.joined = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

        self._channel_receive = through_outages

    async def _join_group(self, *, quiet: bool = False) -> bool:
        """Join the user's group (logout, other tabs' exchanges); False while it is down."""
        for _ in range(2):  # a pooled connection that a restarted Redis dropped fails once
            try:
                await self.channel_layer.group_add(self.group, self.channel_name)
                self.joined = True
                return True
            except LAYER_DOWN as exc:
                error = exc
        self.joined = False
        if not quiet:
            log.warning("channel layer unavailable; no live events for now: %s", error)
        return False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:  # also when daphne killed it and its disconnect was never handled
            self._release()

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels' own dispatch first awaits `aclose_old_connections()`: a trip to the ORM
        # thread before every frame and every channel-layer event, for Django's async ORM
        # API, which cleans up no connection itself. Nothing here uses that API: every query
        # goes through database_sync_to_async, which closes stale connections before and after
        # each call on that thread (tests/test_thread_hops.py; docs/decisions/performance.md).
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # asgiref 3.13's SyncToAsync, cancelled mid-thread, waits and returns as if not
            # cancelled: daphne's kill was lost and the consumer lived on, holding its frames,
            # socket place and count (hostile review; docs/security.md).
            raise asyncio.CancelledError

    def _release(self) -> None:
        """What disconnect gives back without waiting (turns go on without us); idempotent."""
        if not hasattr(self, "outbox"):
            return
        for mid, watch in list(self.watching.items()):
            self._unwatch(mid, watch)
        if self.sender is not None:
            self.sender.cancel()
        self.sealed = True
        draining.socket_closed(self)

    async def websocket_connect(self, message: dict[str, Any]) -> None:
        # The socket-cap middleware's decision rides on the connect event itself.
        self.refusal = message.get(protocol.VERDICT_KEY)
        await super().websocket_connect(message)

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            # A session cookie with no session behind it (expired, logged out elsewhere,
            # forged; no cookie at all never gets here: chat/socket_caps.py). Accepted only to
            # say so with 4401, which sends the page to the login form: refused (HTTP 403) the
            # tab could not tell, and reconnected forever.
            await self.accept()
            await self.send(
                text_data=protocol.error("unauthenticated", "You are not logged in. Log in again.")
            )
            await self.close(code=protocol.CLOSE_UNAUTHENTICATED)
            return
        if isinstance(self.refusal, protocol.Refusal):
            # Over a cap on open sockets, or the user's rate of new ones (CHAT_SOCKET_RATE):
            # accepted only to say why and when to come back (the page shows it, and waits at
            # least `retry_after`) and close with 4429; nothing else is ever sent, so no
            # outbox is needed to order it.
            await self.accept()
            await self.send(text_data=protocol.refused(self.refusal))
            await self.close(code=protocol.CLOSE_TOO_MANY_SOCKETS, reason="too many sockets")
            return
        if draining.draining():
            # Accept-then-close rather than refuse: a refused handshake is an HTTP 403 the tab
            # cannot tell from "forbidden"; 4503 says "come back", and nginx's next try lands
            # on another instance.
            await self.accept()
            await self.close(code=protocol.CLOSE_RESTARTING)
            return
        self.user_id: int = user.pk
        # Re-checked before every prompt, resume and delivered exchange: the session may end
        # (logout, deactivation, a password change) while the socket stays open.
        self.session_key: str | None = self.scope["session"].session_key
        self.tier = self.scope["tier"]
        self.open_outbox()
        self.watching: dict[str, Feed] = {}  # the answers it shows: turns here, or mirrors
        self.group = user_group(self.user_id)
        # The tab's conversation: turns elsewhere send it only its list's HTML (no orphan targets).
        self.showing = protocol.shown_conversation(self.scope.get("query_string", b""))
        await self.accept()
        draining.socket_opened(self)  # a graceful shutdown closes it (4503: reconnect)
        metrics.socket_opened(self.tier.tier)
        await self._join_group()
        self.push(
            protocol.ready(
                self.tier.tier,
                self.tier.model,
                settings.CHAT_INSTANCE_ID,
                device=self.tier.device,
                reason=self.tier.reason,
                why=self.tier.why,
                models=[{"id": model, "label": label} for model, label in self.tier.models],
            )
        )

    async def disconnect(self, code: int) -> None:
        if not hasattr(self, "outbox"):
            return
        self._release()
        with contextlib.suppress(*LAYER_DOWN):  # a restarted Redis forgot the group anyway
            await self.channel_layer.group_discard(self.group, self.channel_name)

    def send_error(self, code: str, message: str, **extra: Any) -> None:
        self.push(protocol.error(code, message, **extra))

    # --- frames in ------------------------------------------------------------------------
    async def websocket_receive(self, message: dict[str, Any]) -> None:
        """Act on the frame the middleware parsed (and, for a turn, admitted or refused).

        Nothing here reads the raw text: a frame is parsed once, at the edge. A frame that
        starts a turn without an admission is refused (fail closed): that can only mean the
        middleware is missing from the stack, and a turn must never run unlimited.
        """
        if not hasattr(self, "outbox"):
            return  # refused at connect (draining, logged out)
        frame = message.get(protocol.FRAME_KEY)
        if frame is None:
            log.error("a frame reached the consumer unparsed: is the frame middleware missing?")
            self.send_error("unavailable", "This server cannot take messages right now.")
            return
        if isinstance(frame, protocol.FrameError):
            self.send_error("bad_request", frame.message, mid=frame.mid)
            return
        echo = getattr(frame, "mid", None)
        try:
            if protocol.starts_turn(frame):
                await self._start(
                    frame, message.get(protocol.VERDICT_KEY), message.get(protocol.RECEIVED_KEY)
                )
            elif isinstance(frame, protocol.Stop):
                await self.on_stop(frame)
            elif isinstance(frame, protocol.Resume):
                await self.on_resume(frame, message.get(protocol.VERDICT_KEY))
        except conversations.BadRequest as exc:
            self.send_error("bad_request", str(exc), mid=echo)
        except conversations.NotFound as exc:
            self.send_error("not_found", str(exc), mid=echo)
        except conversations.SessionEnded:
            await self.chat_logout({})

    async def _start(
        self, frame: protocol.TurnFrame, verdict: object, received: float | None = None
    ) -> None:
        """Start the turn a prompt, an edit, a regeneration or a retry asks for."""
        if isinstance(verdict, protocol.Refusal):
            self.push(protocol.refused(verdict))
            return
        if verdict is None or not hasattr(verdict, "settle"):
            log.error("a turn frame reached the consumer without an admission; refused")
            self.send_error("unavailable", "This server cannot take messages right now.")
            return
        admission: Settlement = verdict  # type: ignore[assignment]
        try:
            started = await start_turn(
                frame,
                admission,
                user_id=self.user_id,
                session_key=self.session_key,
                tier=self.tier,
                received=received,
            )
        except conversations.SessionEnded:  # since the socket connected
            await self.chat_logout({})
            return
        answer = started.exchange.answer
        self.showing = str(started.exchange.conversation.id)  # a new chat's page adopts it
        self.push(started.html)
        self.watching[answer.mid] = started.turn
        started.turn.attach(self)
        # Other tabs of this user (on any instance) show the new exchange and follow it.
        await send_to_user(
            self.user_id,
            {
                "type": "chat.exchange",
                "origin": self.channel_name,
                "conversation": str(started.exchange.conversation.id),
                "answer": answer.mid,
                "created": started.exchange.created,
                "fork_after": started.exchange.fork_after,
                "continued": started.exchange.continued,
                "shell": started.shell,
            },
        )

    async def on_stop(self, frame: protocol.Stop) -> None:
        try:
            message = await database_sync_to_async(_checked_message)(
                self.user_id, self.session_key, frame.mid
            )
        except conversations.NotFound:
            # Deleting a conversation stops its answers (views.delete), so the likely story
            # of a Stop for a vanished answer is that one; an id of someone else's reads the
            # same, so nothing is told about theirs.
            raise conversations.NotFound(STOP_NOT_FOUND) from None
        if message.status == Message.Status.STREAMING:
            await registry.stop(message.mid)
            return
        # The answer has ended (maybe while this tab was away, or its turn died): its `done`
        # says so, so a tab still showing it streaming ends it instead of waiting forever.
        self.push(fragments.done_of(message))

    async def on_resume(self, frame: protocol.Resume, verdict: object = None) -> None:
        if isinstance(verdict, protocol.Refusal):
            # Over the user's rate of answers sent again (CHAT_RESUME_RATE), streaming or
            # finished: every resume replays the answer's blocks so far, and tabs reconnecting
            # and resuming in a loop slowed every other user's answers (docs/security.md).
            # Refused before any database work; the tab keeps what it shows (and any answer it
            # already follows on this socket) and asks again after `retry_after`.
            self.push(protocol.refused(verdict, mid=frame.mid))
            return
        # A socket whose session ended must not be handed the user's answers (issue 13.3).
        message = await database_sync_to_async(_checked_message)(
            self.user_id, self.session_key, frame.mid
        )
        mid, after = message.mid, frame.after
        previous = self.watching.pop(mid, None)
        if previous is not None:
            self._unwatch(mid, previous)
        turn = registry.get(mid)
        if turn is not None:
            if after >= len(turn.chunks) and turn.final_frames is None:
                raise conversations.BadRequest(
                    f"`after` is beyond the last chunk ({len(turn.chunks) - 1})."
                )
            self.watching[mid] = turn
            turn.attach(self, after)
            return
        if message.status != Message.Status.STREAMING:
            # A finished answer is sent whole, whatever `after` says: its final HTML replaces
            # whatever the tab shows (after a crash the tab may have shown more chunks than
            # the checkpoint held; the reaper kept them from the stream log).
            # With the conversation's title and today's tokens left: a tab that was away when
            # the answer ended missed the `title` and `usage` frames sent then (the new user's
            # review: the header kept the prompt as its title, the meter the reservation).
            for final in await database_sync_to_async(_finished_with_title)(
                message, self.user_id, self.showing
            ):
                self.push(final)
            await self._push_tokens_left()
            return
        # Its turn runs on another instance (or died): one follower of its log per process.
        mirror = mirrors.follow(mid)
        self.watching[mid] = mirror
        mirror.attach(self, after)

    async def _push_tokens_left(self) -> None:
        try:
            used, quota = await get_limiter().tokens_today(self.user_id)
        except Exception:
            log.exception("tokens left for user %s", self.user_id)
            return
        if quota:
            self.push(protocol.dumps({"type": "usage", "tokens_left": max(0, quota - used)}))

    def _unwatch(self, mid: str, watch: Feed) -> None:
        watch.detach(self)
        self.watching.pop(mid, None)

    # --- events from other consumers (channel layer: rare control events only) ----------
    async def chat_exchange(self, event: dict[str, Any]) -> None:
        if event["origin"] == self.channel_name:
            return
        shown = event["conversation"] == self.showing
        if not shown and not event["created"]:
            return  # nothing of it has a place on this tab's page
        try:
            html = await database_sync_to_async(_exchange_for_watchers)(
                event, self.user_id, self.session_key, shown=shown
            )
        except conversations.SessionEnded:
            await self.chat_logout({})
            return
        if html:
            self.push(html)

    async def chat_title(self, event: dict[str, Any]) -> None:
        """A conversation got its title (chat.turns.titles): its sidebar entry, and the
        header if this tab shows it, change in place."""
        html = await database_sync_to_async(_title_if_valid)(
            self.user_id, self.session_key, event["conversation"], self.showing
        )
        if html is None:  # the session no longer verifies (a password change): nothing for it
            await self.chat_logout({})
            return
        if html:
            self.push(html)
        if event.get("tokens_left") is not None:
            self.push(protocol.dumps({"type": "usage", "tokens_left": event["tokens_left"]}))

    async def chat_deleted(self, event: dict[str, Any]) -> None:
        """The user deleted a conversation (chat.views.delete): the page drops it from its list
        and, if it shows it, becomes a new chat; the deleting tab's own page ignores it."""
        if event["conversation"] == self.showing:
            self.showing = ""  # the other tabs' turns there are gone with it
        self.push(protocol.conversation_deleted(event["conversation"]))

    async def chat_session_check(self, event: dict[str, Any]) -> None:
        """The user's password (or account) changed: a socket whose session no longer
        verifies is closed, on every instance; the others go on."""
        valid = await database_sync_to_async(sessions.session_is_valid)(
            self.user_id, self.session_key
        )
        if not valid:
            await self.chat_logout({})

    async def chat_logout(self, event: dict[str, Any]) -> None:
        self.send_error("unauthenticated", "You have been logged out. Log in again.")
        self.close_after_sending(protocol.CLOSE_UNAUTHENTICATED)


def _title_if_valid(
    user_id: int, session_key: str | None, conversation_id: str, showing: str
) -> str | None:
    """A conversation's new title for this tab ("" if it has nothing to show it in), or None
    when the socket's session no longer verifies: one ORM trip."""
    if not sessions.session_is_valid(user_id, session_key):
        return None
    return fragments.title_html(user_id, conversation_id, showing=showing)


def _finished_with_title(message: Message, user_id: int, showing: str) -> list[str]:
    """A finished answer's frames (final HTML, `done`), then its conversation's title."""
    title = fragments.title_html(user_id, str(message.conversation_id), showing=showing)
    return [*fragments.finished(message), *([title] if title else [])]


def _checked_message(user_id: int, session_key: str | None, mid: str) -> Message:
    """The user's answer `mid`, if the socket's session is still valid: one ORM trip."""
    if not sessions.session_is_valid(user_id, session_key):
        raise conversations.SessionEnded
    return conversations.check_message(user_id, mid)


def _exchange_for_watchers(
    event: dict[str, Any], user_id: int, session_key: str | None, *, shown: bool
) -> str | None:
    """Another tab's new exchange for this tab: its bubbles if this tab shows that
    conversation, and a new conversation's sidebar entry."""
    if not sessions.session_is_valid(user_id, session_key):
        raise conversations.SessionEnded
    try:
        answer = Message.objects.select_related("conversation", "parent").get(mid=event["answer"])
    except Message.DoesNotExist:
        return None
    conversation = answer.conversation
    if event.get("continued"):
        # An answer going on: it goes on from what the tab shows (from its earlier `done.seq`).
        return watcher_shell_html(answer, event.get("shell")) if shown else None
    fork_after = event.get("fork_after")
    # A regeneration goes on from the prompt it asks again: no new prompt to show.
    regenerated = answer.parent is not None and fork_after == answer.parent.mid
    exchange = conversations.Exchange(
        conversation,
        event["created"],
        None if regenerated else answer.parent,
        answer,
        [],
        fork_after=fork_after,
    )
    if not shown:
        return fragments.exchange_html(exchange, target="", watch=True, shown=False)
    return fragments.exchange_html(
        exchange,
        target=f'#messages[data-conversation="{conversation.id}"]',
        watch=True,
        answer_html=branches.rendered_html(answer),
    )

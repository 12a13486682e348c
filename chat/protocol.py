"""The wire protocol's JSON frames (docs/protocol.md): client frames parsed once, server frames
built, and the close codes."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings

# --- close codes (4000 + an HTTP status, as autobahn lets applications send 3000-4999) --------
CLOSE_INTERNAL = 1011  # a send failed: the tab reconnects and resumes
CLOSE_UNAUTHENTICATED = 4401  # not logged in, logged out, or the password changed
CLOSE_TOO_SLOW = 4408  # the tab stopped reading; it reconnects and resumes
CLOSE_TOO_MANY_SOCKETS = 4429  # the user (or address) has too many sockets open
CLOSE_RESTARTING = 4503  # this instance is shutting down: reconnect (to another one)

# Where the ASGI middleware puts what it decided about a client frame, on the
# `websocket.receive` event itself: the parsed frame (or the FrameError that refused it) and,
# for a frame that starts a turn, its admission or Refusal. Nobody below parses the text again.
FRAME_KEY = "chat.frame"
VERDICT_KEY = "chat.verdict"
# ... and when the frame arrived (the event loop's clock): a turn measures from it the time
# chatsite adds before its first chunk (chat_added_ttft_seconds).
RECEIVED_KEY = "chat.received"

MID_MAX_CHARS = 80  # Message.mid holds 80 characters
ID_MAX_CHARS = 120  # conversation ids (UUIDs) and model names (ModelTier.model: 120)


# --- client → server ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prompt:
    """A new prompt (or, with `replaces`, a new version of an earlier prompt: an edit)."""

    text: str
    conversation: str | None = None
    replaces: str | None = None
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Regenerate:
    """A new version of a finished answer (also what Retry sends)."""

    mid: str
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Continue:
    """Go on with a stopped, cut or length-limited answer, in the same message."""

    mid: str


@dataclass(frozen=True, slots=True)
class Stop:
    mid: str


@dataclass(frozen=True, slots=True)
class Resume:
    """Send every chunk of `mid` with seq > `after`, then follow it live."""

    mid: str
    after: int = -1


TurnFrame = Prompt | Regenerate | Continue
ClientFrame = Prompt | Regenerate | Continue | Stop | Resume
TURN_FRAMES: tuple[type, ...] = (Prompt, Regenerate, Continue)


def starts_turn(frame: object) -> bool:
    """Whether this parsed frame starts a turn: every such frame needs an admission first."""
    return isinstance(frame, TURN_FRAMES)


class FrameError(Exception):
    """A client frame that cannot be acted on; `message` is for the user, `mid` is echoed."""

    def __init__(self, message: str, *, mid: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.mid = mid


@dataclass(frozen=True, slots=True)
class Refusal:
    """A frame that starts a turn, refused before it reached the consumer (limits, draining)."""

    code: str
    message: str
    retry_after: int | None = None
    reset_at: float | None = None
    # Instead of a time: what the refusal waits for ("stream_ends": one of the user's answers
    # ending, at the stream cap). docs/protocol.md.
    retry_when: str | None = None


def is_text(value: str) -> bool:
    """Whether `value` can be stored and sent as UTF-8: JSON lets a raw client send unpaired
    surrogates ("\\ud800"), which the database driver and the socket would fail to encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # `{"type": "stop", "type": "prompt"}` means whatever the last parser to read it thinks;
    # a frame that says two things is refused instead of guessed at.
    frame: dict[str, Any] = {}
    for key, value in pairs:
        if key in frame:
            raise FrameError(f"A frame must not repeat a key ({key[:40]!r}).")
        frame[key] = value
    return frame


def parse(raw: str | bytes | None) -> ClientFrame:
    """The one reading of a client frame; raises FrameError with words for the user.

    Unknown keys are ignored (htmx's ws extension adds `HEADERS`); every known key is checked
    for its type here, so the layers below act on clean values only.
    """
    if not isinstance(raw, str):
        raise FrameError("Frames must be JSON text.")
    try:
        data = json.loads(raw, object_pairs_hook=_no_duplicate_keys)
    except FrameError:
        raise
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json goes
        raise FrameError("That frame is not valid JSON.") from None
    if not isinstance(data, dict):
        raise FrameError("A frame must be a JSON object with a type.")
    kind = data.get("type")
    mid = data.get("mid")
    echo = mid if isinstance(mid, str) and is_text(mid) and len(mid) <= MID_MAX_CHARS else None
    try:
        if kind == "prompt":
            return Prompt(
                text=_prompt_text(data.get("text")),
                conversation=_optional_id(data.get("conversation"), "The conversation"),
                replaces=_optional_id(data.get("replaces"), "`replaces`"),
                model=_optional_id(data.get("model"), "The model"),
            )
        if kind == "regenerate":
            return Regenerate(mid=_mid(mid), model=_optional_id(data.get("model"), "The model"))
        if kind == "continue":
            return Continue(mid=_mid(mid))
        if kind == "stop":
            return Stop(mid=_mid(mid))
        if kind == "resume":
            return Resume(mid=_mid(mid), after=_after(data.get("after", -1)))
    except FrameError as exc:
        exc.mid = echo
        raise
    # Only a string is echoed: str() of a deeply nested value can itself recurse.
    named = kind[:40] if isinstance(kind, str) and is_text(kind) else type(kind).__name__
    raise FrameError(f"Unknown frame type {named!r}.")


def max_prompt_chars() -> int:
    """The longest prompt taken: CHAT_MAX_PROMPT_CHARS, and never more than the model reads
    (LLM_CONTEXT_CHARS): a longer one was cut from its front without a word (hostile review)."""
    return min(settings.CHAT_MAX_PROMPT_CHARS, settings.LLM_CONTEXT_CHARS)


def _prompt_text(text: Any) -> str:
    if not isinstance(text, str) or not text.strip():
        raise FrameError("Type a message first.")
    limit = max_prompt_chars()
    if len(text) > limit:
        raise FrameError(
            f"That message is {len(text):,} characters; the limit is {limit:,}. "
            "Shorten it or split it into parts."
        )
    if not is_text(text):
        raise FrameError("That message holds characters that are not text (unpaired surrogates).")
    if "\x00" in text:
        # PostgreSQL text cannot hold NUL (PITFALLS): refused here for every database.
        raise FrameError("That message holds a NUL character (\\u0000); remove it and send again.")
    return text


def _mid(mid: Any) -> str:
    if not isinstance(mid, str) or not mid:
        raise FrameError("A message id is required.")
    return _id_text(mid, "The message id", MID_MAX_CHARS)


def _optional_id(value: Any, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise FrameError(f"{what} must be an id.")
    return _id_text(value, what, ID_MAX_CHARS)


def _id_text(value: str, what: str, limit: int) -> str:
    # Ids are looked up in the database: PostgreSQL cannot take NUL in a query (a `stop` for
    # "1-web1-\u0000" closed the socket with 1011), nor can any driver take lone surrogates.
    if len(value) > limit or "\x00" in value or not is_text(value):
        raise FrameError(f"{what} is not a valid id.")
    return value


def _after(after: Any) -> int:
    if isinstance(after, bool) or not isinstance(after, int) or after < -1:
        raise FrameError("`after` must be a whole number ≥ -1.")
    return after


def shown_conversation(query_string: bytes | str) -> str:
    """The conversation a tab shows, from its socket URL (`/ws/chat/?conversation=<id>`); ""
    for a new chat, and for anything that is not a conversation id. It only decides which of
    the user's own events the tab is sent (another tab's turn elsewhere is not its business),
    never what it may see."""
    if isinstance(query_string, bytes):
        query_string = query_string.decode("latin-1")
    values = parse_qs(query_string).get("conversation") or [""]
    try:
        return str(uuid.UUID(values[0]))
    except ValueError:
        return ""


# --- server → client --------------------------------------------------------------------------


def dumps(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False)


def chunk(mid: str, seq: int, text: str) -> str:
    return dumps({"type": "chunk", "mid": mid, "seq": seq, "text": text})


def block(mid: str, index: int, start: int, end: int, html: str) -> str:
    """A block of an answer that is final, rendered: it replaces the answer's text [start, end)
    (offsets in code points) on the page. Blocks are made from the text alone (docs/protocol.md)."""
    return dumps(
        {"type": "block", "mid": mid, "index": index, "start": start, "end": end, "html": html}
    )


def blocks(mid: str, frames: list[str]) -> str:
    """Several `block` frames of one answer in one frame (a resume's replay): each element is
    a `block` frame as sent alone, in index order."""
    return f'{{"type": "blocks", "mid": {json.dumps(mid)}, "blocks": [{", ".join(frames)}]}}'


def done(
    mid: str,
    seq: int,
    status: str,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    error: str = "",
    tokens_left: int | None = None,
) -> dict[str, Any]:
    """The `done` frame's payload (a dict: the stream log stores it as it is)."""
    payload: dict[str, Any] = {
        "type": "done",
        "mid": mid,
        "seq": seq,
        "status": status,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    }
    if error:
        payload["error"] = error
    if tokens_left is not None:
        payload["tokens_left"] = tokens_left  # today's quota left, for the usage meter
    return payload


def error(code: str, message: str, *, retry_after: int | None = None, **extra: Any) -> str:
    payload: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if retry_after is not None:
        payload["retry_after"] = retry_after
    payload.update({key: value for key, value in extra.items() if value is not None})
    return dumps(payload)


def refused(refusal: Refusal, *, mid: str | None = None) -> str:
    return error(
        refusal.code,
        refusal.message,
        retry_after=refusal.retry_after,
        reset_at=refusal.reset_at,
        mid=mid,
        retry_when=refusal.retry_when,
    )


def ready(tier: str, model: str, instance: str, **extra: Any) -> str:
    return dumps({"type": "ready", "tier": tier, "model": model, "instance": instance, **extra})


def conversation_deleted(conversation_id: str) -> str:
    """The user deleted a conversation (in any tab): every tab drops it from its list, and a
    tab that shows it becomes a new chat (docs/protocol.md)."""
    return dumps({"type": "conversation_deleted", "conversation": conversation_id})

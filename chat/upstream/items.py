"""What one streamed answer is made of (deltas, a finish, usage), read from SSE events or a
whole completion."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from chat.tokens import chars_to_tokens
from chat.upstream.errors import (
    EMPTY_ANSWER_MESSAGE,
    STREAM_ERROR_MESSAGE,
    UNREADABLE_MESSAGE,
    failure,
    loads_or_text,
    stream_error_detail,
)
from chat.upstream.sse import SSEEvent


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of the answer's text, in order."""

    text: str


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one answer; `estimated` when the server sent none and we counted chars."""

    prompt_tokens: int
    completion_tokens: int
    estimated: bool


@dataclass(frozen=True, slots=True)
class Finish:
    """Why the model stopped: "stop", "length", "content_filter", …"""

    reason: str


StreamItem = Delta | Usage | Finish


@dataclass
class StreamTiming:
    """When one stream's request went out and its first delta came back (the event loop's
    clock), noted by the client for whoever passed it in: the model's own time to first token,
    which the turn subtracts from its own to know the time chatsite adds."""

    sent: float | None = None
    first_delta: float | None = None

    @property
    def model_seconds(self) -> float | None:
        """Request sent → first delta, once both happened."""
        if self.sent is None or self.first_delta is None:
            return None
        return self.first_delta - self.sent


@dataclass
class Progress:
    """What one stream has delivered so far."""

    prompt_chars: int
    responded: bool = False
    done: bool = False
    text_chars: int = 0
    finish: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def usage(self) -> Usage:
        estimated = self.prompt_tokens is None or self.completion_tokens is None
        prompt = self.prompt_tokens
        if prompt is None:
            prompt = chars_to_tokens(self.prompt_chars)
        completion = self.completion_tokens
        if completion is None:
            completion = chars_to_tokens(self.text_chars)
        return Usage(prompt, completion, estimated)

    def take_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and not isinstance(prompt, bool):
            self.prompt_tokens = prompt
        if isinstance(completion, int) and not isinstance(completion, bool):
            self.completion_tokens = completion


def items_from_events(events: list[SSEEvent], progress: Progress) -> Iterator[StreamItem]:
    """The items in a batch of events, yielded one by one so an error event after some deltas
    still lets those deltas through first."""
    for event in events:
        if progress.done:
            break
        data: str = event.data
        if data == "[DONE]":
            progress.done = True
            break
        if event.event == "error":
            raise failure(
                "stream_error",
                STREAM_ERROR_MESSAGE,
                detail=stream_error_detail(loads_or_text(data)),
            )
        try:
            chunk = json.loads(data)
        except ValueError:
            raise failure(
                "protocol", UNREADABLE_MESSAGE, detail="a malformed chunk (not JSON)"
            ) from None
        if not isinstance(chunk, dict):
            raise failure(
                "protocol", UNREADABLE_MESSAGE, detail="a malformed chunk (not an object)"
            )
        if chunk.get("error"):
            raise failure("stream_error", STREAM_ERROR_MESSAGE, detail=stream_error_detail(chunk))
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                content = delta.get("content")
                # A role-only first delta and an empty last one carry no text: skip them.
                if isinstance(content, str) and content:
                    progress.text_chars += len(content)
                    yield Delta(content)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason and progress.finish is None:
                progress.finish = reason
                yield Finish(reason)
        progress.take_usage(chunk.get("usage"))


def items_from_completion(body: bytes, progress: Progress) -> list[StreamItem]:
    """Items of a non-streamed completion (a server that ignored "stream": true)."""
    try:
        completion = json.loads(body)
    except ValueError:
        raise failure(
            "protocol", UNREADABLE_MESSAGE, detail="a malformed answer (not JSON)"
        ) from None
    if not isinstance(completion, dict):
        raise failure("protocol", UNREADABLE_MESSAGE, detail="a malformed answer (not an object)")
    if completion.get("error"):
        raise failure("stream_error", STREAM_ERROR_MESSAGE, detail=stream_error_detail(completion))
    items: list[StreamItem] = []
    for choice in completion.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str) and content:
            progress.text_chars += len(content)
            items.append(Delta(content))
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            progress.finish = reason
            items.append(Finish(reason))
    if not progress.text_chars:
        raise failure("empty", EMPTY_ANSWER_MESSAGE)
    if progress.finish is None:
        items.append(Finish("stop"))
    progress.take_usage(completion.get("usage"))
    progress.done = True
    items.append(progress.usage())
    return items

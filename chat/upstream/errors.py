"""The model server's failures: one exception with a kind, a plain message for the user and the
technical detail for the log."""

from __future__ import annotations

import contextlib
import json
import logging
import re
from typing import Any, Literal

import httpx

logger = logging.getLogger("chat.upstream")

ErrorKind = Literal["http_status", "timeout", "connect", "protocol", "stream_error", "empty"]

# How much of an error response we read to explain it: enough for any JSON error, and a
# misbehaving server cannot make us buffer a huge page.
MAX_ERROR_BODY_BYTES = 64 * 1024
MAX_ERROR_MESSAGE_CHARS = 300
EMPTY_ANSWER_MESSAGE = (
    "The model returned an empty answer (the prompt may be over its context window)"
)
DROPPED_MESSAGE = "The model's connection dropped before the answer finished"
# What a user reads for each kind of failure. Never the model server's own words: they have
# carried masked API keys, internal host names and stack traces (docs/security.md, 13.15).
UNREACHABLE_MESSAGE = "The model server could not be reached"
UNREADABLE_MESSAGE = "The model server sent something that is not an answer"
STREAM_ERROR_MESSAGE = "The model server reported an error while answering"
SERVER_TROUBLE_MESSAGE = "The model server had a problem and could not answer"
BUSY_MESSAGE = "The model server is busy right now"
NOT_ALLOWED_MESSAGE = "The model server refused this site's request (a setting on our side)"
NO_SUCH_MODEL_MESSAGE = "The model server does not offer the model this site is set to use"
REFUSED_REQUEST_MESSAGE = "The model server could not take this request (it may be too long)"


def http_status_message(status: int) -> str:
    """Words for the user for an HTTP status from the model server."""
    if status in (401, 402, 403, 407):
        return NOT_ALLOWED_MESSAGE
    if status == 404:
        return NO_SUCH_MODEL_MESSAGE
    if status == 429:
        return BUSY_MESSAGE
    if status in (400, 409, 413, 422):
        return REFUSED_REQUEST_MESSAGE
    return SERVER_TROUBLE_MESSAGE


class UpstreamError(Exception):
    """The model server could not give an answer.

    `message` is fit to show the user: plain words chosen by the kind of failure, never text
    from the model server. `detail` is what really happened (the status and the server's own
    error, the network error), for the log only.
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        detail: str = "",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.detail = detail or message
        self.status = status
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return (
            f"UpstreamError(kind={self.kind!r}, status={self.status!r}, message={self.message!r})"
        )


def failure(kind: ErrorKind, message: str, *, detail: str = "", **extra: Any) -> UpstreamError:
    """The error to raise; its detail (or message) is logged here, the one place it goes."""
    logger.warning("upstream %s: %s", kind, detail or message)
    return UpstreamError(kind, message, detail=detail, **extra)


_TAG_RE = re.compile(r"<[^>]*>")


def loads_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > MAX_ERROR_MESSAGE_CHARS:
        text = text[: MAX_ERROR_MESSAGE_CHARS - 1] + "…"
    return text


def error_body_message(body: Any) -> str:
    """The human part of an error body: OpenAI's {"error": {...}}, {"detail": ...}, or text."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            message = error.get("message")
            if isinstance(message, str) and message.strip():
                return _shorten(message)
            return _shorten(json.dumps(error))
        if isinstance(error, str) and error.strip():
            return _shorten(error)
        detail = body.get("detail")
        if isinstance(detail, str) and detail.strip():
            return _shorten(detail)
        if isinstance(detail, list):
            # FastAPI's validation errors: a list of {"loc": [...], "msg": "..."}.
            parts = [
                d["msg"] for d in detail if isinstance(d, dict) and isinstance(d.get("msg"), str)
            ]
            if parts:
                return _shorten("; ".join(parts))
        message = body.get("message")
        if isinstance(message, str) and message.strip():
            return _shorten(message)
        return _shorten(json.dumps(body))
    if isinstance(body, str):
        # Plain text, or an HTML error page from a proxy: keep only its words.
        return _shorten(_TAG_RE.sub(" ", body))
    return _shorten(json.dumps(body))


def stream_error_detail(body: Any) -> str:
    text = error_body_message(body)
    return f"The model server reported an error mid-answer: {text or 'no details'}"


async def status_error(response: httpx.Response) -> UpstreamError:
    body = b""
    with contextlib.suppress(httpx.HTTPError):
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) >= MAX_ERROR_BODY_BYTES:
                break
    text = body[:MAX_ERROR_BODY_BYTES].decode("utf-8", "replace").strip()
    detail = error_body_message(loads_or_text(text)) if text else ""
    if not detail:
        detail = response.reason_phrase or "no details"
    retry_after = None
    with contextlib.suppress(ValueError):
        retry_after = float(response.headers.get("retry-after", ""))
    return failure(
        "http_status",
        http_status_message(response.status_code),
        detail=f"The model server answered {response.status_code}: {detail}",
        status=response.status_code,
        retry_after=retry_after,
    )

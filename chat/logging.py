"""Structured logs: every line names its instance; every line about a turn, its turn and message.

`bind_turn()` puts a turn's ids in a context variable at the start of the turn's task. asyncio
copies the context into every task the turn starts and asgiref copies it into the threads of
`database_sync_to_async`, so whatever code logs on behalf of the turn — the upstream client, the
stream log, the services — gets the ids without passing them around. `ContextFilter` (attached
to the handler in settings.LOGGING) copies them onto each record; `JsonFormatter` writes JSON
lines and `KeyValueFormatter` logfmt-style `key=value` lines (`DJANGO_LOG_FORMAT=json|text`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import BadRequest

# The fields a turn puts on each line, in the order the text format shows them.
TURN_FIELDS = ("turn", "mid", "conversation", "user")
# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "instance",
    *TURN_FIELDS,
}


@dataclass(frozen=True)
class TurnContext:
    """The ids a log line about a turn carries."""

    turn: str  # this run of the turn (a retry of the same message is another turn)
    mid: str  # the assistant message being written
    conversation: str
    user: str


_current: contextvars.ContextVar[TurnContext | None] = contextvars.ContextVar(
    "chat_turn", default=None
)


def bind_turn(mid: str, *, conversation: str = "", user: int | str | None = None) -> TurnContext:
    """Mark the running task (and what it starts) as working on this turn; returns the ids."""
    context = TurnContext(
        turn=uuid.uuid4().hex[:12],
        mid=mid,
        conversation=conversation,
        user="" if user is None else str(user),
    )
    _current.set(context)
    return context


@contextlib.contextmanager
def turn_context(
    mid: str, *, conversation: str = "", user: int | str | None = None
) -> Iterator[TurnContext]:
    """`bind_turn` for a block of code (sync code, tests); restores the previous ids after."""
    token = _current.set(None)
    try:
        yield bind_turn(mid, conversation=conversation, user=user)
    finally:
        _current.reset(token)


def current_turn() -> TurnContext | None:
    return _current.get()


class ContextFilter(logging.Filter):
    """Adds `instance` to every record and the turn's ids to records logged inside a turn.

    Ids given explicitly with `extra={"mid": ...}` win over the context's.
    """

    def __init__(self, instance: str = "") -> None:
        super().__init__()
        self.instance = instance

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "instance", ""):
            record.instance = self.instance or _instance_from_settings()
        context = _current.get()
        for name in TURN_FIELDS:
            if not getattr(record, name, ""):
                setattr(record, name, getattr(context, name) if context is not None else "")
        return True


class RefusedInputFilter(logging.Filter):
    """Drops the traceback from Django's "Bad Request" lines: a 400 is the client's input
    refused (chat.forms.InvalidInput and Django's own BadRequest), said in one line. Any user
    could otherwise write ~30 lines into the log per request (a hostile review)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], BadRequest):
            record.exc_info = None
            record.exc_text = None
        return True


def _instance_from_settings() -> str:
    try:
        return str(settings.CHAT_INSTANCE_ID)
    except Exception:  # settings not configured (a script importing chat code): no instance
        return ""


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, instance, the turn's ids, extras, exc."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "instance": getattr(record, "instance", ""),
        }
        for name in TURN_FIELDS:
            value = getattr(record, name, "")
            if value:
                line[name] = value
        for key, value in _extras(record).items():
            line.setdefault(key, value)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def _logfmt(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\\\n\t'):
        return text
    return json.dumps(text, ensure_ascii=False)  # quoted, with \" and \n escaped


class KeyValueFormatter(logging.Formatter):
    """logfmt-style lines (`ts=… level=… logger=… instance=… turn=… mid=… msg="…"`)."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"ts={_timestamp(record)}",
            f"level={record.levelname}",
            f"logger={record.name}",
        ]
        instance = getattr(record, "instance", "")
        if instance:
            parts.append(f"instance={_logfmt(instance)}")
        for name in TURN_FIELDS:
            value = getattr(record, name, "")
            if value:
                parts.append(f"{name}={_logfmt(value)}")
        for key, value in _extras(record).items():
            parts.append(f"{key}={_logfmt(value)}")
        parts.append(f"msg={_logfmt(record.getMessage())}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line

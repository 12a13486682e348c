"""Template filters of the chat page: what a failed answer's footer offers (Retry, or what to do
instead when a retry cannot succeed)."""

from __future__ import annotations

from dataclasses import dataclass

from django import template

from chat.turns.turn import DELETED
from chat.upstream.errors import (
    NO_SUCH_MODEL_MESSAGE,
    NOT_ALLOWED_MESSAGE,
    REFUSED_REQUEST_MESSAGE,
)

register = template.Library()

SETTINGS_ADVICE = (
    "Retrying will not help until the site's model settings are fixed: tell whoever runs this site."
)
# Failures that the same request meets again, whatever the moment: Retry is not offered for
# them. Everything else (the model server down, busy or slow, a dropped connection, a crash on
# our side) may well succeed a moment later.
_NO_RETRY = {
    NOT_ALLOWED_MESSAGE: SETTINGS_ADVICE,
    NO_SUCH_MODEL_MESSAGE: SETTINGS_ADVICE,
    REFUSED_REQUEST_MESSAGE: (
        "Retrying the same message will not help: shorten it, or start a new chat."
    ),
    DELETED: "",
}


def _words(error: str) -> str:
    # Saved errors are these sentences, with or without their full stop.
    return (error or "").strip().rstrip(".")


_NO_RETRY_BY_WORDS = {_words(error): advice for error, advice in _NO_RETRY.items()}


@dataclass(frozen=True)
class Failure:
    """What a failed answer's footer offers: Retry, or advice when a retry cannot succeed."""

    retry: bool
    advice: str = ""


@register.filter
def failure(error: str) -> Failure:
    """`{% with f=m.error|failure %}`: whether Retry can succeed for this saved error."""
    advice = _NO_RETRY_BY_WORDS.get(_words(error))
    return Failure(retry=True) if advice is None else Failure(retry=False, advice=advice)

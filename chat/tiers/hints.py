"""What a request tells us about its device: the User-Agent, the client hints (Sec-CH-UA-Mobile,
Save-Data, ECT) and the user's own choice, read from HTTP headers or a socket's scope."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.http.cookie import parse_cookie

from chat.models import Tier

# The per-device choice lives in a cookie, not the account: the same person may want the full
# model on a laptop and the lite one on a phone.
CHOICE_COOKIE = "chat_tier"

# For the HTTP adapter. Sec-CH-UA-Mobile and Save-Data are sent without asking (where the browser
# supports them); ECT only after the origin asks for it with Accept-CH.
ACCEPT_CH = "Sec-CH-UA-Mobile, Save-Data, ECT"
VARY = ("User-Agent", "Sec-CH-UA-Mobile", "Save-Data", "ECT", "Cookie")

# Real User-Agents stay under ~500 characters; the cap bounds what a hostile client can make
# the parser (and the device_class cache) chew on.
MAX_USER_AGENT_LENGTH = 1024


@dataclass(frozen=True)
class Signals:
    """What a request tells us about its device, normalised (None = absent or unreadable)."""

    user_agent: str
    ch_mobile: str | None  # "?1" | "?0"
    save_data: str | None  # "on"
    ect: str | None  # "slow-2g" | "2g" | "3g" | "4g"
    choice: str | None  # "full" | "lite"


_ECT_VALUES = frozenset({"slow-2g", "2g", "3g", "4g"})


def normalise_ch_mobile(value: str | None) -> str | None:
    # A structured-header boolean: exactly ?1 or ?0. Anything else is not a hint we can trust.
    if value is None:
        return None
    value = value.strip()
    return value if value in ("?1", "?0") else None


def normalise_save_data(value: str | None) -> str | None:
    # `Save-Data: on` may carry parameters after a semicolon; only the first token counts.
    if value is None:
        return None
    return "on" if value.split(";", 1)[0].strip().lower() == "on" else None


def normalise_ect(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().strip('"').lower()
    return value if value in _ECT_VALUES else None


def normalise_choice(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip().lower()
    return value if value in (Tier.FULL.value, Tier.LITE.value) else None


def signals_from_headers(headers: Mapping[str, str], cookies: Mapping[str, str]) -> Signals:
    """Signals from lower-case header names (Django's request.headers works too) and cookies."""
    # request.headers is case-insensitive, a plain dict is not: look names up lower-cased.
    lowered = {name.lower(): value for name, value in headers.items()}
    user_agent = lowered.get("user-agent") or ""
    return Signals(
        user_agent=user_agent.strip()[:MAX_USER_AGENT_LENGTH],
        ch_mobile=normalise_ch_mobile(lowered.get("sec-ch-ua-mobile")),
        save_data=normalise_save_data(lowered.get("save-data")),
        ect=normalise_ect(lowered.get("ect")),
        choice=normalise_choice(cookies.get(CHOICE_COOKIE)),
    )


def signals_from_scope(scope: Mapping[str, Any]) -> Signals:
    """Signals from an ASGI (websocket) scope: headers are (bytes, bytes) pairs."""
    headers: dict[str, str] = {}
    cookie_parts: list[str] = []
    raw: Iterable[tuple[bytes, bytes]] = scope.get("headers") or ()
    for raw_name, raw_value in raw:
        # HTTP header bytes are latin-1 by definition; decoding that way never fails.
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        if name == "cookie":
            # HTTP/2 may split cookies over several headers.
            cookie_parts.append(value)
        else:
            headers.setdefault(name, value)
    return signals_from_headers(headers, parse_cookie("; ".join(cookie_parts)))

"""Thin adapters of the tier policy and the limiter: Django HTTP middleware and ASGI middleware.

The policy (chat.tiers) and the limiter (chat.ratelimit) are implemented once; these classes only
translate a request, a socket scope or a prompt frame into their calls and their answers back
into headers, 429 responses and error frames.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.utils.cache import patch_vary_headers

from chat import frames, metrics
from chat.ratelimit import Rejection, get_limiter
from chat.tiers import ACCEPT_CH, VARY, tier_for_request, tier_for_scope

Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]
ASGIApp = Callable[..., Awaitable[None]]

CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",  # no remote images: an image URL can exfiltrate data
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class _AsyncMiddleware:
    """Base for async middleware: under daphne a sync-only one costs a thread hop per request."""

    async_capable = True
    sync_capable = False

    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response
        if iscoroutinefunction(self.get_response):
            markcoroutinefunction(self)  # type: ignore[type-var]


class ContentSecurityPolicyMiddleware(_AsyncMiddleware):
    """A strict CSP on every page: no inline scripts or styles, nothing from other origins."""

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        response = await self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault(
            "Permissions-Policy", "camera=(), microphone=(), geolocation=()"
        )
        return response


class DeviceTierMiddleware(_AsyncMiddleware):
    """Sets `request.tier` and asks browsers for the client hints the policy reads."""

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        request.tier = await tier_for_request(request)  # type: ignore[attr-defined]
        response = await self.get_response(request)
        if response.get("Content-Type", "").startswith("text/html"):
            response["Accept-CH"] = ACCEPT_CH
            patch_vary_headers(response, VARY)
        return response


class RateLimitMiddleware(_AsyncMiddleware):
    """429 with Retry-After for users who send too many state-changing HTTP requests."""

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and not request.path.startswith("/admin/"):
            user = await request.auser()
            key = f"user:{user.pk}" if user.is_authenticated else f"ip:{_client_ip(request)}"
            rejection = await get_limiter().hit_http(key, settings.CHAT_HTTP_RATE_LIMIT)
            if rejection is not None:
                metrics.rejected(rejection.code, "http")
                return too_many_requests(request, rejection)
        return await self.get_response(request)


def too_many_requests(request: HttpRequest, rejection: Rejection) -> HttpResponse:
    body = render_to_string("chat/partials/limited.html", {"rejection": rejection}, request)
    response = HttpResponse(body, status=429)
    response["Retry-After"] = str(rejection.retry_after)
    if request.headers.get("HX-Request"):
        # htmx does not swap 4xx by default: show the message in the alert region instead.
        response["HX-Retarget"] = "#alerts"
        response["HX-Reswap"] = "innerHTML"
    return response


def _client_ip(request: HttpRequest) -> str:
    return str(request.META.get("REMOTE_ADDR", "unknown"))


# --- ASGI (the socket) -------------------------------------------------------------------------


class DeviceTierASGIMiddleware:
    """Sets `scope["tier"]` once per connection from the handshake's headers."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            scope = dict(scope, tier=await tier_for_scope(scope))
        await self.inner(scope, receive, send)


def turn_estimate(text: str | None) -> int | None:
    """Tokens to reserve for a frame that starts a turn (a prompt or a regeneration), or None.

    Malformed frames get None and pass through: the consumer tells the user what is wrong,
    and a frame that cannot start a turn must not use up the user's limits.
    """
    if not text or ('"prompt"' not in text and '"regenerate"' not in text):
        return None  # cheap: most frames are not turns
    try:
        frame = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json goes
        return None
    if not isinstance(frame, dict):
        return None
    if frame.get("type") == "regenerate":
        return settings.CHAT_RESERVE_TOKENS if isinstance(frame.get("mid"), str) else None
    if frame.get("type") != "prompt":
        return None
    body = frame.get("text")
    if not isinstance(body, str) or not body.strip():
        return None
    if len(body) > settings.CHAT_MAX_PROMPT_CHARS:
        return None
    return (len(body) + 3) // 4 + settings.CHAT_RESERVE_TOKENS


class PromptLimitASGIMiddleware:
    """Checks each frame that starts a turn against the user's limits before the consumer.

    A limited prompt is answered with an `error` frame (`rate_limited`, `quota_exceeded`,
    `too_many_streams`, with `retry_after`) and never reaches the consumer; an admitted one
    leaves its Admission in `scope["chat.admissions"]`, which the consumer hands to the turn.
    """

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.inner(scope, receive, send)
            return
        admissions: deque[Any] = deque()
        scope = dict(scope)
        scope["chat.admissions"] = admissions

        async def limited_receive() -> dict[str, Any]:
            while True:
                message: dict[str, Any] = await receive()
                if message["type"] != "websocket.receive":
                    return message
                estimate = turn_estimate(message.get("text"))
                user = scope.get("user")
                if estimate is None or user is None or not user.is_authenticated:
                    return message
                result = await get_limiter().admit(user.pk, estimate_tokens=estimate)
                if isinstance(result, Rejection):
                    metrics.rejected(result.code, "socket")
                    await send(
                        {
                            "type": "websocket.send",
                            "text": frames.error(
                                result.code,
                                result.message,
                                retry_after=result.retry_after,
                                reset_at=result.reset_at,
                            ),
                        }
                    )
                    continue
                admissions.append(result)
                return message

        await self.inner(scope, limited_receive, send)

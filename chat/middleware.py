"""The edge's middleware: thin adapters of the tier policy and the limiter (HTTP and ASGI), the
page headers, and the websocket Origin check.

The policy (chat.tiers) and the limiter (chat.limits) are implemented once; these classes only
translate a request, a socket scope or a client frame into their calls, and their answers into
headers, 429 responses and decisions handed down with the socket's events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from channels.auth import AuthMiddleware
from channels.security.websocket import WebsocketDenier
from channels.sessions import CookieMiddleware, InstanceSessionWrapper, SessionMiddleware
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.http.request import split_domain_port, validate_host
from django.template.loader import render_to_string
from django.urls import Resolver404, resolve
from django.utils.cache import patch_vary_headers
from django.utils.http import is_same_domain
from django_htmx.http import reswap, retarget

from chat import metrics, protocol
from chat.forms import InvalidInput
from chat.limits.budget import TurnAsk, turn_ask
from chat.limits.limiter import Admission, get_limiter
from chat.limits.logins import address_key
from chat.limits.refusals import Rejection
from chat.sockets import draining
from chat.tiers.hints import ACCEPT_CH, VARY
from chat.tiers.picker import awith_choices
from chat.tiers.policy import TierDecision, tier_for_request, tier_for_scope
from chat.turns.start import tier_within_plan

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


NUL_REFUSED = (
    "Your request held a NUL character (\\0), which cannot be stored here. Remove it and try again."
)


def _holds_nul(request: HttpRequest) -> bool:
    texts = [request.path]
    queries = [request.GET, request.POST] if request.method == "POST" else [request.GET]
    for query in queries:
        for name, values in query.lists():
            texts.append(name)
            texts.extend(values)
    for name, value in request.COOKIES.items():
        texts.extend((name, value))
    return any("\x00" in text for text in texts)


class NulInputMiddleware(_AsyncMiddleware):
    """400 for a request with a NUL character in its path, query, form fields or cookies.

    PostgreSQL text cannot hold NUL (SQLite can, so tests on SQLite alone never see it): a NUL
    that reached a query or a save was a 500 (`?q=%00` on the conversation list, the admin's
    search, a session cookie). Refused here, once, for every view.
    """

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        if _holds_nul(request):
            raise InvalidInput(NUL_REFUSED)
        return await self.get_response(request)


class DeviceTierMiddleware(_AsyncMiddleware):
    """Sets `request.tier` and asks browsers for the client hints the policy reads."""

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        tier = await tier_for_request(request)
        request.tier = await _within_plan(tier, await request.auser())  # type: ignore[attr-defined]
        response = await self.get_response(request)
        if response.get("Content-Type", "").startswith("text/html"):
            response["Accept-CH"] = ACCEPT_CH
            patch_vary_headers(response, VARY)
        return response


# The pages that send a whole conversation (a long answer's stored HTML is over a megabyte):
# their loads count against CHAT_PAGE_RATE (docs/security.md).
PAGE_ROUTES = frozenset(
    {"chat:conversation", "chat:shared", "chat:export_markdown", "chat:export_json"}
)


def _is_page(request: HttpRequest) -> bool:
    if request.method not in ("GET", "HEAD"):
        return False
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return False
    return match.view_name in PAGE_ROUTES


class RateLimitMiddleware(_AsyncMiddleware):
    """429 with Retry-After for users who send too many state-changing HTTP requests, or load
    too many conversation pages (CHAT_PAGE_RATE)."""

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and not request.path.startswith("/admin/"):
            rejection = await get_limiter().hit_http(
                await _rate_key(request), settings.CHAT_HTTP_RATE_LIMIT
            )
            if rejection is not None:
                metrics.rejected(rejection.code, "http")
                return too_many_requests(request, rejection)
        elif _is_page(request):
            rejection = await get_limiter().hit_page(await _rate_key(request))
            if rejection is not None:
                metrics.rejected(rejection.code, "http")
                return too_many_requests(request, rejection, page=True)
        return await self.get_response(request)


async def _rate_key(request: HttpRequest) -> str:
    """A user by their id; anyone else by their address (an IPv6 one by its /64)."""
    user = await request.auser()
    if user.is_authenticated:
        return f"user:{user.pk}"
    return f"ip:{address_key(_client_ip(request))}"


def too_many_requests(
    request: HttpRequest, rejection: Rejection, *, page: bool = False
) -> HttpResponse:
    """The refusal in words, 429 and Retry-After: in the page's alert region for htmx, a page
    of its own for a page load (`page`) that is not one."""
    template = "chat/partials/limited.html"
    if page and not request.htmx:  # type: ignore[attr-defined]
        template = "chat/limited.html"
    body = render_to_string(template, {"rejection": rejection}, request)
    response = HttpResponse(body, status=429)
    response["Retry-After"] = str(rejection.retry_after)
    if request.htmx:  # type: ignore[attr-defined]
        # htmx does not swap 4xx by default: show the message in the alert region instead.
        retarget(response, "#alerts")
        reswap(response, "innerHTML")
    return response


def _client_ip(request: HttpRequest) -> str:
    return str(request.META.get("REMOTE_ADDR", "unknown"))


# --- ASGI (the socket) -------------------------------------------------------------------------


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def request_origin(scope: dict[str, Any]) -> str | None:
    """The socket's own origin, `scheme://host[:port]` from its Host header, as Django's CSRF
    check builds it; None when the Host is not one of ALLOWED_HOSTS."""
    host = _header(scope, b"host")
    if not host:
        return None
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    proxy_header = settings.SECURE_PROXY_SSL_HEADER
    if proxy_header:
        # Behind the TLS proxy (DJANGO_BEHIND_PROXY) its header says the scheme, as for HTTP.
        name, secure_value = proxy_header
        forwarded = _header(scope, name.removeprefix("HTTP_").replace("_", "-").lower().encode())
        secure = (forwarded or "").split(",")[0].strip() == secure_value
    else:
        secure = scope.get("scheme") in ("wss", "https")
    return f"{'https' if secure else 'http'}://{host}"


def origin_allowed(scope: dict[str, Any]) -> bool:
    """Whether the handshake's Origin is exactly this site's own origin (scheme, host and port)
    or one of DJANGO_CSRF_TRUSTED_ORIGINS — the same rule as Django's CSRF Origin check.

    `null` (sandboxed frames, file: pages) and a missing Origin are refused: a browser always
    sends one on a websocket handshake.
    """
    origin = _header(scope, b"origin")
    if not origin or origin == "null":
        return False
    if origin == request_origin(scope):
        return True
    trusted = settings.CSRF_TRUSTED_ORIGINS
    if origin in trusted:
        return True
    try:
        parsed = urlsplit(origin)
    except ValueError:
        return False
    # "https://*.example.com" trusts every subdomain of example.com over https (Django's rule).
    return any(
        is_same_domain(parsed.netloc, pattern.netloc.lstrip("*"))
        for pattern in (urlsplit(entry) for entry in trusted if "*" in entry)
        if pattern.scheme == parsed.scheme
    )


class OriginValidator:
    """Refuses (403) a websocket handshake from any origin but our own (cross-site websocket
    hijacking: the browser sends the user's cookie with it).

    Channels' AllowedHostsOriginValidator compares only the Origin's host with ALLOWED_HOSTS,
    so another port or scheme of the same host (`http://127.0.0.1:9999`, `ftp://…`,
    `chrome-extension://…`) passed.
    """

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            await WebsocketDenier()(scope, receive, send)
            return
        await self.inner(scope, receive, send)


class SocketSessionMiddleware(SessionMiddleware):
    """Channels' SessionMiddleware, whose socket frames go out without its session checks.

    Channels wraps `send` to save a modified session with an HTTP response
    (`http.response.start`), the only message it saves on. A socket sends none, yet for every
    frame the wrapper read the session's `modified` and `is_empty()` through Django's
    LazyObject: ~4 µs a frame, dozens of frames a turn (docs/decisions/performance.md). The
    session is resolved as before; a websocket's messages then go to `send` directly.
    """

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        wrapper = InstanceSessionWrapper(scope, send)
        await wrapper.resolve_session()
        if scope["type"] == "websocket":
            return await self.inner(wrapper.scope, receive, send)
        return await self.inner(wrapper.scope, receive, wrapper.send)


def socket_auth_stack(inner: ASGIApp) -> ASGIApp:
    """Channels' AuthMiddlewareStack, with SocketSessionMiddleware for its sessions."""
    return CookieMiddleware(SocketSessionMiddleware(AuthMiddleware(inner)))


class DeviceTierASGIMiddleware:
    """Sets `scope["tier"]` once per connection from the handshake's headers (and the user's
    plan, for the models they may pick)."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            # Within the plan, with the models this user may pick here (`ready` lists them).
            tier = await _within_plan(await tier_for_scope(scope), scope.get("user"))
            tier = await awith_choices(tier, scope.get("user"))
            scope = dict(scope, tier=tier)
        await self.inner(scope, receive, send)


async def _within_plan(tier: TierDecision, user: Any) -> TierDecision:
    """The device's tier, unless the user's plan forbids the full model: then the badge and the
    `ready` frame say lite from the start (each turn checks again: chat.turns.start)."""
    if user is None or not user.is_authenticated:
        return tier
    return await tier_within_plan(tier, int(user.pk))


DRAINING = protocol.Refusal(
    "unavailable",
    "This server is restarting; your message was not sent. Send it again in a moment.",
    retry_after=1,
)


def turn_estimate(frame: protocol.TurnFrame, tier: TierDecision | None) -> TurnAsk:
    """What to reserve for a frame that starts a turn, before its history is known: its new
    text and a whole answer, at least its new text and a short one. The turn fits the
    reservation to its real prompt when it starts (chat.limits.budget.fit)."""
    text = frame.text if isinstance(frame, protocol.Prompt) else ""
    return turn_ask(text, tier.max_tokens if tier is not None else None)


class FrameASGIMiddleware:
    """Parses every client frame once and admits each frame that starts a turn.

    What it decides travels down with the `websocket.receive` event itself: the parsed frame
    (or the FrameError that refused it) under `protocol.FRAME_KEY`, and for a frame that
    starts a turn its Admission — or the Refusal (a limit, a restart) — under
    `protocol.VERDICT_KEY`. Whether a frame starts a turn is decided from the parsed frame,
    so a re-spelled frame (`"\\u0070rompt"`, keys in another order, white space) is exactly as
    limited as a plain one, and the consumer acts on the same parse. This layer never writes
    to the socket: the consumer's outbox does.
    """

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.inner(scope, receive, send)
            return

        async def decided_receive() -> dict[str, Any]:
            message: dict[str, Any] = await receive()
            if message["type"] == "websocket.receive":
                message = await self.decide(scope, message)
            return message

        await self.inner(scope, decided_receive, send)

    async def decide(self, scope: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
        received = asyncio.get_running_loop().time()
        raw = message.get("text")
        try:
            frame: Any = protocol.parse(raw if raw is not None else message.get("bytes"))
        except protocol.FrameError as exc:
            frame = exc
        decided = {**message, protocol.FRAME_KEY: frame, protocol.RECEIVED_KEY: received}
        if protocol.starts_turn(frame):
            decided[protocol.VERDICT_KEY] = await self.admit(scope, frame)
        elif isinstance(frame, protocol.Resume):
            decided[protocol.VERDICT_KEY] = await self.meter_resume(scope)
        return decided

    async def meter_resume(self, scope: dict[str, Any]) -> protocol.Refusal | None:
        """Count a `resume` against the user's rate (CHAT_RESUME_RATE); over it the consumer
        refuses the resume, of a streaming answer as of a finished one, and the tab asks
        again after `retry_after`."""
        user = scope.get("user")
        if user is None or not user.is_authenticated:
            return None
        rejection = await get_limiter().hit_resume(user.pk)
        if rejection is None:
            return None
        metrics.rejected(rejection.code, "resume")
        return protocol.Refusal(
            rejection.code,
            rejection.message,
            retry_after=rejection.retry_after,
            reset_at=rejection.reset_at,
        )

    async def admit(
        self, scope: dict[str, Any], frame: protocol.TurnFrame
    ) -> Admission | protocol.Refusal | None:
        """The admission of a turn frame, or why not; None without a logged-in user (the
        consumer has closed such a socket, and refuses the frame anyway)."""
        if draining.draining():
            return DRAINING
        user = scope.get("user")
        if user is None or not user.is_authenticated:
            return None
        ask = turn_estimate(frame, scope.get("tier"))
        result = await get_limiter().admit(user.pk, estimate_tokens=ask.want, at_least=ask.at_least)
        if isinstance(result, Rejection):
            metrics.rejected(result.code, "socket")
            return protocol.Refusal(
                result.code,
                result.message,
                retry_after=result.retry_after,
                reset_at=result.reset_at,
                retry_when=result.retry_when,
            )
        return result

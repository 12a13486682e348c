"""ASGI entry point and composition root: Django over HTTP, the chat socket, the demo model."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
# Django must be set up before anything imports models (channels' sample project order).
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.http.request import split_domain_port, validate_host  # noqa: E402

from chat.demo_upstream import DemoModel  # noqa: E402
from chat.middleware import (  # noqa: E402
    DeviceTierASGIMiddleware,
    FrameASGIMiddleware,
    OriginValidator,
    socket_auth_stack,
)
from chat.ops.health import PROBES, probe_asgi  # noqa: E402
from chat.ops.shutdown import GracefulShutdown  # noqa: E402
from chat.ops.startup import ensure_started  # noqa: E402
from chat.socket_caps import SocketCapASGIMiddleware, StrangerGateASGIMiddleware  # noqa: E402
from chat.sockets.routing import websocket_urlpatterns  # noqa: E402

ASGIApp = Any
DEMO_PREFIX = "/demo/v1"


class Entry:
    """Runs the start-up work on the first request or socket (daphne has no lifespan events),
    and serves the demo model under /demo/v1/ with no Django on its path — only where it is
    mounted (settings.DEMO_MOUNTED) and for a Host this site answers to."""

    def __init__(self, app: ASGIApp, *, demo: ASGIApp) -> None:
        self.app = app
        self.demo = demo
        # The app calls its own demo model by the name in LLM_BASE_URL, which need not be one
        # of the public ALLOWED_HOSTS (production: 127.0.0.1 behind nginx).
        self.demo_hosts = [*settings.ALLOWED_HOSTS, urlsplit(settings.LLM_BASE_URL).hostname or ""]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (
            settings.DEMO_MOUNTED
            and scope["type"] == "http"
            and scope["path"].startswith(DEMO_PREFIX + "/")
        ):
            if not self.host_allowed(scope):
                await _bad_host(send)
                return
            await self.demo(scope, receive, send)
            return
        if scope["type"] in ("http", "websocket"):
            ensure_started()
        if (
            scope["type"] == "http"
            and scope["path"] in PROBES
            and scope["method"] in ("GET", "HEAD")
            and self.site_host(scope)
        ):
            await probe_asgi(scope, send)  # before Django: chat/ops/health.py says why
            return
        await self.app(scope, receive, send)

    @staticmethod
    def site_host(scope: dict[str, Any]) -> bool:
        """The Host is one this site answers to, as Django checks it (request.get_host): a
        probe with another Host goes on to Django, which answers 400, as before."""
        allowed = settings.ALLOWED_HOSTS
        if settings.DEBUG and not allowed:
            allowed = [".localhost", "127.0.0.1", "[::1]"]
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        domain, _port = split_domain_port(host)
        return bool(domain) and validate_host(domain, allowed)

    def host_allowed(self, scope: dict[str, Any]) -> bool:
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        domain, _port = split_domain_port(host)
        return bool(domain) and validate_host(domain, self.demo_hosts)


async def _bad_host(send: Any) -> None:
    body = b"Bad Request: this host name is not served here.\n"
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


# GracefulShutdown: SIGTERM drains running answers first (chat/ops/shutdown.py).
application = GracefulShutdown(
    Entry(
        ProtocolTypeRouter(
            {
                # Static files from the app itself, so `make run` needs nothing else; behind
                # nginx (deploy/nginx.conf) /static/ never reaches us.
                "http": ASGIStaticFilesHandler(django_asgi_app),
                # Exact origins (scheme, host, port): chat/middleware.py says why not Channels'.
                # Strangers are refused before the session lookup (chat/socket_caps.py).
                "websocket": OriginValidator(
                    StrangerGateASGIMiddleware(
                        socket_auth_stack(
                            SocketCapASGIMiddleware(
                                DeviceTierASGIMiddleware(
                                    FrameASGIMiddleware(URLRouter(websocket_urlpatterns))
                                )
                            )
                        )
                    )
                ),
            }
        ),
        demo=DemoModel(prefix=DEMO_PREFIX),
    )
)

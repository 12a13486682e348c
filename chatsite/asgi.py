"""ASGI entry point: Django over HTTP, the chat socket, and the embedded demo model."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
# Django must be set up before anything imports models (channels' sample project order).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from chat.demo_upstream import DemoModel  # noqa: E402
from chat.middleware import DeviceTierASGIMiddleware, PromptLimitASGIMiddleware  # noqa: E402
from chat.routing import websocket_urlpatterns  # noqa: E402
from chat.shutdown import GracefulShutdown  # noqa: E402
from chat.startup import HttpEntry  # noqa: E402

# GracefulShutdown: SIGTERM drains running answers first (chat/shutdown.py).
application = GracefulShutdown(
    ProtocolTypeRouter(
        {
            # Static files from the app itself, so `make run` needs nothing else; behind nginx
            # (deploy/nginx.conf) /static/ never reaches us.
            "http": HttpEntry(
                ASGIStaticFilesHandler(django_asgi_app), demo=DemoModel(prefix="/demo/v1")
            ),
            "websocket": AllowedHostsOriginValidator(
                AuthMiddlewareStack(
                    DeviceTierASGIMiddleware(
                        PromptLimitASGIMiddleware(URLRouter(websocket_urlpatterns))
                    )
                )
            ),
        }
    )
)

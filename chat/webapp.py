"""The web app manifest: what a phone needs to add chatsite to its home screen."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.templatetags.static import static
from django.urls import reverse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

# --accent of static/chat/chat.css, and its light background: the colours of the title bar and
# of the splash screen an installed app shows while it starts.
THEME_COLOUR = "#2456d6"
BACKGROUND_COLOUR = "#ffffff"


@require_GET
@cache_control(max_age=3600, public=True)
def manifest(request: HttpRequest) -> JsonResponse:
    """Public (browsers fetch a manifest without cookies); it opens on the chat page."""
    home = reverse("chat:home")
    icons = [
        {"src": static("chat/icons/icon.svg"), "sizes": "any", "type": "image/svg+xml"},
        {"src": static("chat/icons/icon-192.png"), "sizes": "192x192", "type": "image/png"},
        {"src": static("chat/icons/icon-512.png"), "sizes": "512x512", "type": "image/png"},
        {
            "src": static("chat/icons/maskable-512.png"),
            "sizes": "512x512",
            "type": "image/png",
            "purpose": "maskable",
        },
    ]
    response = JsonResponse(
        {
            "id": home,
            "name": "chatsite",
            "short_name": "chatsite",
            "description": "Chat with a language model; answers stream as they are written.",
            "start_url": home,
            "scope": home,
            "display": "standalone",
            "theme_color": THEME_COLOUR,
            "background_color": BACKGROUND_COLOUR,
            "icons": icons,
        },
        content_type="application/manifest+json",
    )
    return response

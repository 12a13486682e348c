"""Installable: the web app manifest, its icons, and the pages that link it (issue 17.8)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

from chat.middleware import CSP


def png_size(path: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", head[16:24])
    return width, height


@pytest.mark.django_db
def test_the_manifest_opens_the_chat_page_with_icons_and_a_theme_colour() -> None:
    response = Client().get("/manifest.webmanifest")  # logged out: browsers send no cookies
    assert response.status_code == 200
    assert response["Content-Type"] == "application/manifest+json"
    manifest = json.loads(response.content)
    assert manifest["start_url"] == "/"
    assert manifest["display"] == "standalone"
    assert manifest["name"] and manifest["short_name"]
    assert manifest["theme_color"].startswith("#")
    sizes = {icon["sizes"] for icon in manifest["icons"] if icon["type"] == "image/png"}
    assert {"192x192", "512x512"} <= sizes
    assert any(icon.get("purpose") == "maskable" for icon in manifest["icons"])
    for icon in manifest["icons"]:
        # Each icon is a static file that exists, and a PNG is the size it says.
        path = finders.find(icon["src"].removeprefix("/static/"))
        assert path, icon
        if icon["type"] == "image/png":
            width, height = png_size(str(path))
            assert f"{width}x{height}" == icon["sizes"]


@pytest.mark.django_db
def test_pages_link_the_manifest_and_the_csp_lets_the_browser_load_it(owner: Any) -> None:
    client = Client()
    login_page = client.get("/accounts/login/")
    client.force_login(owner)
    chat_page = client.get("/")
    for page in (login_page, chat_page):
        html = page.content.decode()
        assert '<link rel="manifest" href="/manifest.webmanifest">' in html
        assert 'name="theme-color"' in html
        assert 'rel="apple-touch-icon"' in html
    # No manifest-src: the manifest falls under default-src 'self', as it is served here.
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert "manifest-src" not in directives
    assert directives["default-src"] == "'self'"
    assert "'self'" in directives["img-src"]

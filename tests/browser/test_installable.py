"""Installable, as Chromium sees it on a desktop and on phones: the page's manifest parses with
no errors, names the chat page as its start and its icons load under the page's CSP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from tests.browser.browsing import DEVICES, open_chat, signed_in_context, watch_for_errors
from tests.servers import running_chatsite

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with running_chatsite() as base:
        yield base


@pytest.mark.parametrize("device", list(DEVICES))
def test_chromium_reads_the_manifest_and_its_icons_without_errors(
    browser: Browser, server: str, device: str
) -> None:
    context = signed_in_context(browser, server, **DEVICES[device])
    page = open_chat(context)
    errors = watch_for_errors(page)
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security" in m.text else None)
    cdp = context.new_cdp_session(page)
    manifest = cdp.send("Page.getAppManifest")
    assert manifest["url"] == f"{server}/manifest.webmanifest"
    assert manifest["errors"] == []
    parsed = cdp.send("Page.getAppManifest")["data"]
    assert '"start_url": "/"' in parsed or '"start_url":"/"' in parsed
    # Every icon the manifest names loads (same origin, allowed by img-src 'self').
    for src in ("/static/chat/icons/icon-192.png", "/static/chat/icons/maskable-512.png"):
        loaded = page.evaluate(
            """(src) => new Promise((ok) => { const i = new Image(); i.onload = () =>
                 ok(i.naturalWidth); i.onerror = () => ok(0); i.src = src; })""",
            src,
        )
        assert loaded > 0, src
    assert refused == [] and errors == []
    context.close()

"""The chat page works from collectstatic's hashed files, its ES module imports included."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
from playwright.sync_api import Browser, Route, expect

from tests.browser.browsing import send, signed_in_context, wait_for_answer, watch_for_errors
from tests.servers import ROOT, base_env, running_chatsite

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def static_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("static")
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=base_env(DJANGO_STATIC_MANIFEST="1", DJANGO_STATIC_ROOT=str(root)),
        check=True,
    )
    return root


@pytest.fixture(scope="module")
def server(static_root: Path) -> Iterator[str]:
    with running_chatsite(DJANGO_STATIC_MANIFEST="1", DJANGO_STATIC_ROOT=str(static_root)) as base:
        yield base


def test_the_page_connects_and_streams_from_hashed_module_files(
    browser: Browser, server: str, static_root: Path
) -> None:
    context = signed_in_context(browser, server)
    page = context.new_page()
    errors = watch_for_errors(page)
    served: list[str] = []

    def from_static_root(route: Route) -> None:
        # In production nginx serves /static/ from collectstatic's output (deploy/nginx.conf);
        # this test runs no nginx, so the browser gets the same files from the same directory.
        name = urlparse(route.request.url).path.removeprefix("/static/")
        file = static_root / name
        if not file.is_file():
            route.fulfill(status=404, body="not collected")
            return
        served.append(name)
        route.fulfill(path=file)

    page.route("**/static/**", from_static_root)
    page.goto("/")
    # Connected means every module loaded: the socket is opened by the entry module last.
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    send(page, "/echo hashed and imported")
    answer = wait_for_answer(page, 1)
    expect(answer).to_have_attribute("data-status", "complete")
    expect(answer.locator(".body")).to_have_text("hashed and imported")
    scripts = {name for name in served if name.startswith("chat/") and name.endswith(".js")}
    # Each script came once, by its hashed name only (the entry, its imports, theme.js).
    modules = {path.name for path in (ROOT / "static" / "chat").glob("*.js")}
    assert len(scripts) == len(modules)
    for name in scripts:
        assert re.fullmatch(r"chat/[\w-]+\.[0-9a-f]{12}\.js", name), name
    assert errors == []
    context.close()

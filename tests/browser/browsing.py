"""Browser-test support: headless Chromium, signed-in contexts and the chat page's usual moves."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect

from tests.servers import ROOT, base_env, migrated_sqlite, running_chatsite, signup

CHROMIUM = os.environ.get("CHATSITE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
PASSWORD = "a-long-test-passphrase-42"
AXE = Path(__file__).resolve().parent / "vendor" / "axe.min.js"
PHONE: dict[str, Any] = {
    "viewport": {"width": 360, "height": 740},
    "device_scale_factor": 2,
    "is_mobile": True,
    "has_touch": True,
    "user_agent": (
        "Mozilla/5.0 (Linux; Android 14; Pixel 7) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/131.0.0.0 Mobile Safari/537.36"
    ),
}
DESKTOP: dict[str, Any] = {
    "viewport": {"width": 1280, "height": 800},
    # Headless Chromium names itself "HeadlessChrome", which the tier policy files as a bot.
    "user_agent": (
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
        "Chrome/131.0.0.0 Safari/537.36"
    ),
}

_names = itertools.count(1)

# Records, per answer, the text it showed while streaming, at the moment the final HTML
# replaced it. Installed before any page script runs (an init script is not subject to the
# page's CSP), and again on every reload.
RECORD_STREAMED_TEXT = """
window.__streamed = {};
window.__statuses = {};
document.addEventListener("DOMContentLoaded", () => {
  const messages = document.getElementById("messages");
  if (!messages) return;
  const note = (article) => {
    const seen = (window.__statuses[article.dataset.mid] ||= []);
    if (seen[seen.length - 1] !== article.dataset.status) seen.push(article.dataset.status);
  };
  messages.querySelectorAll("article.msg-assistant").forEach(note);
  new MutationObserver((records) => {
    for (const record of records) {
      if (record.type === "attributes") {
        if (record.target.matches("article.msg-assistant")) note(record.target);
        continue;
      }
      for (const node of record.removedNodes) {
        if (node.nodeType === 1 && node.matches("article.msg-assistant")
            && node.dataset.status === "streaming") {
          window.__streamed[node.dataset.mid] = node.querySelector(".body").textContent;
        }
      }
      for (const node of record.addedNodes) {
        if (node.nodeType === 1 && node.matches("article.msg-assistant")) note(node);
      }
    }
  }).observe(messages, {
    childList: true, subtree: true, attributes: true, attributeFilter: ["data-status"],
  });
});
"""


def unique_name(prefix: str = "user") -> str:
    return f"{prefix}{os.getpid()}x{next(_names)}"


def launch(playwright: Any) -> Browser:
    """Debian's Chromium, headless; skipped (with the reason) where it is not installed."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (set CHATSITE_CHROMIUM to its path)")
    browser: Browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    return browser


def new_context(browser: Browser, base: str, **options: Any) -> BrowserContext:
    """A fresh browser context (desktop unless told otherwise) that records streamed answers."""
    context = browser.new_context(base_url=base, **{**DESKTOP, **options})
    context.add_init_script(RECORD_STREAMED_TEXT)
    return context


def signed_in_context(
    browser: Browser, base: str, username: str | None = None, **options: Any
) -> BrowserContext:
    """A browser context logged in as a new user (signed up through the real form over HTTP)."""
    client = signup(base, username or unique_name())
    session = client.cookies["sessionid"]
    client.close()
    context = new_context(browser, base, **options)
    context.add_cookies([{"name": "sessionid", "value": session, "url": base}])
    return context


def watch_for_errors(page: Page) -> list[str]:
    """Collect uncaught page errors: a test ends by asserting there were none."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def open_chat(context: BrowserContext, path: str = "/") -> Page:
    page = context.new_page()
    page.goto(path)
    expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
    return page


def send(page: Page, text: str) -> None:
    """Type a prompt and press Enter (Shift+Enter for the newlines inside it)."""
    box = page.locator("#prompt")
    box.click()
    for i, line in enumerate(text.split("\n")):
        if i:
            box.press("Shift+Enter")
        page.keyboard.insert_text(line)
    box.press("Enter")


def answers(page: Page) -> Locator:
    return page.locator("article.msg-assistant")


def last_answer(page: Page) -> Locator:
    return answers(page).last


def wait_for_answer(page: Page, count: int) -> Locator:
    """The `count`-th answer (1-based) once it exists."""
    expect(answers(page)).to_have_count(count)
    return answers(page).nth(count - 1)


def streamed_text(page: Page, mid: str) -> str | None:
    """What the answer showed while it streamed, just before its final HTML replaced it."""
    text: str | None = page.evaluate("(mid) => window.__streamed[mid] ?? null", mid)
    return text


def statuses(page: Page, mid: str) -> list[str]:
    """Every data-status this page's answer element went through, in order."""
    seen: list[str] = page.evaluate("(mid) => window.__statuses[mid] ?? []", mid)
    return seen


def source_text(answer: Locator) -> str:
    """The answer's text as the server saved it (the raw markdown in its <template>)."""
    text: str = answer.locator("template.source").evaluate("t => t.content.textContent")
    return text


def long_text(n: int) -> str:
    """What the demo model answers to `/long n` (its output is deterministic by contract)."""
    from chat.demo_upstream import long_tokens

    return "".join(long_tokens(n))


def run_axe(page: Page) -> list[dict[str, Any]]:
    """The serious and critical axe-core violations on the page as it is now.

    Our CSP forbids inline scripts, so `add_script_tag` (an inline <script>) would be refused;
    `evaluate` runs the vendored axe-core through the DevTools protocol, which the page's CSP
    does not govern. The page itself keeps its CSP, so nothing else is relaxed for the scan.
    """
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(AXE.read_text(encoding="utf-8"))
    result: dict[str, Any] = page.evaluate(
        """async () => await axe.run(document, {
            resultTypes: ["violations"],
            runOnly: {type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa",
                                            "wcag22aa", "best-practice"]},
        })"""
    )
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "help": v["help"],
            "nodes": [n["target"] for n in v["nodes"]][:5],
        }
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


@contextlib.contextmanager
def chatsite_with_superuser(username: str, password: str, **env: str) -> Iterator[str]:
    """A server whose database holds a superuser made by `createsuperuser --noinput`."""
    workdir = Path(tempfile.mkdtemp(prefix="chatsite-admin-"))
    try:
        database_url = migrated_sqlite(workdir)
        subprocess.run(
            [
                sys.executable,
                "manage.py",
                "createsuperuser",
                "--noinput",
                "--username",
                username,
                "--email",
                f"{username}@example.com",
            ],
            cwd=ROOT,
            env=base_env(DATABASE_URL=database_url, DJANGO_SUPERUSER_PASSWORD=password),
            check=True,
            capture_output=True,
        )
        extra: dict[str, Any] = dict(env)
        with running_chatsite(database_url=database_url, **extra) as base:
            yield base
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

"""Browser-test support: headless Chromium, signed-in contexts and the chat page's usual moves."""

from __future__ import annotations

import contextlib
import itertools
import json
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
IPHONE: dict[str, Any] = {
    **PHONE,
    "device_scale_factor": 3,
    "user_agent": (
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 "
        "(KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1"
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

# Each control is tried as a person would on each of these: a mouse and a keyboard, and a
# phone's touch screen (360x740) with an Android and an iPhone User-Agent.
DEVICES: dict[str, dict[str, Any]] = {"desktop": {}, "android": PHONE, "iphone": IPHONE}
PHONES = ("android", "iphone")

_names = itertools.count(1)

# Records, per answer, the text it showed while streaming: after every change while it
# streams, and at the moment the final HTML replaced it (unless its body was kept: live
# rendering keeps a body whose blocks are the final HTML). Installed before any page script
# runs (an init script is not subject to the page's CSP), and again on every reload.
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
        const body = node.nodeType === 1 && node.matches("article.msg-assistant")
          && node.dataset.status === "streaming" && node.querySelector(".body");
        if (body) window.__streamed[node.dataset.mid] = body.textContent;
      }
      for (const node of record.addedNodes) {
        if (node.nodeType === 1 && node.matches("article.msg-assistant")) note(node);
      }
    }
    for (const article of messages.querySelectorAll(
      'article.msg-assistant[data-status="streaming"]')) {
      window.__streamed[article.dataset.mid] = article.querySelector(".body").textContent;
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


def press(page: Page, locator: Locator) -> None:
    """Press a control as the device's user would: a tap on a touch screen, else a click."""
    if is_touch(page):
        locator.tap()
    else:
        locator.click()


def use(touch: bool, locator: Locator) -> None:
    """Tap or click (decided once: asking the page between navigations races them)."""
    if touch:
        locator.tap()
    else:
        locator.click()


def fill(page: Page, touch: bool, label: str, text: str) -> None:
    use(touch, page.get_by_label(label, exact=True))
    page.keyboard.type(text)


def open_system_prompt(page: Page) -> None:
    """Open this conversation's system prompt as its user would: ⚙ in the header or, on a phone
    (⚙ leaves the header there, the title needs the room), the header's ⋯ menu."""
    gear = page.locator("#conversation-settings-menu > summary")
    if gear.is_visible():
        press(page, gear)
    else:
        press(page, page.locator("#share-menu > summary"))
        item = page.locator("#share-menu").get_by_role("button", name="System prompt for this chat")
        press(page, item)
    expect(page.locator("#system-prompt")).to_be_visible()


def type_prompt(page: Page, text: str) -> None:
    """Put the caret in the prompt box (a tap on a phone) and type `text`, keeping it there."""
    press(page, page.locator("#prompt"))
    page.keyboard.type(text)


class Frames:
    """The JSON frames a page's chat sockets sent and received, in order, every socket."""

    def __init__(self, page: Page) -> None:
        self.received: list[dict[str, Any]] = []
        self.sent: list[dict[str, Any]] = []
        page.on("websocket", self._watch)

    def _watch(self, ws: Any) -> None:
        ws.on("framereceived", lambda payload: self._note(self.received, payload))
        ws.on("framesent", lambda payload: self._note(self.sent, payload))

    @staticmethod
    def _note(into: list[dict[str, Any]], payload: str | bytes) -> None:
        if isinstance(payload, str) and payload.startswith("{"):
            into.append(json.loads(payload))

    def of_type(self, kind: str, *, sent: bool = False) -> list[dict[str, Any]]:
        return [f for f in (self.sent if sent else self.received) if f.get("type") == kind]


def error_under(page: Page, label: str) -> str | None:
    """The error shown between the field `label` and the next field's label (None: none)."""
    text: str | None = page.get_by_label(label, exact=True).evaluate(
        """(input) => {
          for (let el = input.nextElementSibling; el && el.tagName !== "LABEL";
               el = el.nextElementSibling) {
            if (el.matches(".form-error")) return el.textContent;
          }
          return null;
        }"""
    )
    return text


def is_touch(page: Page) -> bool:
    """Whether the page sees a touch screen (`pointer: coarse`): a phone or a tablet."""
    coarse: bool = page.evaluate("() => matchMedia('(pointer: coarse)').matches")
    return coarse


def send(page: Page, text: str) -> None:
    """Type a prompt and send it: Enter on a keyboard (Shift+Enter for the newlines inside
    it); on a touch screen, where Return makes a new line, a tap on Send."""
    box = page.locator("#prompt")
    if is_touch(page):
        box.tap()
        page.keyboard.insert_text(text)
        page.locator("#send").tap()
        return
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


def manage_shell(database_url: str, code: str) -> None:
    """Run Python in `manage.py shell` against a test server's database: the setup an admin
    would make in the admin (a plan, a staff flag), which these tests do not test."""
    subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=base_env(DATABASE_URL=database_url),
        check=True,
        capture_output=True,
    )


@contextlib.contextmanager
def chatsite_with_database(setup: str = "", **env: str) -> Iterator[tuple[str, str]]:
    """A server and its database URL (for `manage_shell`); `setup` runs in `manage.py shell`
    before the server starts (so no cache of the server's holds what it changes)."""
    workdir = Path(tempfile.mkdtemp(prefix="chatsite-db-"))
    try:
        database_url = migrated_sqlite(workdir)
        if setup:
            manage_shell(database_url, setup)
        with running_chatsite(database_url=database_url, **env) as base:
            yield base, database_url
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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

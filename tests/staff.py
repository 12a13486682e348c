"""Staff on a real server: a SQLite database prepared by a script, and the admin used over real
HTTP with its CSRF token, as a person's browser would."""

from __future__ import annotations

import contextlib
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.servers import ROOT, base_env, migrated_sqlite, running_chatsite

STAFF_PASSWORD = "staff-pass-0123456789"

# Users every admin test needs; `perms` are "app_label.codename" strings.
MAKE_USER = """
from django.contrib.auth.models import Permission, User

def make_user(name, *, staff=False, superuser=False, perms=()):
    user = User.objects.create_user(name, password=PASSWORD, is_staff=staff or superuser,
                                    is_superuser=superuser)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return user
"""


@contextlib.contextmanager
def chatsite_prepared(script: str, **env: str) -> Iterator[tuple[str, Path]]:
    """A real daphne whose fresh database `script` (run by `manage.py shell`, with
    `make_user(name, staff=, superuser=, perms=)` and `PASSWORD` defined) filled first.
    Yields the base URL and the database file, to check what changed."""
    workdir = Path(tempfile.mkdtemp(prefix="chatsite-staff-"))
    try:
        database_url = migrated_sqlite(workdir)
        code = f"PASSWORD = {STAFF_PASSWORD!r}\n{MAKE_USER}\n{script}"
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", code],
            cwd=ROOT,
            env=base_env(DATABASE_URL=database_url),
            check=True,
            capture_output=True,
        )
        with running_chatsite(database_url=database_url, **env) as base:
            yield base, workdir / "db.sqlite3"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def rows(database: Path, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        return list(connection.execute(query, params).fetchall())


def csrf_token(client: httpx.Client, page: str) -> str:
    """GET the page (as a browser would before posting its form) and read the form's token."""
    response = client.get(page)
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', response.text)
    assert match, f"no CSRF token in {page} ({response.status_code})"
    return match.group(1)


def admin_session(base: str, username: str, password: str = STAFF_PASSWORD) -> httpx.Client:
    """A client logged in through the real admin login form."""
    client = httpx.Client(base_url=base, timeout=15)
    token = csrf_token(client, "/admin/login/?next=/admin/")
    response = client.post(
        "/admin/login/?next=/admin/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": token,
            "next": "/admin/",
        },
    )
    assert response.status_code == 302, response.text[:2000]
    return client


def action_choices(page: str) -> list[str]:
    """The values offered in a change list's "Action" menu (empty: no menu at all)."""
    select = re.search(r'<select name="action"[^>]*>(.*?)</select>', page, re.S)
    if select is None:
        return []
    return [v for v in re.findall(r'<option value="([^"]*)"', select.group(1)) if v]

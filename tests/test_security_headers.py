"""Deployment hardening: `manage.py check --deploy` is clean, and every page sends the headers.

The browser test (tests/browser/test_xss.py) checks the same headers on the real page under
daphne; these run without a browser, on every HTML response the site has.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from typing import Any

import pytest
from django.test import Client

from tests.servers import ROOT

PRODUCTION = {
    "DJANGO_DEBUG": "0",
    "DJANGO_SECURE": "1",
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(60),
    "DJANGO_ALLOWED_HOSTS": "chat.example.com",
}


def check_deploy(**env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CHAT_", "REDIS"))
    }
    environment.update(DJANGO_SETTINGS_MODULE="chatsite.settings", **env)
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_with_production_settings() -> None:
    result = check_deploy(**PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    # Only the http → https redirect is left to the TLS proxy (the reason is in settings.py).
    assert "no issues (1 silenced)" in result.stdout


def test_check_deploy_silences_nothing_when_django_redirects_itself() -> None:
    result = check_deploy(**PRODUCTION, DJANGO_SSL_REDIRECT="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues (0 silenced)" in result.stdout


def test_check_deploy_would_catch_plain_http_cookies() -> None:
    # The control: the check really runs against our settings and fails on a weak one.
    result = check_deploy(**{**PRODUCTION, "DJANGO_SECURE": "0"})
    assert result.returncode != 0
    for check in ("security.W004", "security.W012", "security.W016"):  # HSTS, two cookies
        assert check in result.stdout + result.stderr


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/", "/accounts/login/", "/accounts/signup/", "/admin/login/"])
def test_every_page_sends_the_security_headers(path: str, owner: Any) -> None:
    client = Client()
    client.force_login(owner)
    response = client.get(path, follow=True)
    assert response.status_code == 200
    csp = response["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1]
    assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"


@pytest.mark.django_db
def test_the_session_and_csrf_cookies_are_httponly_or_samesite(owner: Any) -> None:
    client = Client()
    client.get("/accounts/login/")
    response = client.post(
        "/accounts/login/", {"username": "owner", "password": "owner-pass-123456"}
    )
    assert response.status_code == 302
    session = response.cookies["sessionid"]
    assert session["httponly"] and session["samesite"] == "Lax"
    assert client.cookies["csrftoken"]["samesite"] == "Lax"

"""What the admin says, as a new admin reads it: chatsite's own names, the limits a plan puts
in force, what users are offered to pick, a tier test's answer as text, which answers had their
model picked. Each page is read as a superuser and as a view-only staff user."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

pytestmark = pytest.mark.django_db


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def superuser(django_user_model: Any) -> Client:
    return logged_in(django_user_model.objects.create_superuser("boss", password="pw-0123456789"))


@pytest.fixture
def viewer(django_user_model: Any) -> Client:
    """Staff who may view everything in the admin and change nothing."""
    user = django_user_model.objects.create_user("viewer", password="pw-0123456789", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__startswith="view_"))
    return logged_in(user)


@pytest.fixture(params=["superuser", "viewer"])
def staff(request: pytest.FixtureRequest) -> Client:
    client: Client = request.getfixturevalue(request.param)
    return client


def text_of(html: str) -> str:
    """The page's words as a person reads them: tags gone, entities decoded, spaces folded."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def test_the_admin_is_chatsites_not_djangos(staff: Client) -> None:
    page = staff.get("/admin/").content.decode()
    assert "Django administration" not in page and "Django site admin" not in page
    assert re.search(r'<div id="site-name"><a href="/admin/">chatsite admin</a></div>', page)
    title = re.search(r"<title>(.*?)</title>", page, re.S)
    assert title and title.group(1).strip() == "Plans, usage, models and chats | chatsite admin"
    assert "<h1>Plans, usage, models and chats</h1>" in page
    # And before logging in.
    login = Client().get("/admin/login/").content.decode()
    assert "chatsite admin" in login and "Django" not in text_of(login)

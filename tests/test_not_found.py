"""A link to a conversation that is not there (deleted, another account's, a stale bookmark),
and any unknown address: the app's own 404 page with the way back, not Django's technical
page (a new user met that after `make run`, whose DEBUG shows it for an uncaught 404)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client

from chat.models import Conversation

pytestmark = pytest.mark.django_db


def test_a_deleted_or_foreign_conversation_link_gets_the_apps_404_page_even_under_debug(
    settings: Any, owner: Any, other_user: Any
) -> None:
    settings.DEBUG = True
    foreign = Conversation.objects.create(user=other_user, title="Not yours")
    client = Client()
    client.force_login(owner)
    for conversation_id in (uuid.uuid4(), foreign.id):
        response = client.get(f"/c/{conversation_id}/")
        assert response.status_code == 404
        body = response.content.decode()
        assert "This conversation is not here" in body
        assert 'href="/"' in body and "Start a new chat" in body
        assert "Not yours" not in body and "URLconf" not in body
        assert "<style" not in body  # the CSP forbids inline styles (the debug page has them)


def test_an_unknown_address_gets_the_apps_404_page(settings: Any, owner: Any) -> None:
    settings.DEBUG = False
    client = Client()
    response = client.get("/no/such/page/")
    assert response.status_code == 404
    body = response.content.decode()
    assert "Page not found" in body and "/accounts/login/" in body  # the way in, signed out
    client.force_login(owner)
    body = client.get("/no/such/page/").content.decode()
    assert "Page not found" in body and "Start a new chat" in body

"""The socket's session check (chat/sessions.py), which runs before every prompt: each way a
session stops being the user's fails it, in one statement (written out, not compiled by the
ORM per prompt: docs/decisions/performance.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.sessions.models import Session
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chat.sessions import session_is_valid
from tests.conftest import session_key_for

pytestmark = pytest.mark.django_db


def test_a_live_session_of_an_active_user_is_valid_in_one_statement(owner: Any) -> None:
    key = session_key_for(owner)
    with CaptureQueriesContext(connection) as queries:
        assert session_is_valid(owner.pk, key)
    assert len(queries) == 1


def test_another_users_session_or_none_is_not(owner: Any, other_user: Any) -> None:
    key = session_key_for(owner)
    assert not session_is_valid(other_user.pk, key)
    assert not session_is_valid(owner.pk, None)
    assert not session_is_valid(owner.pk, "no-such-session-key")


def test_an_expired_session_is_not(owner: Any) -> None:
    key = session_key_for(owner)
    Session.objects.filter(session_key=key).update(
        expire_date=timezone.now() - timedelta(seconds=1)
    )
    assert not session_is_valid(owner.pk, key)


def test_a_deactivated_users_session_is_not(owner: Any) -> None:
    key = session_key_for(owner)
    owner.is_active = False
    owner.save(update_fields=["is_active"])
    assert not session_is_valid(owner.pk, key)


def test_a_session_made_before_a_password_change_is_not(owner: Any) -> None:
    key = session_key_for(owner)
    owner.set_password("a-new-passphrase-987654")
    owner.save(update_fields=["password"])
    assert not session_is_valid(owner.pk, key)
    assert session_is_valid(owner.pk, session_key_for(owner))  # a new login is

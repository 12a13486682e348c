"""The socket's session, checked again after connect: alive, its user active, and made with the
user's current password (the session auth hash)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.models import Session
from django.db import connection
from django.utils import timezone
from django.utils.crypto import constant_time_compare


def session_is_valid(user_id: int, session_key: str | None) -> bool:
    """Is the socket's session still this user's: alive, its user active, and made with the
    user's current password? Checked before every prompt, resume and delivered exchange.

    The socket's user was resolved once, at connect (PITFALLS): a session logged out, expired
    or of a deactivated user fails here, and so does one whose password changed since it was
    made — the session auth hash, verified as django.contrib.auth.get_user does (with the
    fallback secrets), so a stolen session stops working on sockets as it does on pages.
    """
    if session_key is None:
        return False
    user_model = get_user_model()
    store = import_module(settings.SESSION_ENGINE).SessionStore
    if settings.SESSION_ENGINE == "django.contrib.sessions.backends.db":
        # One statement for both (this runs before every prompt): the session row, unexpired,
        # and its user's password if the user is still active.
        with connection.cursor() as cursor:
            cursor.execute(
                _session_sql(),
                (
                    user_id,
                    True,
                    session_key,
                    connection.ops.adapt_datetimefield_value(timezone.now()),
                ),
            )
            row = cursor.fetchone()
        if row is None or row[1] is None:
            return False
        data = store().decode(row[0])
        user = user_model(pk=user_id, password=row[1])
    else:
        found = user_model.objects.filter(pk=user_id, is_active=True).only("password").first()
        if found is None:
            return False
        user, data = found, store(session_key).load()
    return _hash_verifies(data, user, user_id)


_SESSION_SQL: dict[str, str] = {}


def _session_sql() -> str:
    """The session check's statement, written out once per database vendor.

    Built by the ORM (filter, annotate, Subquery) it took ~1 ms of the ORM thread per prompt
    to compile, ~40x what SQLite takes to run it (docs/decisions/performance.md, issue 18);
    the tables and columns still come from the models.
    """
    sql = _SESSION_SQL.get(connection.vendor)
    if sql is None:
        quote = connection.ops.quote_name

        def q(name: str | None) -> str:  # a concrete field always has its column
            return quote(name or "")

        user = get_user_model()._meta
        session = Session._meta
        sql = _SESSION_SQL[connection.vendor] = (
            f"SELECT s.{q(session.get_field('session_data').column)}, "
            f"(SELECT u.{q(user.get_field('password').column)} FROM {q(user.db_table)} u "
            f"WHERE u.{q(user.pk.column)} = %s AND u.{q(user.get_field('is_active').column)} = %s) "
            f"FROM {q(session.db_table)} s "
            f"WHERE s.{q(session.get_field('session_key').column)} = %s "
            f"AND s.{q(session.get_field('expire_date').column)} > %s"
        )
    return sql


def _hash_verifies(data: dict[str, Any], user: Any, user_id: int) -> bool:
    if str(data.get(SESSION_KEY)) != str(user_id):
        return False
    session_hash = data.get(HASH_SESSION_KEY)
    if not isinstance(session_hash, str) or not session_hash:
        return False
    if constant_time_compare(session_hash, user.get_session_auth_hash()):
        return True
    return any(
        constant_time_compare(session_hash, fallback)
        for fallback in user.get_session_auth_fallback_hash()
    )

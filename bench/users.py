"""Benchmark users: many accounts and their logged-in sessions, written straight to a database.

Signing up 500 users through the form costs minutes of password hashing, which is not what the
benchmarks measure; one user with 500 tabs is not realistic either (every prompt is announced
to all of that user's tabs). So the load gets one user per socket, made here:

    python -m bench.users DATABASE_URL COUNT PREFIX   # prints {"sessionid": [...]} as JSON
"""

from __future__ import annotations

import json
import os
import sys
from importlib import import_module


def create(count: int, prefix: str) -> list[str]:
    """`count` users with unusable passwords, each with one session; returns the session keys."""
    from django.conf import settings
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.contrib.auth.hashers import make_password

    user_model = get_user_model()
    user_model.objects.bulk_create(
        user_model(username=f"{prefix}{i}", password=make_password(None)) for i in range(count)
    )
    store = import_module(settings.SESSION_ENGINE).SessionStore
    keys = []
    users = user_model.objects.filter(username__startswith=prefix).order_by("pk")
    for user in users:
        session = store()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        keys.append(session.session_key)
    return keys


def main() -> None:
    database_url, count, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    os.environ.setdefault("DJANGO_DEBUG", "1")  # a script needs no secret key
    import django

    django.setup()
    print(json.dumps({"sessionid": create(count, prefix)}))


if __name__ == "__main__":
    main()

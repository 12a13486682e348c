"""What deploy/cluster.sh checks while it starts: Redis answers, the database exists, daphne is up.

Run from the repository root with the project's Python, one check per call:

    python deploy/cluster_checks.py redis            # REDIS_URL (or its primary) answers PING
    python deploy/cluster_checks.py database         # creates DATABASE_URL's database if missing
    python deploy/cluster_checks.py up 8001 8002     # each port answers /healthz (60 s at most)

Exit status 0 when the check passes; otherwise 1 with the reason on stderr.

The database is read the way chatsite itself reads it (its settings, then Django's PostgreSQL
backend's connection parameters), so what is created here is what the instances connect to:
`postgres:///chatsite` (a libpq URL with no host) means libpq's defaults — `PGHOST`, `PGUSER`,
… or the local Unix socket — exactly as it does for the app.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HEALTH_TIMEOUT_SECONDS = 60.0


def fail(message: str) -> int:
    print(f"[cluster] error: {message}", file=sys.stderr)
    return 1


def check_redis() -> int:
    """PING the server of REDIS_URL, or the primary its sentinels name (as the instances do)."""
    import redis
    from redis.sentinel import Sentinel

    sys.path.insert(0, str(ROOT))
    from chat.redis_clients import RedisURLError, check_redis_url, sentinel_target

    url = os.environ["REDIS_URL"]
    try:
        check_redis_url(url)
        target = sentinel_target(
            url,
            username=os.environ.get("REDIS_SENTINEL_USERNAME", ""),
            password=os.environ.get("REDIS_SENTINEL_PASSWORD", ""),
        )
    except RedisURLError as exc:
        return fail(f"REDIS_URL: {exc}")
    try:
        if target is None:
            redis.Redis.from_url(url, socket_connect_timeout=2).ping()
        else:
            sentinel = Sentinel(target.sentinels, sentinel_kwargs=target.sentinel_options(2))
            primary = sentinel.master_for(
                target.primary, socket_connect_timeout=2, **target.server_options()
            )
            primary.ping()
    except (redis.RedisError, OSError) as exc:
        if target is not None:
            return fail(f"no Redis primary through the sentinels ({exc})")
        return fail(f"Redis does not answer ({exc}); start it: redis-server --daemonize yes")
    return 0


def database_parameters() -> dict[str, Any] | None:
    """libpq parameters of chatsite's database, as Django would connect; None if not PostgreSQL."""
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    from django.db import connections

    connection = connections["default"]
    if connection.vendor != "postgresql":
        return None
    params: dict[str, Any] = connection.get_connection_params()
    return params


def describe(params: dict[str, Any]) -> str:
    """Where the database is, for the log: never the password."""
    host = params.get("host") or os.environ.get("PGHOST") or "the local socket"
    port = params.get("port") or os.environ.get("PGPORT") or 5432
    user = params.get("user") or os.environ.get("PGUSER") or "the login user"
    return f"{params.get('dbname')!r} on {host} (port {port}) as {user}"


def ensure_database() -> int:
    import psycopg
    from django.core.exceptions import ImproperlyConfigured
    from psycopg import sql

    try:
        params = database_parameters()
    except ImproperlyConfigured as exc:
        return fail(f"DATABASE_URL: {exc}")
    if params is None:
        return 0  # SQLite: migrate creates the file
    name = params.get("dbname")
    if not name:
        print(
            "[cluster] DATABASE_URL names its database through a service file; not creating it",
            file=sys.stderr,
        )
        return 0
    print(f"[cluster] making sure the database {describe(params)} exists", file=sys.stderr)
    # The server's maintenance database, with everything else (host, port, user, password,
    # sslmode, …) as chatsite will use it.
    admin = {**params, "dbname": "postgres"}
    try:
        with psycopg.connect(**admin, autocommit=True, connect_timeout=5) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                print(f"[cluster] created database {name}", file=sys.stderr)
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return fail(f"cannot reach or create the database {describe(params)}: {reason}")
    return 0


def wait_until_up(ports: list[str]) -> int:
    import httpx

    deadline = time.monotonic() + HEALTH_TIMEOUT_SECONDS
    for port in ports:
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1, trust_env=False)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    return fail(
                        f"nothing answers on port {port} after {HEALTH_TIMEOUT_SECONDS:.0f} s"
                    )
                time.sleep(0.1)
    return 0


def main(argv: list[str]) -> int:
    match argv:
        case ["redis"]:
            return check_redis()
        case ["database"]:
            return ensure_database()
        case ["up", *ports] if ports and all(port.isdigit() for port in ports):
            return wait_until_up(ports)
    return fail(f"usage: {Path(__file__).name} redis | database | up PORT...")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

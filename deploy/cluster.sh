#!/usr/bin/env bash
# `make cluster`: the production topology on one machine, in the foreground until Ctrl-C.
#
#   nginx 127.0.0.1:$CLUSTER_PORT (8080) ─┬─▶ daphne web1 127.0.0.1:$WEB1_PORT (8001) ─┬─▶ Redis
#                                         └─▶ daphne web2 127.0.0.1:$WEB2_PORT (8002) ─┴─▶ PostgreSQL
#
# Environment (all optional):
#   REDIS_URL        default redis://127.0.0.1:6379/0 (must be running)
#   DATABASE_URL     default postgres://postgres@127.0.0.1:5432/chatsite (created if missing)
#   CLUSTER_PORT     nginx's port, default 8080; WEB1_PORT / WEB2_PORT default 8001 / 8002
#   CLUSTER_RUN_DIR  where configs, logs and pid files go (default: a new temporary directory,
#                    removed on exit; a given one is kept)
#   anything chatsite reads (CHAT_*, LLM_*, DEMO_*, DJANGO_*) is passed to both instances.
#
# Ctrl-C or SIGTERM stops everything this script started: the daphne instances first get
# SIGTERM and drain their running answers (CHAT_SHUTDOWN_GRACE), nginx stops gracefully.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
DAPHNE="$(dirname "$PYTHON")/daphne"

CLUSTER_PORT="${CLUSTER_PORT:-8080}"
WEB1_PORT="${WEB1_PORT:-8001}"
WEB2_PORT="${WEB2_PORT:-8002}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/chatsite}"
# Production settings, but plain http on the loopback: no secure-only cookies.
export DJANGO_DEBUG="${DJANGO_DEBUG:-0}"
export DJANGO_SECURE="${DJANGO_SECURE:-0}"
export DJANGO_ALLOWED_HOSTS="${DJANGO_ALLOWED_HOSTS:-127.0.0.1,localhost}"
export DJANGO_STATIC_MANIFEST=1
export DJANGO_STATIC_ROOT="${DJANGO_STATIC_ROOT:-$ROOT/staticfiles}"
# Both instances must sign sessions with the same key; one made up per run unless given.
if [ -z "${DJANGO_SECRET_KEY:-}" ]; then
  DJANGO_SECRET_KEY="$("$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(50))')"
fi
export DJANGO_SECRET_KEY

if [ -n "${CLUSTER_RUN_DIR:-}" ]; then
  RUN_DIR="$CLUSTER_RUN_DIR"
  KEEP_RUN_DIR=1
  mkdir -p "$RUN_DIR"
else
  RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/chatsite-cluster.XXXXXX")"
  KEEP_RUN_DIR=0
fi
chmod 755 "$RUN_DIR"  # nginx's workers (an unprivileged user under root) write temp files here

say() { printf '[cluster] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# --- what the topology needs --------------------------------------------------------------------

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  say "nginx is missing; installing it from Debian"
  if [ "$(id -u)" -ne 0 ]; then die "run as root or install nginx (apt-get install nginx-light)"; fi
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light \
    || DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"

say "checking Redis at $REDIS_URL"
"$PYTHON" - <<'EOF' || die "Redis does not answer at $REDIS_URL (start it: redis-server --daemonize yes)"
import os, redis
redis.Redis.from_url(os.environ["REDIS_URL"], socket_connect_timeout=2).ping()
EOF

case "$DATABASE_URL" in
  postgres://*|postgresql://*|pgsql://*)
    say "making sure the database of $DATABASE_URL exists"
    "$PYTHON" - <<'EOF' || die "cannot reach or create the PostgreSQL database of $DATABASE_URL"
import os
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

url = urlsplit(os.environ["DATABASE_URL"])
name = url.path.lstrip("/")
# Connect to the server's maintenance database to create ours.
admin = urlunsplit(("postgresql", url.netloc, "/postgres", url.query, ""))
with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
    if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        print(f"[cluster] created database {name}")
EOF
    ;;
esac

say "migrating"
"$PYTHON" manage.py migrate --noinput -v 0
say "collecting static files into $DJANGO_STATIC_ROOT"
"$PYTHON" manage.py collectstatic --noinput -v 0

# --- start everything; stop everything on the way out ------------------------------------------

PIDS=()
STOPPING=0

stop_all() {
  [ "$STOPPING" = 1 ] && return
  STOPPING=1
  say "stopping (daphne instances drain their running answers first)"
  if [ -f "$RUN_DIR/web1.pid" ]; then kill -TERM "$(cat "$RUN_DIR/web1.pid")" 2>/dev/null || true; fi
  if [ -f "$RUN_DIR/web2.pid" ]; then kill -TERM "$(cat "$RUN_DIR/web2.pid")" 2>/dev/null || true; fi
  if [ -f "$RUN_DIR/nginx.pid" ]; then kill -QUIT "$(cat "$RUN_DIR/nginx.pid")" 2>/dev/null || true; fi
  # The drain lasts at most CHAT_SHUTDOWN_GRACE (20 s) plus the turns' own cleanup.
  local deadline=$((SECONDS + ${CHAT_SHUTDOWN_GRACE_WAIT:-40}))
  for pid in "${PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      say "process $pid did not stop in time; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  wait 2>/dev/null || true
  if [ "$KEEP_RUN_DIR" = 0 ]; then rm -rf "$RUN_DIR"; fi
  say "stopped"
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap 'stop_all' EXIT

start_instance() {
  local name="$1" port="$2"
  # --proxy-headers: the client's address from nginx's X-Forwarded-For (which nginx
  # overwrites), for the /metrics allow-list and per-address limits.
  # setsid: Ctrl-C in the terminal reaches only this script, which stops the instances in
  # order (a graceful drain each); the log prefixer ignores it so the drain's lines still show.
  CHAT_INSTANCE_ID="$name" PORT="$port" \
    setsid "$DAPHNE" -b 127.0.0.1 -p "$port" --proxy-headers chatsite.asgi:application \
    > >(trap '' INT TERM; sed -u "s/^/[$name] /" | tee -a "$RUN_DIR/$name.log") 2>&1 &
  PIDS+=("$!")
  echo "$!" > "$RUN_DIR/$name.pid"
}

start_instance web1 "$WEB1_PORT"
start_instance web2 "$WEB2_PORT"

say "waiting for web1 (:$WEB1_PORT) and web2 (:$WEB2_PORT)"
"$PYTHON" - "$WEB1_PORT" "$WEB2_PORT" <<'EOF' || die "the daphne instances did not come up"
import sys, time
import httpx

deadline = time.monotonic() + 60
for port in sys.argv[1:]:
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1, trust_env=False)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                sys.exit(1)
            time.sleep(0.1)
EOF

# The shipped config, with this run's ports, paths and logs.
sed -e "s#127\.0\.0\.1:8080;#127.0.0.1:$CLUSTER_PORT;#" \
    -e "s#127\.0\.0\.1:8001 #127.0.0.1:$WEB1_PORT #" \
    -e "s#127\.0\.0\.1:8002 #127.0.0.1:$WEB2_PORT #" \
    -e "s#/srv/chatsite/staticfiles/#$DJANGO_STATIC_ROOT/#" \
    -e "s#/run/nginx-chatsite\.pid#$RUN_DIR/nginx.pid#" \
    -e "s#/var/log/nginx/chatsite\.error\.log#$RUN_DIR/nginx-error.log#" \
    -e "s#/var/log/nginx/chatsite\.access\.log#$RUN_DIR/nginx-access.log#" \
    -e "/worker_rlimit_nofile/d" \
    -e "s#^http {#http {\n    client_body_temp_path $RUN_DIR/nginx-body;\n    proxy_temp_path $RUN_DIR/nginx-proxy;#" \
    deploy/nginx.conf > "$RUN_DIR/nginx.conf"
for expected in "127.0.0.1:$CLUSTER_PORT;" "127.0.0.1:$WEB1_PORT " "127.0.0.1:$WEB2_PORT " \
                "$DJANGO_STATIC_ROOT/" "$RUN_DIR/nginx.pid"; do
  grep -qF "$expected" "$RUN_DIR/nginx.conf" || die "deploy/nginx.conf changed: cannot set $expected"
done
"$NGINX" -t -q -p "$RUN_DIR/" -c "$RUN_DIR/nginx.conf" || die "nginx refuses the rendered config"
setsid "$NGINX" -p "$RUN_DIR/" -c "$RUN_DIR/nginx.conf" -g "daemon off;" &
PIDS+=("$!")
NGINX_PID="$!"

for _ in $(seq 100); do [ -s "$RUN_DIR/nginx.pid" ] && break; sleep 0.05; done
say "chatsite on http://127.0.0.1:$CLUSTER_PORT/ — nginx → web1 :$WEB1_PORT, web2 :$WEB2_PORT"
say "Redis $REDIS_URL, database $DATABASE_URL; logs in $RUN_DIR; Ctrl-C stops it"

# Until a signal arrives. An instance that dies leaves the other serving (as in production,
# where a supervisor would restart it); nginx dying, or both instances, ends the cluster.
declare -A NAMES=(["$NGINX_PID"]=nginx ["$(cat "$RUN_DIR/web1.pid")"]=web1 ["$(cat "$RUN_DIR/web2.pid")"]=web2)
alive=("${PIDS[@]}")
while [ "${#alive[@]}" -gt 0 ]; do
  set +e
  wait -n -p exited "${alive[@]}"
  status=$?
  set -e
  [ -n "${exited:-}" ] || continue
  name="${NAMES[$exited]:-$exited}"
  say "$name exited (status $status)"
  remaining=()
  for pid in "${alive[@]}"; do [ "$pid" != "$exited" ] && remaining+=("$pid"); done
  alive=("${remaining[@]}")
  if [ "$name" = nginx ] || [ "${#alive[@]}" -le 1 ]; then
    say "the cluster cannot serve any more; stopping the rest"
    exit 1
  fi
done

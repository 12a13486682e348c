#!/usr/bin/env bash
# `make cluster`: the production topology on one machine, in the foreground until stopped.
#
#   nginx 127.0.0.1:$CLUSTER_PORT (8080) ─┬─▶ daphne web1 127.0.0.1:$WEB1_PORT (8001) ─┬─▶ Redis
#                                         └─▶ daphne web2 127.0.0.1:$WEB2_PORT (8002) ─┴─▶ PostgreSQL
#
# Environment (all optional):
#   REDIS_URL        default redis://127.0.0.1:6379/0 (must be running)
#   DATABASE_URL     default postgres://postgres@127.0.0.1:5432/chatsite (created if missing;
#                    read as chatsite reads it, so postgres:///chatsite means libpq's defaults)
#   CLUSTER_PORT     nginx's port, default 8080; WEB1_PORT / WEB2_PORT default 8001 / 8002
#   CLUSTER_RUN_DIR  where configs, logs and pid files go (default: a new temporary directory,
#                    removed on exit; a given one is kept)
#   CLUSTER_STOP_SECONDS  how long a stop may take before what is left is killed
#                    (default: CHAT_SHUTDOWN_GRACE + 15 s)
#   anything chatsite reads (CHAT_*, LLM_*, DEMO_*, DJANGO_*) is passed to both instances.
#
# Stopping. Any of INT, TERM, HUP or QUIT — sent to this script or to its whole process group,
# once or many times — stops everything it started: the daphne instances get SIGTERM and drain
# their running answers (CHAT_SHUTDOWN_GRACE), nginx gets SIGQUIT and stops gracefully, and
# whatever is still running CLUSTER_STOP_SECONDS later is killed. The script exits only when all
# of it is gone. If the script itself is killed (SIGKILL), the kernel stops its children for it:
# each runs under `setpriv --pdeathsig` (see spawn below). docs/deployment.md explains why a
# stop used to leave web2 and nginx running.
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
# A URL for the log, without its password.
redact() { printf '%s' "$1" | sed -E 's#^([A-Za-z0-9+.-]+://[^:/@]*):[^/@]*@#\1:***@#'; }

# --- stopping: one path, whatever signal arrives and however often ------------------------------
#
# Why it is built this way (docs/deployment.md, "Stopping make cluster"): the children run in
# sessions of their own, so only this script can stop them; a second signal that arrived while
# the old trap was stopping them re-entered the trap, whose `exit` ended the script before it had
# signalled web2 and nginx, and they ran on with nobody left to stop them. Now a signal only
# starts the stop; signals during the stop change nothing; the stop is bounded; and the script
# exits only when everything it started is gone.

SCRIPT_PID=$$
STOPPING=0
STEP_PID=""        # a startup step, run in the background so that a signal is handled at once
CHILDREN=()        # daphne instances and nginx: each leads a process group of its own
RELAYS=()          # the log relays of the daphne instances (in this script's process group)
declare -A NAMES=()
NGINX_PID=""

grace="${CHAT_SHUTDOWN_GRACE:-20}"
grace="${grace%%.*}"
[[ "$grace" =~ ^[0-9]+$ ]] || grace=20
# daphne needs the grace, then ~7 s more (sockets flush their close: 2 s, services: 5 s).
STOP_SECONDS="${CLUSTER_STOP_SECONDS:-$((grace + 15))}"
[[ "$STOP_SECONDS" =~ ^[0-9]+$ ]] || die "CLUSTER_STOP_SECONDS must be a whole number of seconds"

# A pipe that nobody writes to: `read -t` on it is a sleep that needs no process of its own
# (an external `sleep` is one more thing a signal to our process group would hit).
rm -f "$RUN_DIR/nap"
mkfifo "$RUN_DIR/nap"
exec {NAP_FD}<>"$RUN_DIR/nap"
nap() { read -r -t "$1" -u "$NAP_FD" _ || true; }

group_alive() { kill -0 -- "-$1" 2>/dev/null; }

on_signal() {  # on_signal NAME STATUS
  if [ "$STOPPING" = 1 ]; then
    return 0  # already stopping: the stop goes on to its end (it is bounded)
  fi
  say "$1 received"
  exit "$2"  # runs stop_all (the EXIT trap)
}

stop_all() {
  local status=$?
  STOPPING=1
  set +eu
  trap '' PIPE  # a reader of our output that went away must not end the stop half-way
  if [ -n "$STEP_PID" ]; then kill -TERM "$STEP_PID" 2>/dev/null; fi
  if [ "${#CHILDREN[@]}" -gt 0 ]; then
    say "stopping (daphne instances drain their running answers first; at most ${STOP_SECONDS} s)"
    local pid
    for pid in "${CHILDREN[@]}"; do
      if [ "$pid" = "$NGINX_PID" ]; then
        kill -QUIT "$pid" 2>/dev/null  # nginx's master: graceful, it stops its workers itself
      else
        kill -TERM -- "-$pid" 2>/dev/null
      fi
    done
    local deadline=$((SECONDS + STOP_SECONDS)) left instances_gone_at=""
    while :; do
      left=()
      for pid in "${CHILDREN[@]}"; do group_alive "$pid" && left+=("$pid"); done
      [ "${#left[@]}" -gt 0 ] || break
      if [ "$SECONDS" -ge "$deadline" ]; then
        for pid in "${left[@]}"; do
          say "${NAMES[$pid]:-$pid} did not stop in ${STOP_SECONDS} s; killing it"
          kill -KILL -- "-$pid" 2>/dev/null
        done
        break
      fi
      # nginx waits for its open connections; once no instance is left, none will finish.
      if [ "${left[*]}" = "$NGINX_PID" ]; then
        if [ -z "$instances_gone_at" ]; then
          instances_gone_at=$SECONDS
        elif [ $((SECONDS - instances_gone_at)) -ge 3 ]; then
          kill -TERM "$NGINX_PID" 2>/dev/null
        fi
      fi
      nap 0.1
    done
  fi
  if [ -n "$STEP_PID" ]; then kill -KILL "$STEP_PID" 2>/dev/null; fi
  # Until everything is gone (bash reaps its children as they end): the relays end when
  # daphne's side of their pipe closes; one still stuck writing to our output after 5 s is
  # killed. No bare `wait`: it could wait for ever.
  local reap_deadline=$((SECONDS + 5)) pid busy
  while :; do
    busy=0
    for pid in "${CHILDREN[@]}"; do group_alive "$pid" && busy=1; done
    for pid in "${RELAYS[@]}"; do kill -0 "$pid" 2>/dev/null && busy=1; done
    [ "$busy" = 1 ] && [ "$SECONDS" -lt "$reap_deadline" ] || break
    nap 0.1
  done
  for pid in "${RELAYS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  if [ "$KEEP_RUN_DIR" = 0 ]; then rm -rf "$RUN_DIR"; else rm -f "$RUN_DIR"/*.out "$RUN_DIR/nap"; fi
  [ "${#CHILDREN[@]}" -eq 0 ] || say "stopped"
  return "$status"
}
trap 'on_signal SIGINT 130' INT
trap 'on_signal SIGTERM 143' TERM
trap 'on_signal SIGHUP 129' HUP
trap 'on_signal SIGQUIT 131' QUIT
trap 'stop_all' EXIT

step() {  # step COMMAND...: a startup step, in the background so that `wait` can be interrupted
  "$@" &
  STEP_PID=$!
  local status=0
  wait "$STEP_PID" || status=$?
  STEP_PID=""
  return "$status"
}

spawn() {  # spawn DEATHSIG COMMAND...: run as a background job; becomes COMMAND, same pid
  local deathsig="$1"
  shift
  exec {NAP_FD}<&-
  # setsid: a session and process group of its own. Ctrl-C in a terminal, or a signal sent to
  # this script's process group, reaches only this script, which stops the children in order
  # (the daphne instances drain first). setsid(1) does not fork here — a background job of a
  # non-interactive shell is not a group leader — so $! is the child's pid and its group's id.
  # setpriv --pdeathsig: the kernel sends DEATHSIG to the child when this script dies, however
  # it dies (SIGKILL included). The PPID check closes the window in which this script died
  # before the death signal was set.
  exec setsid setpriv --pdeathsig "$deathsig" -- "$BASH" -c \
    '[ "$PPID" = "$1" ] || exit 70; shift; exec "$@"' cluster-child "$SCRIPT_PID" "$@"
}

relay() {  # relay NAME: stdin, each line prefixed with [NAME], to our output and NAME.log
  # One process (sed writes the log file itself), deaf to the signals that stop the cluster so
  # that the drain's last lines still show; it ends when daphne's side of the pipe closes
  # (daphne exited or was killed).
  trap '' INT TERM HUP QUIT
  exec {NAP_FD}<&-
  exec sed -u -e "s/^/[$1] /" -e "w $RUN_DIR/$1.log"
}

# --- what the topology needs --------------------------------------------------------------------

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  say "nginx is missing; installing it from Debian"
  if [ "$(id -u)" -ne 0 ]; then die "run as root or install nginx (apt-get install nginx-light)"; fi
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light \
    || DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
command -v setpriv >/dev/null 2>&1 || die "setpriv is missing (it comes with util-linux)"

for port in "$CLUSTER_PORT" "$WEB1_PORT" "$WEB2_PORT"; do
  # A cluster left running (or anything else) on our ports would answer in our place.
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "port $port is already in use (see: ss -ltnp 'sport = :$port')"
  fi
done

say "checking Redis at $(redact "$REDIS_URL")"
step "$PYTHON" deploy/cluster_checks.py redis || exit 1
step "$PYTHON" deploy/cluster_checks.py database || exit 1
say "migrating"
step "$PYTHON" manage.py migrate --noinput -v 0 || die "migrate failed"
say "collecting static files into $DJANGO_STATIC_ROOT"
step "$PYTHON" manage.py collectstatic --noinput -v 0 || die "collectstatic failed"

# --- start everything ---------------------------------------------------------------------------

start_instance() {
  local name="$1" port="$2" out="$RUN_DIR/$1.out"
  rm -f "$out"
  mkfifo "$out"
  relay "$name" < "$out" &
  RELAYS+=("$!")
  # --proxy-headers: the client's address from nginx's X-Forwarded-For (which nginx
  # overwrites), for the /metrics allow-list and per-address limits. SIGKILL when this script
  # dies: nobody is left to wait for a drain (the answers it was streaming end `failed` when
  # their lease runs out, as for any killed instance).
  CHAT_INSTANCE_ID="$name" PORT="$port" \
    spawn KILL "$DAPHNE" -b 127.0.0.1 -p "$port" --proxy-headers chatsite.asgi:application \
    > "$out" 2>&1 &
  CHILDREN+=("$!")
  NAMES[$!]="$name"
  echo "$!" > "$RUN_DIR/$name.pid"
}

start_instance web1 "$WEB1_PORT"
start_instance web2 "$WEB2_PORT"

say "waiting for web1 (:$WEB1_PORT) and web2 (:$WEB2_PORT)"
step "$PYTHON" deploy/cluster_checks.py up "$WEB1_PORT" "$WEB2_PORT" \
  || die "the daphne instances did not come up"

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
# SIGTERM (not SIGKILL) when this script dies: nginx's workers outlive a killed master and keep
# serving; on SIGTERM the master stops them (and kills them if they linger).
spawn TERM "$NGINX" -p "$RUN_DIR/" -c "$RUN_DIR/nginx.conf" -g "daemon off;" &
NGINX_PID=$!
CHILDREN+=("$NGINX_PID")
NAMES[$NGINX_PID]=nginx

for _ in $(seq 100); do [ -s "$RUN_DIR/nginx.pid" ] && break; nap 0.05; done
say "chatsite on http://127.0.0.1:$CLUSTER_PORT/ — nginx → web1 :$WEB1_PORT, web2 :$WEB2_PORT"
say "Redis $(redact "$REDIS_URL"); logs in $RUN_DIR; Ctrl-C stops it"

# Until a signal arrives. An instance that dies leaves the other serving (as in production,
# where a supervisor would restart it); nginx dying, or both instances, ends the cluster.
alive=("${CHILDREN[@]}")
while [ "${#alive[@]}" -gt 0 ]; do
  exited=""
  status=0
  wait -n -p exited "${alive[@]}" || status=$?
  [ -n "$exited" ] || continue
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

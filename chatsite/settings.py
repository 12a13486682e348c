"""Django settings for chatsite: every value comes from the environment (docs/configuration.md)."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from limits import parse_many

from chat.redis_clients import RedisURLError, channel_layer_host, check_redis_url
from chatsite.env import envbool, envchoice, envfloat, envint, envlist, envstr

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = envbool("DJANGO_DEBUG", False)
SECRET_KEY = envstr("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is required when DJANGO_DEBUG is off "
            "(make run sets DJANGO_DEBUG=1 for local use)."
        )
    SECRET_KEY = "insecure-local-development-key-only-used-with-DJANGO_DEBUG"

ALLOWED_HOSTS = envlist("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
if "*" in ALLOWED_HOSTS and not DEBUG:
    # The websocket origin check (chat/middleware.py: OriginValidator) trusts a Host only if
    # it is in ALLOWED_HOSTS: '*' would let a rebound DNS name open sockets with the user's
    # cookie (cross-site websocket hijacking), so production refuses it.
    raise ImproperlyConfigured("DJANGO_ALLOWED_HOSTS='*' is refused when DJANGO_DEBUG is off.")
CSRF_TRUSTED_ORIGINS = envlist("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "chat.apps.ChatAdminConfig",  # django.contrib.admin, with our admin site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "chat",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "chat.middleware.ContentSecurityPolicyMiddleware",
    # Before anything reads the session cookie or the database: NUL is refused at the edge.
    "chat.middleware.NulInputMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # request.htmx; django-htmx is not an installed app: we vendor htmx ourselves (scripts/).
    "django_htmx.middleware.HtmxMiddleware",
    "chat.middleware.DeviceTierMiddleware",
    "chat.middleware.RateLimitMiddleware",
]

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(envstr("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"))
}
_db = DATABASES["default"]
_db.setdefault("OPTIONS", {})
# Under ASGI all ORM work runs on one thread (Channels' and Django's thread-sensitive
# sync_to_async): opening a connection per call was most of that thread's time under load, so
# connections are kept — a pool for PostgreSQL (psycopg 3), a persistent one for SQLite.
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the chat page read while a turn writes its checkpoint.
    _db["OPTIONS"]["init_command"] = (
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;"
    )
    _db["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
    _db["CONN_MAX_AGE"] = envint("DATABASE_CONN_MAX_AGE", 600, minimum=0)
    _db["CONN_HEALTH_CHECKS"] = True
elif _db["ENGINE"] == "django.db.backends.postgresql" and envbool("DATABASE_POOL", True):
    _db["OPTIONS"]["pool"] = {
        "min_size": 1,
        "max_size": envint("DATABASE_POOL_SIZE", 8, minimum=1),
        "timeout": 10,
    }
    _db["CONN_MAX_AGE"] = 0  # the pool owns the connections
else:
    _db["CONN_MAX_AGE"] = envint("DATABASE_CONN_MAX_AGE", 60, minimum=0)
    _db["CONN_HEALTH_CHECKS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Password reset mails (Django's own views, chat/urls.py): printed on the console unless an
# SMTP server is configured (EMAIL_HOST), as docs/configuration.md says.
EMAIL_HOST = envstr("EMAIL_HOST", "")
EMAIL_BACKEND = envstr(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_PORT = envint("EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = envstr("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = envstr("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", not envbool("EMAIL_USE_SSL", False))
EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = envint("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = envstr("DEFAULT_FROM_EMAIL", "chatsite <noreply@localhost>")
PASSWORD_RESET_TIMEOUT = envint("PASSWORD_RESET_TIMEOUT", 3 * 86400, minimum=60)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(envstr("DJANGO_STATIC_ROOT", str(BASE_DIR / "staticfiles")))
# Hashed names for collectstatic's output, so nginx can cache static files for a year
# (deploy/nginx.conf). Needs `collectstatic` before start; `make cluster` and production set it.
if envbool("DJANGO_STATIC_MANIFEST", False):
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "chatsite.staticfiles.HashedStaticFilesStorage"},
    }

# --- security -----------------------------------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Behind TLS (the production topology) cookies are secure and HSTS is on; `make run` is http.
_behind_tls = envbool("DJANGO_SECURE", not DEBUG)
SESSION_COOKIE_SECURE = _behind_tls
CSRF_COOKIE_SECURE = _behind_tls
SECURE_SSL_REDIRECT = envbool("DJANGO_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = envint("DJANGO_HSTS_SECONDS", 31536000 if _behind_tls else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = _behind_tls
SECURE_HSTS_PRELOAD = _behind_tls
if envbool("DJANGO_BEHIND_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# security.W008 (SECURE_SSL_REDIRECT off) is silenced by default because in the production
# topology the TLS proxy redirects http → https (docs/security.md); set DJANGO_SSL_REDIRECT=1
# where no proxy does, and the check is moot. Nothing else is silenced unless named here.
SILENCED_SYSTEM_CHECKS = envlist(
    "DJANGO_SILENCED_SYSTEM_CHECKS", [] if SECURE_SSL_REDIRECT else ["security.W008"]
)

# --- Redis, channel layer ----------------------------------------------------------------
# One server (redis://, rediss://, unix://) or the primary that Sentinel names
# (redis+sentinel://host:port,host:port/<primary>[/db]): docs/configuration.md. Every client of
# it is made by chat/redis_clients.py, the channel layer's from the host that module describes.
REDIS_URL = envstr("REDIS_URL", "")
# The sentinels' own credentials (sentinel.conf's `requirepass`), when they have any.
REDIS_SENTINEL_USERNAME = envstr("REDIS_SENTINEL_USERNAME", "")
REDIS_SENTINEL_PASSWORD = envstr("REDIS_SENTINEL_PASSWORD", "")
if REDIS_URL:
    try:
        check_redis_url(REDIS_URL)
    except RedisURLError as exc:
        raise ImproperlyConfigured(f"REDIS_URL: {exc}") from None
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    channel_layer_host(
                        REDIS_URL,
                        sentinel_username=REDIS_SENTINEL_USERNAME,
                        sentinel_password=REDIS_SENTINEL_PASSWORD,
                    )
                ],
                # group_expiry must outlive the longest websocket (PITFALLS); we only use
                # groups for rare control events (conversation list updates, logout).
                "group_expiry": 86400 * 2,
                "capacity": 500,
                # Several deployments (and test runs) may share one Redis: keep them apart.
                "prefix": envstr("CHAT_REDIS_PREFIX", "chat:") + "asgi",
            },
        }
    }
else:
    # One process: Channels' in-memory layer, swept once a second (chat/sockets/memory_layer.py).
    CHANNEL_LAYERS = {"default": {"BACKEND": "chat.sockets.memory_layer.MemoryChannelLayer"}}

# --- the chat -----------------------------------------------------------------------------
PORT = envint("PORT", 8000, minimum=1)
CHAT_INSTANCE_ID = envstr("CHAT_INSTANCE_ID", socket.gethostname().split(".")[0] or "local")
if not CHAT_INSTANCE_ID.replace("_", "").replace(".", "").isalnum():
    raise ImproperlyConfigured(
        f"CHAT_INSTANCE_ID={CHAT_INSTANCE_ID!r} may hold only letters, digits, '_' and '.'"
    )

LLM_BASE_URL = envstr("LLM_BASE_URL", f"http://127.0.0.1:{PORT}/demo/v1").rstrip("/")
LLM_API_KEY = envstr("LLM_API_KEY", "")
CHAT_MODEL_FULL = envstr("CHAT_MODEL_FULL", "demo-full")
CHAT_MODEL_LITE = envstr("CHAT_MODEL_LITE", "demo-lite")
# After a new conversation's first answer, a short title from the lite model (a small request
# against the user's limits); off: the title stays the prompt's first words.
CHAT_TITLES = envbool("CHAT_TITLES", True)
LLM_CONNECT_TIMEOUT = envfloat("LLM_CONNECT_TIMEOUT", 5.0, minimum=0.1)
LLM_READ_TIMEOUT = envfloat("LLM_READ_TIMEOUT", 60.0, minimum=0.1)
LLM_TOTAL_TIMEOUT = envfloat("LLM_TOTAL_TIMEOUT", 600.0, minimum=1.0)
LLM_POOL_SIZE = envint("LLM_POOL_SIZE", 500, minimum=1)
LLM_HTTP2 = envbool("LLM_HTTP2", False)
# Who reads the model's stream under httpx: aiohttp (C parser, fewer syscalls per chunk) or
# httpx's own stack (needed for HTTP/2). docs/decisions/performance.md has the numbers.
LLM_HTTP_BACKEND = envchoice(
    "LLM_HTTP_BACKEND", "httpx" if LLM_HTTP2 else "aiohttp", ("aiohttp", "httpx")
)
if LLM_HTTP2 and LLM_HTTP_BACKEND == "aiohttp":
    raise ImproperlyConfigured(
        "LLM_HTTP2=1 needs LLM_HTTP_BACKEND=httpx (aiohttp speaks HTTP/1.1 only)"
    )
LLM_CONTEXT_CHARS = envint("LLM_CONTEXT_CHARS", 24000, minimum=1000)
LLM_MAX_TOKENS = envint("LLM_MAX_TOKENS", 0, minimum=0)  # 0 = let the server decide

CHAT_RATE_LIMIT = envstr("CHAT_RATE_LIMIT", "20/minute;500/day")
try:
    parse_many(CHAT_RATE_LIMIT)
except ValueError:
    raise ImproperlyConfigured(
        f"CHAT_RATE_LIMIT={CHAT_RATE_LIMIT!r} is not in the limits notation, e.g. 20/minute;500/day"
    ) from None
# Exports (/settings/export.json, /c/<id>/export.json) running at once, per user and per
# instance; over either, 429 (chat/limits/exports.py).
CHAT_EXPORTS_PER_USER = envint("CHAT_EXPORTS_PER_USER", 1, minimum=1)
CHAT_EXPORTS_PER_INSTANCE = envint("CHAT_EXPORTS_PER_INSTANCE", 4, minimum=1)
CHAT_DAILY_TOKENS = envint("CHAT_DAILY_TOKENS", 200_000, minimum=0)
# Tokens every user together may spend per UTC day, on every instance; 0 = no such budget.
CHAT_GLOBAL_DAILY_TOKENS = envint("CHAT_GLOBAL_DAILY_TOKENS", 0, minimum=0)
CHAT_MAX_CONCURRENT_STREAMS = envint("CHAT_MAX_CONCURRENT_STREAMS", 2, minimum=1)
# Open sockets (tabs) per user and per client address, across every instance; 0 = no cap.
# An office behind one NAT address shares the address cap.
CHAT_MAX_SOCKETS_PER_USER = envint("CHAT_MAX_SOCKETS_PER_USER", 30, minimum=0)
CHAT_MAX_SOCKETS_PER_ADDRESS = envint("CHAT_MAX_SOCKETS_PER_ADDRESS", 300, minimum=0)
# How long an instance's socket places outlive it in Redis if it dies (extended meanwhile).
CHAT_SOCKET_LEASE_SECONDS = envfloat("CHAT_SOCKET_LEASE_SECONDS", 60.0, minimum=3.0)
CHAT_LIMITER_FAILURE = envchoice("CHAT_LIMITER_FAILURE", "open", ("open", "closed"))
CHAT_MAX_PROMPT_CHARS = envint("CHAT_MAX_PROMPT_CHARS", 32000, minimum=1)
# A conversation page shows this many messages of the branch on show; "Load earlier messages"
# fetches as many again (issue 13, finding 17).
CHAT_THREAD_WINDOW = envint("CHAT_THREAD_WINDOW", 50, minimum=2)
CHAT_COALESCE_MS = envfloat("CHAT_COALESCE_MS", 16.0, minimum=0.0)
CHAT_CHECKPOINT_SECONDS = envfloat("CHAT_CHECKPOINT_SECONDS", 3.0, minimum=0.1)
CHAT_LEASE_SECONDS = envfloat("CHAT_LEASE_SECONDS", 15.0, minimum=1.0)
CHAT_STREAM_LOG_TTL = envint("CHAT_STREAM_LOG_TTL", 3600, minimum=10)
# Connections the stream log's readers (tabs following an answer through Redis) may hold.
CHAT_STREAM_LOG_MAX_READERS = envint("CHAT_STREAM_LOG_MAX_READERS", 1000, minimum=1)
CHAT_SEND_BUFFER_FRAMES = envint("CHAT_SEND_BUFFER_FRAMES", 2000, minimum=10)
# Bytes daphne may hold for one websocket that the kernel has not taken (its client stopped
# reading); past it the connection is aborted (chat/backpressure.py, daphne #170).
CHAT_SEND_BUFFER_BYTES = envint("CHAT_SEND_BUFFER_BYTES", 4 * 1024 * 1024, minimum=64 * 1024)
CHAT_METRICS_ALLOW = envlist("CHAT_METRICS_ALLOW", ["127.0.0.1", "::1"])
# Seconds a SIGTERM'd instance lets running answers finish before saving them as interrupted.
CHAT_SHUTDOWN_GRACE = envfloat("CHAT_SHUTDOWN_GRACE", 20.0, minimum=0.0)

# --- the demo model -------------------------------------------------------------------------
DEMO_TTFB_MS = envint("DEMO_TTFB_MS", 150, minimum=0)
DEMO_TOKENS_PER_SECOND = envfloat("DEMO_TOKENS_PER_SECOND", 40.0, minimum=0.0)
# The demo model answers anyone who reaches it, with no login and no limit: it is served at
# /demo/v1/ only where it is the configured model (LLM_BASE_URL's path is /demo/v1) or in
# DEBUG, unless DEMO_MOUNT says on or off.
DEMO_MOUNT = envchoice("DEMO_MOUNT", "auto", ("auto", "on", "off"))
DEMO_MOUNTED = DEMO_MOUNT == "on" or (
    DEMO_MOUNT == "auto" and (DEBUG or urlsplit(LLM_BASE_URL).path == "/demo/v1")
)

# Structured lines (chat/logging.py): every line names the instance; lines about a turn carry
# its turn, mid, conversation and user. json for log shippers, text (logfmt) for people.
DJANGO_LOG_FORMAT = envchoice("DJANGO_LOG_FORMAT", "text", ("text", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "chat": {"()": "chat.logging.ContextFilter", "instance": CHAT_INSTANCE_ID},
        "refused_input": {"()": "chat.logging.RefusedInputFilter"},
    },
    "formatters": {
        "text": {"()": "chat.logging.KeyValueFormatter"},
        "json": {"()": "chat.logging.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": DJANGO_LOG_FORMAT,
            "filters": ["chat"],
        }
    },
    "root": {"handlers": ["console"], "level": envstr("DJANGO_LOG_LEVEL", "INFO")},
    "loggers": {
        "daphne": {"level": "WARNING"},
        "django.request": {"filters": ["refused_input"]},
        "httpx": {"level": "WARNING"},
    },
}

# The longest answer (its max_tokens, and the answer's part of the reservation) when a daily
# quota or the global budget applies and neither the model tier nor LLM_MAX_TOKENS caps it.
CHAT_RESERVE_TOKENS = envint("CHAT_RESERVE_TOKENS", 4096, minimum=1)
CHAT_HTTP_RATE_LIMIT = envstr("CHAT_HTTP_RATE_LIMIT", "120/minute")


def _rate(name: str, default: str) -> str:
    """A rate in the limits notation from the environment; start-up fails on a bad one."""
    value = envstr(name, default)
    try:
        if not parse_many(value):
            raise ValueError(value)
    except ValueError:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not in the limits notation, e.g. {default}"
        ) from None
    return value


# How often one user may have an answer sent again (`resume`, of a streaming answer as of one
# that has ended: every block so far, or its whole final HTML), across their tabs and every
# instance: tabs resuming a long answer in a loop slowed every other user's answers (the
# resume storm, docs/security.md). A tab over it asks again by itself after `retry_after`.
CHAT_RESUME_RATE = _rate("CHAT_RESUME_RATE", "30/minute")
# How often one user may open a chat socket (a new tab, a reload, a reconnect), across their
# tabs and every instance: tabs reconnecting in a loop slowed every other user's answers (the
# resume storm, docs/security.md). Over it the tab is told when to come back, then closed
# with 4429; it reconnects by itself after that wait.
CHAT_SOCKET_RATE = _rate("CHAT_SOCKET_RATE", "60/minute")
# How often handshakes from one client address may carry a session cookie that is not a valid
# session (expired, forged, logged out). Each costs a session lookup before it is refused; a
# loop of them slowed every other user's answers (docs/security.md). Over it, the address's
# handshakes are refused (403) before the lookup, with or without a valid cookie, until the
# window frees. A handshake without any session cookie is refused at once and not counted.
CHAT_STRANGER_SOCKET_RATE = _rate("CHAT_STRANGER_SOCKET_RATE", "30/minute")
# How often one user (anonymous: one client address) may load a page that sends a whole
# conversation: /c/<id>/, /s/<token>/ and the two exports. A long answer's stored HTML is
# over a megabyte: GETs in a loop slowed every other user's answers (docs/security.md).
# Over it: 429 with Retry-After and a page that says when to come back.
CHAT_PAGE_RATE = _rate("CHAT_PAGE_RATE", "60/minute")

# The account forms (chat/limits/logins.py). Login attempts, both forms (the site's and the
# admin's): every attempt counts against the client address; against the username (NFKC,
# case-folded) until a login as it succeeds. Windows of growing length are the backoff.
# A DEBUG server (`make run`: one developer on loopback, scripts signing up test users) has
# loose per-address defaults; the per-username backoff is the same everywhere.
CHAT_LOGIN_RATE_PER_ADDRESS = _rate(
    "CHAT_LOGIN_RATE_PER_ADDRESS", "200/minute" if DEBUG else "20/minute;100/hour;300/day"
)
CHAT_LOGIN_RATE_PER_USERNAME = _rate(
    "CHAT_LOGIN_RATE_PER_USERNAME", "5/minute;10/15 minutes;30/day"
)
# Password reset mails to one email address, from anyone (an attacker could otherwise make
# the site mail a victim 120 times a minute from each of their addresses).
CHAT_PASSWORD_RESET_RATE_PER_EMAIL = _rate("CHAT_PASSWORD_RESET_RATE_PER_EMAIL", "3/hour;10/day")
# Accounts created from one client address (an office behind one NAT address shares it).
CHAT_SIGNUP_RATE_PER_ADDRESS = _rate(
    "CHAT_SIGNUP_RATE_PER_ADDRESS", "200/hour" if DEBUG else "5/hour;20/day"
)
CHAT_REDIS_PREFIX = envstr("CHAT_REDIS_PREFIX", "chat:")

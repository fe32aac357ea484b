"""Fairgate settings. Every knob comes from the environment through config.env (see .env.example).

Embedded default (nothing set): SQLite under var/, in-memory channel layer, eager Celery.
Production: DATABASE_URL=postgres://..., REDIS_URL=redis://...
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.env import (
    env_bool,
    env_choice,
    env_decimal,
    env_int,
    env_list,
    env_networks,
    env_origin,
    env_output_limits,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
# Runtime state (SQLite, batch files, the file broker): a checkout's var/; an installed package
# (no manage.py beside config/) keeps it out of site-packages, in $XDG_STATE_HOME/fairgate.
CHECKOUT = (BASE_DIR / "manage.py").is_file()
_STATE_HOME = Path(env_str("XDG_STATE_HOME") or "")
if not _STATE_HOME.is_absolute():  # unset or relative: the XDG default
    _STATE_HOME = Path.home() / ".local" / "state"
VAR_DIR = Path(env_str("FAIRGATE_VAR_DIR", str(BASE_DIR / "var" if CHECKOUT else _STATE_HOME / "fairgate")))

DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    """SECRET_KEY from the environment. Only the embedded default (DATABASE_URL unset or SQLite,
    REDIS_URL unset) may fall back to the public key below: the key signs sessions and CSRF tokens,
    so a production deployment running on it would accept forged ones."""
    key = env_str("SECRET_KEY") or ""
    if key:
        return key
    database_url = env_str("DATABASE_URL") or ""
    if env_str("REDIS_URL") or (database_url and not database_url.startswith(("sqlite:", "spatialite:"))):
        raise ImproperlyConfigured(
            "SECRET_KEY must be set when DATABASE_URL/REDIS_URL point at production services "
            "(the embedded default's built-in key is public)"
        )
    return "fairgate-embedded-insecure-key-change-me"  # embedded default only


SECRET_KEY = _secret_key()
# Behind an HTTPS ingress (docs/production.md): the origin people and clients use. Its host is
# allowed, it is a trusted CSRF origin, and when it is https, cookies are Secure, HSTS is sent and
# plain-HTTP console pages redirect to it. The proxy's X-Forwarded-Proto/-For are believed only
# from FAIRGATE_TRUSTED_PROXIES (gateway/forwarded.py; Django's SECURE_PROXY_SSL_HEADER would
# believe any peer, so it stays unset).
FAIRGATE_PUBLIC_URL = env_origin("FAIRGATE_PUBLIC_URL")
_PUBLIC_HTTPS = FAIRGATE_PUBLIC_URL.startswith("https://")
_PUBLIC_HOSTS = [f"[{h}]" if ":" in h else h for h in [urlsplit(FAIRGATE_PUBLIC_URL).hostname or ""] if h]
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver", *_PUBLIC_HOSTS])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [FAIRGATE_PUBLIC_URL] if FAIRGATE_PUBLIC_URL else [])
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _PUBLIC_HTTPS
SECURE_SSL_REDIRECT = env_bool("FAIRGATE_SSL_REDIRECT", _PUBLIC_HTTPS)  # the console and admin; not the API
SECURE_SSL_HOST = urlsplit(FAIRGATE_PUBLIC_URL).netloc if _PUBLIC_HTTPS else None  # to the public origin
SECURE_HSTS_SECONDS = env_int("FAIRGATE_HSTS_SECONDS", 31_536_000 if _PUBLIC_HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("FAIRGATE_HSTS_INCLUDE_SUBDOMAINS", False)  # the operator's call:
SECURE_HSTS_PRELOAD = env_bool("FAIRGATE_HSTS_PRELOAD", False)  # both bind hosts Fairgate does not serve

FAIRGATE_CONFIG = env_str("FAIRGATE_CONFIG", str(BASE_DIR / "config" / "scheduler.example.yaml"))
FAIRGATE_REQUIRE_SERVICES = env_bool("FAIRGATE_REQUIRE_SERVICES", False)
FAIRGATE_CURRENCY = env_str("FAIRGATE_CURRENCY", "USD")
FAIRGATE_FISCAL_TZ = env_str("FAIRGATE_FISCAL_TZ", "UTC")
FAIRGATE_FISCAL_YEAR_START_MONTH = env_int("FAIRGATE_FISCAL_YEAR_START_MONTH", 1, minimum=1)
if FAIRGATE_FISCAL_YEAR_START_MONTH > 12:
    raise ImproperlyConfigured("FAIRGATE_FISCAL_YEAR_START_MONTH must be 1..12")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "channels",
    "audit",
    "tenants",
    "gateway",
    "scheduling",
    "billing",
    "batches",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
AUTH_USER_MODEL = "tenants.User"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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


def _database() -> dj_database_url.DBConfig:
    url = env_str("DATABASE_URL")
    if not url:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(VAR_DIR / "fairgate.sqlite3"),
            # Keep connections: opening one per ORM call costs more than the query.
            "CONN_MAX_AGE": None,
            # WAL, a busy timeout and immediate transactions: no "database is locked" under load.
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    try:
        db = dj_database_url.parse(url, conn_max_age=60)
    except Exception as exc:  # the library raises a bare ValueError/KeyError on unknown schemes
        raise ImproperlyConfigured(f"DATABASE_URL is not a usable database URL: {exc}") from None
    if "postgresql" in db["ENGINE"]:
        db["TEST"] = {"NAME": env_str("FAIRGATE_TEST_DB_NAME", f"test_{db['NAME']}")}
    return db


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    # redis-py 8 gives every connection a 5 s socket timeout by default; channels_redis's receive
    # blocks in BZPOPMIN for up to 5 s (its brpop_timeout), so an idle consumer's read timed out and
    # its WebSocket was closed. The read timeout must outlast that pop. (Celery's broker is not
    # affected: kombu passes its own socket_timeout, None, to redis-py.)
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}]},
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    # Without Redis, tasks run eagerly in the process that sends them, unless a broker that needs
    # no server is named: CELERY_BROKER_URL=filesystem://localhost/ (kombu's file transport under
    # var/celery; `make demo` runs a real worker and beat on it).
    CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "memory://") or "memory://"
    CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", CELERY_BROKER_URL == "memory://")
    if CELERY_BROKER_URL.startswith("filesystem://"):
        CELERY_BROKER_TRANSPORT = "config.broker.Transport"  # kombu's, its messages written whole
        CELERY_BROKER_TRANSPORT_OPTIONS = {
            "data_folder_in": str(VAR_DIR / "celery" / "queue"),
            "data_folder_out": str(VAR_DIR / "celery" / "queue"),
            "control_folder": str(VAR_DIR / "celery" / "control"),
            "polling_interval": 0.05,  # a worker looks for new messages 20 times a second, not once
        }
CELERY_TASK_EAGER_PROPAGATES = True
# The queue tasks go to and workers read (one per deployment sharing a broker; tests use their own).
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_TASK_DEFAULT_QUEUE", "celery") or "celery"
# A worker takes one task at a time per process/thread: a batch line (acked late) waits in the
# broker, where another worker can take it, not in a busy worker's prefetch.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Budget holds and charges on the request path (off only to measure billing's own cost).
FAIRGATE_BILLING = env_bool("FAIRGATE_BILLING", True)
# The sane range of a class's price factor: every door that sets one refuses a factor outside it
# (scheduling.prices); a change moving a factor more than 2x either way asks for confirmation.
FAIRGATE_FACTOR_MIN = env_decimal("FAIRGATE_FACTOR_MIN", "0.1")
FAIRGATE_FACTOR_MAX = env_decimal("FAIRGATE_FACTOR_MAX", "10")
if not 0 <= FAIRGATE_FACTOR_MIN <= FAIRGATE_FACTOR_MAX:
    raise ImproperlyConfigured("FAIRGATE_FACTOR_MIN and FAIRGATE_FACTOR_MAX need 0 <= MIN <= MAX")
# Early holds (billing/client/holds.py): a tenant with ample room need not wait for its hold before its
# request queues and goes upstream (the answer still waits for it); the room a hold reported is
# trusted for this long.
FAIRGATE_EARLY_HOLDS = env_bool("FAIRGATE_EARLY_HOLDS", True)
FAIRGATE_EARLY_HOLD_ROOM_MS = env_int("FAIRGATE_EARLY_HOLD_ROOM_MS", 1000, minimum=0)
# How long a booking no request waits for now (a journaled settlement, a release, an early hold)
# may wait for others to share its batch (billing.client.group_commit): fewer, fuller transactions.
FAIRGATE_BILLING_LINGER_MS = env_int("FAIRGATE_BILLING_LINGER_MS", 10, minimum=0)
# The billing worker's niceness, added to the gateway's (billing/client/pipe.py): on a machine
# whose cores are all busy, the event loop (every request's path) goes before the bookkeeping
# (group commit: a slower worker books fuller batches). 0: the same priority as the gateway.
FAIRGATE_BILLING_WORKER_NICE = env_int("FAIRGATE_BILLING_WORKER_NICE", 10, minimum=0)
# The settlement journal (billing/journal.py) syncs at most this often: each fdatasync costs the
# gateway CPU whatever it carries; an answer's end may wait up to this long for its line's sync.
FAIRGATE_JOURNAL_SYNC_INTERVAL_MS = env_int("FAIRGATE_JOURNAL_SYNC_INTERVAL_MS", 2, minimum=0)
# Syncs by a small process of the gateway's own (billing/journal_sync.py); off: by a thread.
FAIRGATE_JOURNAL_SYNCER = env_bool("FAIRGATE_JOURNAL_SYNCER", True)
# What an answer's end waits for (billing/journal.py): "write", its settlement's line written to the
# kernel (no process's death loses it; the fdatasync follows within the interval, a power loss
# in between can); "sync", the line's fdatasync. "write" needs the syncer (without it: "sync").
FAIRGATE_JOURNAL_WAIT = env_choice("FAIRGATE_JOURNAL_WAIT", "write", ("write", "sync"))
FAIRGATE_BILLING_STALE_HOLD_S = env_int("FAIRGATE_BILLING_STALE_HOLD_S", 7200, minimum=60)
# PostgreSQL: booking statements are prepared on the server after this many runs (billing/statements.py);
# 0 never prepares (behind a transaction-pooling proxy that cannot keep prepared statements).
FAIRGATE_BILLING_PREPARE_THRESHOLD = env_int("FAIRGATE_BILLING_PREPARE_THRESHOLD", 2, minimum=0)
# Crash leftovers (billing/heartbeats.py): each gateway beats this often; one silent for longer
# than the bound is dead for billing and its holds are released by the next sweep.
FAIRGATE_HEARTBEAT_S = env_int("FAIRGATE_HEARTBEAT_S", 5, minimum=1)
FAIRGATE_PROCESS_DEAD_AFTER_S = env_int("FAIRGATE_PROCESS_DEAD_AFTER_S", 30, minimum=2)
FAIRGATE_ORPHAN_SWEEP_S = env_int("FAIRGATE_ORPHAN_SWEEP_S", 15, minimum=1)
if FAIRGATE_PROCESS_DEAD_AFTER_S < 3 * FAIRGATE_HEARTBEAT_S:
    raise ImproperlyConfigured("FAIRGATE_PROCESS_DEAD_AFTER_S must be at least 3 x FAIRGATE_HEARTBEAT_S")
CELERY_TIMEZONE = "UTC"
# Budget alerts (billing/alerts.py) go by e-mail through these, and to each tenant's webhook. Without
# EMAIL_HOST mail is printed by the worker (console backend): set it in production.
EMAIL_HOST = env_str("EMAIL_HOST", "") or ""
EMAIL_BACKEND = (
    "django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST else "django.core.mail.backends.console.EmailBackend"
)
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "") or ""
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "") or ""
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", True)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "fairgate@localhost") or "fairgate@localhost"
# Files expire (deleted by beat's batches.sweep, every FAIRGATE_BATCH_SWEEP_S, which also expires
# batches past their window) this long after they were made, unless an upload's expires_after says
# otherwise.
FAIRGATE_FILE_TTL_S = env_int("FAIRGATE_FILE_TTL_S", 30 * 24 * 3600, minimum=3600)
FAIRGATE_BATCH_SWEEP_S = env_int("FAIRGATE_BATCH_SWEEP_S", 30, minimum=1)
CELERY_BEAT_SCHEDULE = {
    "billing-holds-sweep": {"task": "billing.holds_sweep", "schedule": 300.0},
    "billing-budgets-forecast": {"task": "billing.budgets_forecast", "schedule": 3600.0},
    "billing-holds-release-orphaned": {
        "task": "billing.holds_release_orphaned",
        "schedule": float(FAIRGATE_ORPHAN_SWEEP_S),
    },
    "batches-sweep": {"task": "batches.sweep", "schedule": float(FAIRGATE_BATCH_SWEEP_S)},
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# Files of the Batch API (batches.files): local var/files for one machine; with gateways on several
# machines a shared storage, e.g. FAIRGATE_FILES_STORAGE=storages.backends.s3.S3Storage (the
# django-storages package, configured by its own AWS_* variables).
FAIRGATE_FILES_STORAGE = env_str("FAIRGATE_FILES_STORAGE", "django.core.files.storage.FileSystemStorage")
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "batch_files": {
        "BACKEND": FAIRGATE_FILES_STORAGE,
        "OPTIONS": {"location": str(VAR_DIR / "files")} if FAIRGATE_FILES_STORAGE.endswith("FileSystemStorage") else {},
    },
}
FAIRGATE_FILE_MAX_BYTES = env_int("FAIRGATE_FILE_MAX_BYTES", 200 * 1024 * 1024, minimum=1)
FAIRGATE_BATCH_MAX_LINES = env_int("FAIRGATE_BATCH_MAX_LINES", 50_000, minimum=1)
# Batch lines one serving process keeps in the engine at most (batches.feeder); the engine's own
# admission (queue depth) may take fewer.
FAIRGATE_BATCH_LINES_PER_PROCESS = env_int("FAIRGATE_BATCH_LINES_PER_PROCESS", 64, minimum=1)
# A line's lease (batches.leases): a worker running a line renews it every quarter of
# FAIRGATE_BATCH_LEASE_MS; a line whose worker died is sent again (at most once more) once it lapses.
# A line sent but not yet started by any worker is sent again after FAIRGATE_BATCH_HANDOFF_MS.
FAIRGATE_BATCH_LEASE_MS = env_int("FAIRGATE_BATCH_LEASE_MS", 20_000, minimum=100)
FAIRGATE_BATCH_HANDOFF_MS = env_int("FAIRGATE_BATCH_HANDOFF_MS", 60_000, minimum=100)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
}

LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}

# Gateway ---------------------------------------------------------------------------------------
# The OpenAI-compatible ingress (gateway/). Times in ms, sizes in bytes; see .env.example.
# Source addresses whose X-Forwarded-For (and, on the console, X-Forwarded-Proto) is believed
# (IPs or CIDRs); uvicorn's own proxy trust is off.
FAIRGATE_TRUSTED_PROXIES = env_networks("FAIRGATE_TRUSTED_PROXIES")
# Output limits (gateway/limits.py): a request without max_tokens is held at, and sent upstream
# with, the default; one above the maximum is refused (400). Per model: "model=default/max,...".
FAIRGATE_DEFAULT_MAX_TOKENS = env_int("FAIRGATE_DEFAULT_MAX_TOKENS", 512, minimum=1)
FAIRGATE_MAX_OUTPUT_TOKENS = env_int("FAIRGATE_MAX_OUTPUT_TOKENS", 32_768, minimum=1)
FAIRGATE_MODEL_OUTPUT_LIMITS = env_output_limits("FAIRGATE_MODEL_OUTPUT_LIMITS")
FAIRGATE_MAX_N = env_int("FAIRGATE_MAX_N", 8, minimum=1)  # choices per request
FAIRGATE_MAX_PROMPTS = env_int("FAIRGATE_MAX_PROMPTS", 64, minimum=1)  # prompts of one /v1/completions list
FAIRGATE_MAX_EMBEDDING_INPUTS = env_int(
    "FAIRGATE_MAX_EMBEDDING_INPUTS", 2048, minimum=1
)  # items of one embeddings input
# Tokens held per image part: the prompt's byte length cannot bound what an image costs.
FAIRGATE_IMAGE_TOKENS = env_int("FAIRGATE_IMAGE_TOKENS", 2_048, minimum=0)
FAIRGATE_MAX_BODY_BYTES = env_int("FAIRGATE_MAX_BODY_BYTES", 8 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = FAIRGATE_MAX_BODY_BYTES
# Slow clients (`manage.py serve`): a request's headers must be complete this long after the
# connection opened (first request) or the request's first byte (later ones), else 408 and close;
# on the API paths its whole body must then arrive within the body timeout, else 408 and close.
FAIRGATE_HEADER_TIMEOUT_MS = env_int("FAIRGATE_HEADER_TIMEOUT_MS", 10_000, minimum=1)
FAIRGATE_BODY_TIMEOUT_MS = env_int("FAIRGATE_BODY_TIMEOUT_MS", 30_000, minimum=1)
FAIRGATE_UPLOAD_TIMEOUT_MS = env_int("FAIRGATE_UPLOAD_TIMEOUT_MS", 600_000, minimum=1)  # POST /v1/files bodies
FAIRGATE_UPSTREAM_CONNECT_TIMEOUT_MS = env_int("FAIRGATE_UPSTREAM_CONNECT_TIMEOUT_MS", 5_000, minimum=1)
FAIRGATE_UPSTREAM_READ_TIMEOUT_MS = env_int("FAIRGATE_UPSTREAM_READ_TIMEOUT_MS", 300_000, minimum=1)
# Attempts on another (or the same) backend after a connection error or a 5xx, before 502.
FAIRGATE_UPSTREAM_RETRIES = env_int("FAIRGATE_UPSTREAM_RETRIES", 1, minimum=0)
# Upstream 429s a request may absorb (each puts it back at the front of its queue).
FAIRGATE_UPSTREAM_MAX_REQUEUES = env_int("FAIRGATE_UPSTREAM_MAX_REQUEUES", 20, minimum=0)
# Consecutive upstream failures that open a backend's circuit, and how long it stays open.
FAIRGATE_CIRCUIT_FAILURES = env_int("FAIRGATE_CIRCUIT_FAILURES", 5, minimum=1)
FAIRGATE_CIRCUIT_COOLDOWN_MS = env_int("FAIRGATE_CIRCUIT_COOLDOWN_MS", 30_000, minimum=1)
# How often the running dispatcher looks for configuration changes (admin edits, commands).
FAIRGATE_CONFIG_POLL_MS = env_int("FAIRGATE_CONFIG_POLL_MS", 500, minimum=50)
# `embedded`: the scheduler lives in the process (one process). `shared`: every gateway process on
# REDIS_URL shares one scheduler (gateway.shared, scheduling.shared); needs REDIS_URL. The default
# is `shared` where REDIS_URL is set (the production shape), `embedded` where it is not.
FAIRGATE_SCHEDULER = env_choice("FAIRGATE_SCHEDULER", "shared" if REDIS_URL else "embedded", ("embedded", "shared"))
if FAIRGATE_SCHEDULER == "shared" and not REDIS_URL:
    raise ImproperlyConfigured("FAIRGATE_SCHEDULER=shared needs REDIS_URL (the scheduler is shared through Redis)")
# Shared scheduler: `auto`, each gateway process bids for the dispatcher's role (one holds it, the
# others stand by); `never`, this process only serves (the role runs in `manage.py dispatcher`).
FAIRGATE_DISPATCHER = env_choice("FAIRGATE_DISPATCHER", "auto", ("auto", "never"))
# The shared scheduler's keys in Redis start with this (two deployments on one Redis: two prefixes).
FAIRGATE_SHARED_PREFIX = env_str("FAIRGATE_SHARED_PREFIX", "fairgate:sched")
# Intake lanes (gateway.lanes): requests below the top class run their intake (parse, token
# estimate, downgrade rules) at most FAIRGATE_INTAKE_CONCURRENCY at a time, the most urgent class
# first; at most FAIRGATE_INTAKE_BACKLOG of one class wait for a turn (more: 429 queue_full).
FAIRGATE_INTAKE_CONCURRENCY = env_int("FAIRGATE_INTAKE_CONCURRENCY", 2, minimum=1)
FAIRGATE_INTAKE_BACKLOG = env_int("FAIRGATE_INTAKE_BACKLOG", 2_000, minimum=1)
# How long a key lookup is cached: a revoked key stops working within this time.
FAIRGATE_AUTH_CACHE_MS = env_int("FAIRGATE_AUTH_CACHE_MS", 1_000, minimum=0)
# Refused keys past this many a second (and a burst) have their 401 held back (gateway.tarpit), at most
# FAIRGATE_AUTH_TARPIT_MAX at once.
FAIRGATE_AUTH_TARPIT_FREE_PER_S = env_int("FAIRGATE_AUTH_TARPIT_FREE_PER_S", 50, minimum=1)
FAIRGATE_AUTH_TARPIT_BURST = env_int("FAIRGATE_AUTH_TARPIT_BURST", 20, minimum=1)
FAIRGATE_AUTH_TARPIT_MS = env_int("FAIRGATE_AUTH_TARPIT_MS", 5_000, minimum=0)
FAIRGATE_AUTH_TARPIT_MAX = env_int("FAIRGATE_AUTH_TARPIT_MAX", 10_000, minimum=0)
# Connections read at once from a client address without a valid key in the last 10 minutes (not a
# trusted proxy); past it a new one waits unread for a place or a valid key (about 1 s at most), or, if
# the address was refused a key in the last 30 s, is held unread about FAIRGATE_AUTH_TARPIT_MS, then
# answered 429 (gateway.connlimit). 0: no limit.
FAIRGATE_CONNECTIONS_PER_ADDRESS = env_int("FAIRGATE_CONNECTIONS_PER_ADDRESS", 32, minimum=0)
# Terminal states kept for GET /v1/queue/{id}: how long and how many at most.
FAIRGATE_TERMINAL_KEEP_MS = env_int("FAIRGATE_TERMINAL_KEEP_MS", 3_600_000, minimum=1)
FAIRGATE_TERMINAL_MAX = env_int("FAIRGATE_TERMINAL_MAX", 100_000, minimum=1)
LOGGING["loggers"] = {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}}
# One JSON line per API request on the `fairgate.access` logger (gateway.access; docs/observability.md):
# on by default in production (PostgreSQL or Redis configured), off on the embedded default (`make demo`).
FAIRGATE_ACCESS_LOG = env_bool("FAIRGATE_ACCESS_LOG", "postgresql" in DATABASES["default"]["ENGINE"] or bool(REDIS_URL))
LOGGING["formatters"]["line"] = {"format": "%(message)s"}  # type: ignore[index]
LOGGING["handlers"]["access"] = {"class": "logging.StreamHandler", "formatter": "line"}  # type: ignore[index]
LOGGING["loggers"]["fairgate.access"] = {"handlers": ["access"], "level": "INFO", "propagate": False}  # type: ignore[index]

# Console ---------------------------------------------------------------------------------------
# Browser pages at /console/ (console/). Chart.js comes from npm (package.json, `make assets`) and
# is served as console-vendor/chart.umd.js: in a checkout from node_modules; in an installed wheel
# from console/static/console-vendor/, which the wheel's build step (setup.py) fills from npm.
_CHART_JS = BASE_DIR / "node_modules" / "chart.js" / "dist"
STATICFILES_DIRS = [("console-vendor", _CHART_JS)] if CHECKOUT else []
LOGIN_URL = "/console/login/"
LOGIN_REDIRECT_URL = "/console/"
LOGOUT_REDIRECT_URL = "/console/login/"

# Company sign-in (docs/sign-in.md): OpenID Connect through mozilla-django-oidc when an issuer is set;
# its endpoints come from the issuer's discovery document (tenants.oidc). Local password logins stay
# unless FAIRGATE_LOCAL_LOGIN=0 (the demo keeps them). A console session lasts FAIRGATE_SESSION_HOURS.
FAIRGATE_OIDC_ISSUER = env_str("FAIRGATE_OIDC_ISSUER") or ""
FAIRGATE_OIDC_NAME = env_str("FAIRGATE_OIDC_NAME", "the company account")
FAIRGATE_OIDC_CLAIM = env_str("FAIRGATE_OIDC_CLAIM", "groups")
FAIRGATE_SIGNIN_CONTACT = env_str("FAIRGATE_SIGNIN_CONTACT", "your Fairgate administrator")
FAIRGATE_LOCAL_LOGIN = env_bool("FAIRGATE_LOCAL_LOGIN", True)
OIDC_RP_CLIENT_ID = env_str("FAIRGATE_OIDC_CLIENT_ID") or ""
OIDC_RP_CLIENT_SECRET = env_str("FAIRGATE_OIDC_CLIENT_SECRET") or ""
OIDC_RP_SCOPES = env_str("FAIRGATE_OIDC_SCOPES", "openid email profile groups")
OIDC_RP_SIGN_ALGO = env_str("FAIRGATE_OIDC_SIGN_ALGO", "RS256")
OIDC_USE_PKCE = True
OIDC_STORE_ID_TOKEN = True  # for the provider's logout (id_token_hint)
OIDC_AUTHENTICATION_CALLBACK_URL = "console:sso-callback"
OIDC_TIMEOUT = 10
SESSION_COOKIE_AGE = env_int("FAIRGATE_SESSION_HOURS", 12, minimum=1) * 3600
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"] if FAIRGATE_LOCAL_LOGIN else []
if FAIRGATE_OIDC_ISSUER:
    if not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
        raise ImproperlyConfigured("FAIRGATE_OIDC_ISSUER needs FAIRGATE_OIDC_CLIENT_ID and FAIRGATE_OIDC_CLIENT_SECRET")
    AUTHENTICATION_BACKENDS.append("tenants.oidc.Backend")
if not AUTHENTICATION_BACKENDS:
    raise ImproperlyConfigured("FAIRGATE_LOCAL_LOGIN=0 needs a company sign-in: set FAIRGATE_OIDC_ISSUER")
# A rotated API key's old secret keeps working this long after the rotation (console, `apikey rotate`).
FAIRGATE_KEY_ROTATION_GRACE_H = env_int("FAIRGATE_KEY_ROTATION_GRACE_H", 24, minimum=0)
# How often an open console socket re-reads its user (inactive, deleted, signed out, demoted: closed).
FAIRGATE_CONSOLE_RECHECK_S = env_int("FAIRGATE_CONSOLE_RECHECK_S", 60, minimum=1)

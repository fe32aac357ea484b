"""ORM calls from the gateway's async code: one helper, so connection hygiene lives in one place.

The gateway's request cycle sends no request_started/finished signals (gateway.asgi), so each call
closes an old or failed connection first, and runs once more on a new connection when the one it
used broke while idle. ``DATABASE_UNAVAILABLE`` is what a database outage raises on the request
path (gateway.views answers 503). Why: docs/architecture.md.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, close_old_connections, connection, connections

from billing.client import DatabaseUnavailable

P = ParamSpec("P")
T = TypeVar("T")
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError, DatabaseUnavailable)


def db_call(fn: Callable[P, T], *, thread: ThreadPoolExecutor | None = None) -> Callable[P, Awaitable[T]]:
    """``await db_call(fn)(...)``: run ``fn`` in the one thread-sensitive worker (or in ``thread``,
    a single-thread executor of the caller's, with a connection of its own) with a usable
    connection. ``fn`` runs twice when its first run failed on a connection that broke while idle,
    so it must be a read or a write that may be repeated (the gateway's are: key and configuration
    reads, the start-up release of leftover holds, downgrade events, which are re-sent after any
    failure anyway)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        close_old_connections()
        reused = connection.connection is not None
        try:
            return fn(*args, **kwargs)
        except (OperationalError, InterfaceError):
            if not reused or connection.is_usable():  # not a stale connection: an outage, or another failure
                raise
            connection.close()
        return fn(*args, **kwargs)

    if thread is not None:
        return sync_to_async(run, thread_sensitive=False, executor=thread)
    return sync_to_async(run, thread_sensitive=True)


def log_failure(logger: logging.Logger, message: str, *args: object) -> None:
    """In an ``except`` block of periodic work: a database outage as one WARNING line (it repeats
    every tick while it lasts), anything else with its traceback."""
    failed = sys.exc_info()[1]
    if isinstance(failed, DATABASE_UNAVAILABLE):
        first_line = str(failed).strip().splitlines()[0] if str(failed).strip() else type(failed).__name__
        logger.warning(message + ": the database is out of reach (%s)", *args, first_line)
    else:
        logger.exception(message, *args)


def close_at_request_end(**kwargs) -> None:
    """``request_finished``: the connections of a Django view's request are closed with it.

    Under ASGI, Django runs each request's synchronous part (the console's pages, the admin, the
    REST API) in a thread of its own (asgiref's ThreadSensitiveContext), so a connection kept for
    ``CONN_MAX_AGE`` would outlive its thread, still open on the server, until the collector
    frees it (Django's connection objects are tied in cycles): pages fast enough then use up
    PostgreSQL's ``max_connections``. The gateway's own calls (`db_call`) run in long-lived
    threads and keep theirs. A connection inside a transaction (a test's) is left alone."""
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()

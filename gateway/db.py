"""ORM calls from the gateway's async code: one helper, so connection hygiene lives in one place.

The gateway's request cycle sends no request_started/finished signals (see gateway.asgi), so
each call recycles stale or expired connections itself, as a long-running worker must. (Billing
books in a process of its own: gateway.billing_worker.)
"""
from __future__ import annotations

import functools
from typing import Awaitable, Callable, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections

P = ParamSpec("P")
T = TypeVar("T")


def db_call(fn: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    """``await db_call(fn)(...)``: run ``fn`` in the one thread-sensitive worker with a usable connection."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        close_old_connections()
        return fn(*args, **kwargs)

    return sync_to_async(run, thread_sensitive=True)

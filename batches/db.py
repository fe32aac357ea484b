"""The batches' own database thread in a serving process (its own connection, the same hygiene
as gateway.db.db_call): the feeder's claims, sends and watches and a batch's create run there, so
they never queue ahead of the API-key lookups and configuration reads of interactive requests in
the gateway's one database thread."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from gateway.api import db_call

P = ParamSpec("P")
T = TypeVar("T")
_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-db")


def batch_db_call(fn: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    """``await batch_db_call(fn)(...)``: ``fn`` in the batches' database thread."""
    return db_call(fn, thread=_thread)

"""The billing worker's loop, in its own process (started by billing.worker.serve once Django is
set up): books each batch the gateway sends (billing.booking.book), between batches beats for
the gateway and sweeps dead processes' holds (billing.heartbeats) and reloads ageing caches;
when the gateway dies it books what the gateway journaled (billing.journal) before it ends.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from collections import deque

from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections, connection

import events
from billing.booking import book
from billing.booking_asks import HoldAsk
from billing.cache import caches_refresh_one
from billing.errors import BillingError, DatabaseUnavailable
from billing.heartbeats import Housekeeper
from billing.inflight import HeldEntry, held_forget, held_remember
from billing.journal_segments import journal_replay, journals_locked
from billing.pricing import UnitPrices, backends_cached
from billing.worker_protocol import READY, BatchAnswer
from config.lifeline import exit_with_parent, parent_gone

ORPHAN_GRACE_S = 120.0  # a worker whose gateway died ends within this, its last bookings done or not
IDLE_S = 0.002  # no ask for this long: time to reload an ageing cache entry (about a millisecond each)
CACHE_CHECK_S = 0.1  # while idle with nothing to reload, how often to look again
MEMO_S = 600.0  # how long the worker remembers a hold it booked, at most (`_remember`)
log = logging.getLogger("fairgate.billing")


def run(conn, gateway_pid: int, owner: str = "") -> None:
    """The worker's loop: book each batch; between batches beat for the gateway and sweep the
    holds of dead ones (billing.heartbeats), and reload ageing caches."""
    if settings.FAIRGATE_BILLING_WORKER_NICE:
        os.nice(settings.FAIRGATE_BILLING_WORKER_NICE)  # the event loop goes first (see the setting)
    events.relay()
    exit_with_parent(gateway_pid, grace_s=ORPHAN_GRACE_S, poll_s=1.0)  # its last bookings done or not
    keeper = Housekeeper(owner=owner, pid=gateway_pid) if owner else None
    if keeper is not None:
        keeper.tick(time.monotonic())
    conn.send_bytes(READY)
    while True:
        if keeper is not None:
            keeper.tick(time.monotonic())
        if not conn.poll(IDLE_S):  # idle: reload what is ageing now, not when a request needs it
            if not caches_refresh_one():
                conn.poll(CACHE_CHECK_S)
            continue
        try:
            asks = pickle.loads(conn.recv_bytes())
            if asks is not None:
                conn.send_bytes(pickle.dumps(book_batch(asks), pickle.HIGHEST_PROTOCOL))
                continue
        except (EOFError, OSError):  # the gateway died (OSError: a batch half sent, or no one to answer)
            _gateway_gone(owner, gateway_pid, keeper)
        if keeper is not None:  # stopped cleanly (`STOP`), or its gateway is gone
            keeper.stop()
        return


def _gateway_gone(owner: str, gateway_pid: int, keeper) -> None:
    """Books the settlements the dead gateway journaled: its clients have their answers. (Its
    files are closed, their locks free, once it is gone: reparented, this worker knows.) While
    the database is out it tries again every second, beating for the gateway meanwhile so its
    holds are not taken for a dead process's and released first, until `ORPHAN_GRACE_S` is near;
    then what is left stays for the next gateway on this host."""

    def booked(asks: list) -> list[object]:
        close_old_connections()  # one that failed is replaced
        return book(asks)

    started_s = time.monotonic()
    while not parent_gone(gateway_pid) and time.monotonic() - started_s < 5.0:
        time.sleep(0.01)
    if not owner:
        return
    total = 0
    while True:
        done, left = journal_replay(owner, booked)
        total += done
        left += journals_locked(owner)  # its dead gateway's lock not released yet: look again
        if not left or time.monotonic() - started_s > ORPHAN_GRACE_S - 10.0:
            break
        if keeper is not None:
            keeper.tick(time.monotonic())
        time.sleep(1.0)
    if total or left:
        log.warning(
            "gateway process %s ended without stopping: booked %s settlements from its journal%s",
            owner,
            total,
            f"; {left} could not be booked and stay for the next gateway on this host" if left else "",
        )


def book_batch(asks: list) -> BatchAnswer:
    """billing.booking.book, plus its committed live events and the backends' prices if they
    changed since the last answer (`_prices_changed`). Refusals cross back as they
    are (billing's errors pickle); the database out of reach as DatabaseUnavailable (the gateway
    answers 503, and keeps ends to book them later); any other error as a BillingError naming it.

    A connection that broke while the worker was idle (the server restarted, a proxy dropped it)
    shows only when the batch is sent on it: what failed on it is booked once more, on a new
    connection (booking is idempotent per request id)."""
    results, reused = _book(asks)
    failed = [i for i, r in enumerate(results) if isinstance(r, (OperationalError, InterfaceError))]
    if reused and failed and not connection.is_usable():
        for i, result in zip(failed, _book([asks[i] for i in failed])[0]):
            results[i] = result
    _remember(asks, results)
    results = [_crossing(r) for r in results]
    return results, events.relayed(), _prices_changed()


_remembered: deque[tuple[float, str]] = deque()  # (when, request id) of the holds remembered here


def _remember(asks: list, results: list[object], now_s: float | None = None) -> None:
    """The holds booked here go in this process's memo of holds in flight (billing.inflight), and
    out once their end is booked: the gateway sends its settlements and releases without their
    hold, which the booking then finds here without a query (a hold booked by a worker before this
    one is read from the ledger). A hold whose end never comes here (another process ends it: a
    Batch API line run by a Celery worker) leaves after `MEMO_S`, as does any hold older than
    that (its end then reads it from the ledger), so the memo holds only what is recent."""
    now_s = time.monotonic() if now_s is None else now_s
    for ask, result in zip(asks, results):
        if isinstance(ask, HoldAsk):
            if isinstance(result, HeldEntry):
                held_remember(result)
                _remembered.append((now_s, result.request_id))
        elif not isinstance(result, BaseException):  # booked (a failed end keeps its hold for the retry)
            held_forget(ask.request_id)
    while _remembered and now_s - _remembered[0][0] > MEMO_S:
        held_forget(_remembered.popleft()[1])


_prices_sent: object = None


def _prices_changed() -> dict[str, UnitPrices] | None:
    """{backend name: UnitPrices} as this process's cache has them, if that is not what was sent last."""
    global _prices_sent
    table = backends_cached()
    if table is None or table is _prices_sent:
        return None
    _prices_sent = table
    return {name: backend.prices for name, backend in table.items()}


def _book(asks: list) -> tuple[list[object], bool]:
    """billing.booking.book's results, and whether they were booked on a connection made before."""
    reused = False
    try:
        close_old_connections()  # recycle an expired connection, or one that failed and does not answer
        reused = connection.connection is not None
        return book(asks), reused
    except Exception as failed:  # the whole batch
        return [failed] * len(asks), reused


def _crossing(result: object) -> object:
    """A result as it crosses back to the gateway."""
    if not isinstance(result, BaseException) or isinstance(result, BillingError):
        return result
    if isinstance(result, (OperationalError, InterfaceError)):
        return DatabaseUnavailable(f"the database is out of reach: {result}")
    return BillingError(f"{type(result).__name__}: {result}")

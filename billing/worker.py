"""The billing worker's process: books the batches a gateway process sends it over a pipe, so
booking never competes with the gateway's event loop for the GIL (the gateway's side, which spawns
it and talks to it without blocking its loop, is gateway.billing_worker).

The protocol: one pickled message each way per batch, ``Connection.send_bytes`` framing (a 4-byte
big-endian signed length and the payload; length -1, then an 8-byte unsigned length, for a message
of 2 GiB or more: `frame_header`, `Frames`). The worker sends `READY` once Django is set up, then,
for each batch of asks (billing.booking), `book_batch`'s answer: the results, the live events
its bookings committed (events.relayed: charges and alerts), for the gateway to send, and the backends' prices
when they changed since the last answer (the gateway prices its clients' ``X-Charge`` with them,
gateway.charging). A batch of None (`STOP`) is a clean stop.

When the gateway dies under it (the pipe ends without `STOP`), the worker books the settlements
its gateway journaled (billing.journal) before it ends, and releases what the gateway still held.

The spawned process imports this module before Django is set up, so nothing here imports Django,
or a module that needs it, at module level.
"""

from __future__ import annotations

import os
import pickle
import struct
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:  # for the types only: nothing here imports Django at module level (see above)
    from billing.pricing import UnitPrices

READY = b"ready"
STOP = pickle.dumps(None, pickle.HIGHEST_PROTOCOL)
ORPHAN_GRACE_S = 120.0  # a worker whose gateway died ends within this, its last bookings done or not
IDLE_S = 0.002  # no ask for this long: time to reload an ageing cache entry (about a millisecond each)
CACHE_CHECK_S = 0.1  # while idle with nothing to reload, how often to look again
MEMO_S = 600.0  # how long the worker remembers a hold it booked, at most (`_remember`)
_SIZE = struct.Struct("!i")  # Connection.send_bytes' frame header
_LONG_SIZE = struct.Struct("!Q")  # after a size of -1
_LONG_MARK = -1
# `book_batch`'s answer: a result per ask (billing.booking.book's, as `_crossing` sends them), the
# committed live events (events.relayed), and the prices ({backend name: UnitPrices}) if they
# changed since the last answer.
BatchAnswer: TypeAlias = "tuple[list[object], dict[tuple[int, str], bytes], dict[str, UnitPrices] | None]"


def frame_header(size: int) -> bytes:
    """The frame header ``Connection.recv_bytes`` expects before ``size`` bytes of payload."""
    if size <= 0x7FFFFFFF:
        return _SIZE.pack(size)
    return _SIZE.pack(_LONG_MARK) + _LONG_SIZE.pack(size)


class Frames:
    """The bytes read from the worker so far, cut into the messages ``send_bytes`` framed."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def partial(self) -> bool:
        """True while part of a message is still to come."""
        return bool(self._buffer)

    def whole(self) -> list[bytes]:
        """The messages complete now, in order (taken out of the buffer)."""
        messages = []
        while (message := self._pop()) is not None:
            messages.append(message)
        return messages

    def _pop(self) -> bytes | None:
        buffer = self._buffer
        if len(buffer) < _SIZE.size:
            return None
        (size,), start = _SIZE.unpack_from(buffer), _SIZE.size
        if size == _LONG_MARK:
            if len(buffer) < start + _LONG_SIZE.size:
                return None
            (size,), start = _LONG_SIZE.unpack_from(buffer, start), start + _LONG_SIZE.size
        elif size < 0:
            raise ValueError(f"a corrupt frame header (size {size})")
        end = start + size
        if len(buffer) < end:
            return None
        with memoryview(buffer) as view:
            message = bytes(view[start:end])
        del buffer[:end]
        return message


# --- in the worker process -------------------------------------------------------------------------


def serve(conn, gateway_pid: int, owner: str = "") -> None:
    """The worker's loop: book each batch; between batches beat for the gateway and sweep the
    holds of dead ones (billing.heartbeats), and reload ageing caches."""
    import signal

    import django

    # A stop signal sent to the whole process group (honcho, systemd) is the gateway's to handle: it
    # ends this worker with `STOP`, after its last bookings and with its clean stop recorded.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    django.setup()
    from django.conf import settings

    import events

    if settings.FAIRGATE_BILLING_WORKER_NICE:
        os.nice(settings.FAIRGATE_BILLING_WORKER_NICE)  # the event loop goes first (see the setting)
    from billing.cache import caches_refresh_one
    from billing.heartbeats import Housekeeper

    events.relay()
    threading.Thread(target=_exit_with, args=(gateway_pid,), daemon=True, name="orphan-check").start()
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
    import logging

    from django.db import close_old_connections

    from billing.booking import book
    from billing.journal import journal_replay

    def booked(asks: list) -> list[object]:
        close_old_connections()  # one that failed is replaced
        return book(asks)

    log = logging.getLogger("fairgate.billing")
    started_s = time.monotonic()
    while os.getppid() == gateway_pid and time.monotonic() - started_s < 5.0:
        time.sleep(0.01)
    if not owner:
        return
    total = 0
    while True:
        done, left = journal_replay(owner, booked)
        total += done
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


def _exit_with(gateway_pid: int) -> None:
    """A worker whose gateway died ends too: once its last bookings are done, or after a grace."""
    while os.getppid() == gateway_pid:
        time.sleep(1.0)
    time.sleep(ORPHAN_GRACE_S)
    os._exit(0)


def book_batch(asks: list) -> BatchAnswer:
    """billing.booking.book, plus its committed live events and the backends' prices if they
    changed since the last answer (`_prices_changed`). Refusals cross back as they
    are (billing's errors pickle); the database out of reach as DatabaseUnavailable (the gateway
    answers 503, and keeps ends to book them later); any other error as a BillingError naming it.

    A connection that broke while the worker was idle (the server restarted, a proxy dropped it)
    shows only when the batch is sent on it: what failed on it is booked once more, on a new
    connection (booking is idempotent per request id)."""
    from django.db import InterfaceError, OperationalError, connection

    results, reused = _book(asks)
    failed = [i for i, r in enumerate(results) if isinstance(r, (OperationalError, InterfaceError))]
    if reused and failed and not connection.is_usable():
        for i, result in zip(failed, _book([asks[i] for i in failed])[0]):
            results[i] = result
    _remember(asks, results)
    import events

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
    from billing.booking import HoldAsk
    from billing.inflight import HeldEntry, held_forget, held_remember

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
    from billing.pricing import backends_cached

    table = backends_cached()
    if table is None or table is _prices_sent:
        return None
    _prices_sent = table
    return {name: backend.prices for name, backend in table.items()}


def _book(asks: list) -> tuple[list[object], bool]:
    """billing.booking.book's results, and whether they were booked on a connection made before."""
    from django.db import close_old_connections, connection

    from billing.booking import book

    reused = False
    try:
        close_old_connections()  # recycle an expired connection, or one that failed and does not answer
        reused = connection.connection is not None
        return book(asks), reused
    except Exception as failed:  # the whole batch
        return [failed] * len(asks), reused


def _crossing(result: object) -> object:
    """A result as it crosses back to the gateway."""
    from django.db import InterfaceError, OperationalError

    from billing.errors import BillingError, DatabaseUnavailable

    if not isinstance(result, BaseException) or isinstance(result, BillingError):
        return result
    if isinstance(result, (OperationalError, InterfaceError)):
        return DatabaseUnavailable(f"the database is out of reach: {result}")
    return BillingError(f"{type(result).__name__}: {result}")

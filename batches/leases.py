"""Leases on sent lines: who runs a granted line again when its worker dies, and when.

A line handed to the workers (`line_sent`) is leased for the hand-off; a worker starts a send at
most once (`line_start`) and renews the lease while it runs (`Renewer`); the feeder sends a line
whose lease lapsed again under a new send number (`lines_watch`), and a line of a gone feeder
goes back to its batch (`lines_of_the_gone_sent`). Why the retry is the feeder's, not the
broker's: docs/batches.md, "Lost workers, lost gateways".
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from batches.models import Batch, BatchLine
from billing.client import hold_release

log = logging.getLogger(__name__)
State = BatchLine.State
MAX_RUNS = 2  # a line whose worker died is run at most once more
WORKER_LOST = {"code": "worker_lost", "message": f"{MAX_RUNS} workers started this line and none finished it."}
EXPIRED = {"code": "batch_expired", "message": "The batch's completion window ended first."}


def _until(ms: int, now: datetime | None = None) -> datetime:
    return (now or timezone.now()) + timedelta(milliseconds=ms)


def line_sent(pk: int, backend: str, ledger_key: str) -> int:
    """Granted: the line is handed to the workers. Returns its send number, or 0 if its batch was
    cancelled (or the line ended) meanwhile: a cancelled batch grants no more."""
    claimed = BatchLine.objects.filter(pk=pk, state=State.CLAIMED, batch__status=Batch.Status.IN_PROGRESS)
    sends = claimed.values_list("sends", flat=True).first()  # the claim is this process's: nobody else sends it
    if sends is None:
        return 0
    lease = _until(settings.FAIRGATE_BATCH_HANDOFF_MS)
    fields = {"backend": backend, "ledger_key": ledger_key, "lease_until": lease}
    return sends + 1 if claimed.update(state=State.SENT, sends=sends + 1, **fields) else 0


def line_start(pk: int, send: int) -> bool:
    """A worker starts send ``send`` of the line: True once per send, for the line's latest send,
    while it is sent and has runs left. Its lease runs from now."""
    return bool(
        BatchLine.objects.filter(pk=pk, state=State.SENT, sends=send, started_send__lt=send, runs__lt=MAX_RUNS).update(
            started_send=send, runs=F("runs") + 1, lease_until=_until(settings.FAIRGATE_BATCH_LEASE_MS)
        )
    )


def leases_renew(runs: dict[int, int]) -> int:
    """The lines ``runs`` (pk -> the send this worker runs) are still running: leased again."""
    if not runs:
        return 0
    running = Q()
    for pk, send in runs.items():
        running |= Q(pk=pk, sends=send, started_send=send)  # a line sent again since is not this run's
    return BatchLine.objects.filter(running, state=State.SENT).update(
        lease_until=_until(settings.FAIRGATE_BATCH_LEASE_MS)
    )


def _release(ledger_key: str, reason: str) -> None:
    if settings.FAIRGATE_BILLING and ledger_key:
        hold_release(request_id=ledger_key, reason=reason)


def _line_give_up(pk: int, lease: datetime | None, state: str, error: dict) -> bool:
    """Ends a sent line nobody runs any more (its lease ``lease`` lapsed) and releases its hold, in
    one transaction; False if a worker took it up meanwhile."""
    with transaction.atomic():
        line = BatchLine.objects.select_for_update().filter(pk=pk, state=State.SENT, lease_until=lease).first()
        if line is None:
            return False
        _release(line.ledger_key, error["code"])
        line.state, line.error, line.ended_at = state, error, timezone.now()
        line.save(update_fields=["state", "error", "ended_at"])
        return True


Ended = tuple[str, int, int]  # state, prompt tokens, completion tokens


def lines_watch(pks: Iterable[int]) -> tuple[dict[int, Ended], list[tuple[int, int]]]:
    """The feeder's sent lines ``pks``: those no longer sent (pk -> how they ended), and those whose
    lease lapsed, sent again here: [(pk, send)] for the feeder to hand to the workers. A lapsed line
    that MAX_RUNS workers started fails, and one past its batch's window expires (holds released)."""
    now = timezone.now()
    ended: dict[int, Ended] = {}
    again: list[tuple[int, int]] = []
    rows = BatchLine.objects.filter(pk__in=list(pks)).values_list(
        "pk", "state", "prompt_tokens", "completion_tokens", "lease_until", "sends", "runs", "batch__expires_at"
    )
    for pk, state, prompt_tokens, completion_tokens, lease, sends, runs, expires_at in rows:
        if state != State.SENT:
            ended[pk] = (state, prompt_tokens, completion_tokens)
        elif lease is not None and lease >= now:  # (None: sent before leases existed, taken as lapsed)
            continue
        elif runs >= MAX_RUNS or expires_at <= now:
            state, error = (State.FAILED, WORKER_LOST) if runs >= MAX_RUNS else (State.EXPIRED, EXPIRED)
            if _line_give_up(pk, lease, state, error):
                log.warning("batch line %s: %s", pk, error["message"])
                ended[pk] = (state, 0, 0)
        elif BatchLine.objects.filter(pk=pk, state=State.SENT, sends=sends, lease_until=lease).update(
            sends=sends + 1, lease_until=_until(settings.FAIRGATE_BATCH_HANDOFF_MS, now)
        ):
            log.warning("batch line %s: no worker has it (run %s of at most %s); sent again", pk, runs, MAX_RUNS)
            again.append((pk, sends + 1))
    return ended, again


def lines_of_the_gone_sent(released_owners) -> int:
    """Sent lines of gateway processes that are gone, whose leases lapsed (no worker runs them):
    back to their batch (fed again under a new id and hold), or ended if they ran MAX_RUNS times or
    their batch's window is over (their holds went with their process). Returns how many moved."""
    now = timezone.now()
    lapsed = BatchLine.objects.filter(
        Q(lease_until__lt=now) | Q(lease_until__isnull=True), state=State.SENT, owner__in=released_owners
    )
    moved = lapsed.filter(runs__gte=MAX_RUNS).update(state=State.FAILED, error=WORKER_LOST, ended_at=now)
    moved += lapsed.filter(batch__expires_at__lte=now).update(state=State.EXPIRED, error=EXPIRED, ended_at=now)
    return moved + lapsed.update(state=State.PENDING, owner="", backend="", ledger_key="", lease_until=None)


class Renewer:
    """A worker process's running lines, leased again every quarter lease by one thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[int, int] = {}
        self._pid = 0  # the process whose thread runs (a forked pool child starts its own)

    @contextmanager
    def holding(self, pk: int, send: int) -> Iterator[None]:
        with self._lock:
            self._runs[pk] = send
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._renew, name="batch-leases", daemon=True).start()
        try:
            yield
        finally:
            with self._lock:
                self._runs.pop(pk, None)

    def _renew(self) -> None:
        period_s = settings.FAIRGATE_BATCH_LEASE_MS / 4000
        stop = threading.Event()
        while not stop.wait(period_s):
            with self._lock:
                runs = dict(self._runs)
            if not runs:
                continue
            try:
                close_old_connections()  # a connection the database dropped is opened again
                leases_renew(runs)
            except Exception as failed:  # the next round tries again; the lease covers three misses
                log.warning("could not renew the leases of %s batch lines: %r", len(runs), failed)


renewer = Renewer()

"""Which gateway processes are alive, for billing: a crash leaves nothing held.

Every gateway process names its owner id on the holds it books, and its billing worker beats for
it (``GatewayProcess.beat_at``). A process silent for ``FAIRGATE_PROCESS_DEAD_AFTER_S``, or
stopped cleanly, is dead for billing: the next sweep releases its open holds. Holds with no owner
to ask are released once older than ``FAIRGATE_BILLING_STALE_HOLD_S``. Why a live process never
loses its holds: docs/billing-and-console.md ("a process killed").
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from billing.booking import book
from billing.booking_asks import OWNER_GONE_REASON, STALE_REASON, ReleaseAsk
from billing.models import GatewayProcess, LedgerEntry

log = logging.getLogger("fairgate.billing")
Kind = LedgerEntry.Kind
_owner: str | None = None


def process_owner() -> str:
    """This process's owner id, made once: ``host:pid:tag``."""
    global _owner
    if _owner is None:
        _owner = f"{socket.gethostname()[:60]}:{os.getpid()}:{secrets.token_hex(4)}"
    return _owner


def owners_released():
    """The owners (as a ``values("owner")`` query) of gateway processes whose holds were released:
    dead for billing, or stopped."""
    return GatewayProcess.objects.filter(released_at__isnull=False).values("owner")


def dead_after() -> timedelta:
    return timedelta(seconds=settings.FAIRGATE_PROCESS_DEAD_AFTER_S)


def heartbeat_beat(*, owner: str, pid: int, recovered: bool = False, now: datetime | None = None) -> None:
    """The process ``owner`` is alive now. ``recovered``: its previous beat failed."""
    now = now or timezone.now()
    fields = {"beat_at": now, "released_at": None, "stopped_at": None}
    if recovered:
        fields["recovered_at"] = now
    if not GatewayProcess.objects.filter(owner=owner).update(**fields):
        GatewayProcess.objects.create(
            owner=owner,
            host=owner.split(":", 1)[0],
            pid=pid,
            started_at=now,
            recovered_at=now if recovered else None,
            beat_at=now,
        )


def heartbeat_stop(*, owner: str) -> None:
    """A clean stop: whatever it still holds may be released at once."""
    GatewayProcess.objects.filter(owner=owner).update(stopped_at=timezone.now())


def processes_dead(*, now: datetime | None = None) -> list[str]:
    """Owners dead for billing whose holds were not released yet; none while any process
    recovered from an outage within the bound (the others may not have beaten again yet)."""
    now = now or timezone.now()
    cutoff = now - dead_after()
    if GatewayProcess.objects.filter(recovered_at__gt=cutoff).exists():
        return []
    gone = Q(beat_at__lt=cutoff) | Q(stopped_at__isnull=False)
    return list(GatewayProcess.objects.filter(gone, released_at__isnull=True).values_list("owner", flat=True))


def _open_holds(owner: str) -> list[str]:
    released = LedgerEntry.objects.filter(kind=Kind.RELEASE, request_id=OuterRef("request_id"))
    return list(
        LedgerEntry.objects.filter(kind=Kind.HOLD, owner=owner)
        .filter(~Exists(released))
        .order_by("pk")
        .values_list("request_id", flat=True)
    )


def holds_release_orphaned(*, now: datetime | None = None) -> int:
    """Release the open holds of every process dead for billing; returns how many."""
    now = now or timezone.now()
    total = 0
    for owner in processes_dead(now=now):
        request_ids = _open_holds(owner)
        results = book([ReleaseAsk(request_id=rid, reason=OWNER_GONE_REASON, at=now) for rid in request_ids])
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            log.error(
                "could not release %s holds of %s (the next sweep tries again): %s", len(failed), owner, failed[0]
            )
            continue
        GatewayProcess.objects.filter(owner=owner, released_at__isnull=True).update(released_at=now)
        released = sum(r is True for r in results)
        total += released
        if released:
            log.warning("gateway process %s is gone: released its %s open holds", owner, released)
    return total


def unowned_hold_age() -> timedelta:
    return timedelta(seconds=settings.FAIRGATE_BILLING_STALE_HOLD_S)


def holds_release_unowned(*, older_than: timedelta | None = None, now: datetime | None = None) -> int:
    """Release the open holds older than ``older_than`` (default ``unowned_hold_age``) that have no
    owner whose heartbeat could tell whether it lives; returns how many."""
    now = now or timezone.now()
    cutoff = now - (unowned_hold_age() if older_than is None else older_than)
    released = LedgerEntry.objects.filter(kind=Kind.RELEASE, request_id=OuterRef("request_id"))
    beating = GatewayProcess.objects.filter(owner=OuterRef("owner"))
    request_ids = list(
        LedgerEntry.objects.filter(kind=Kind.HOLD, at__lt=cutoff)
        .filter(Q(owner="") | ~Exists(beating))
        .filter(~Exists(released))
        .order_by("pk")
        .values_list("request_id", flat=True)
    )
    results = book([ReleaseAsk(request_id=rid, reason=STALE_REASON, at=now) for rid in request_ids])
    for failed in (r for r in results if isinstance(r, BaseException)):
        log.error("could not release an unowned hold (the next sweep tries again): %s", failed)
    count = sum(r is True for r in results)
    if count:
        log.warning("released %s holds with no owner, older than %s", count, cutoff)
    return count


def holds_release_leftovers(*, now: datetime | None = None) -> int:
    """Every sweep's work: the holds of dead owners, then those with no owner past their age."""
    now = now or timezone.now()
    return holds_release_orphaned(now=now) + holds_release_unowned(now=now)


class Housekeeper:
    """Beats for one gateway process and sweeps for the dead, from its billing worker's loop:
    ``tick`` is cheap when nothing is due. Database errors are logged and tried again."""

    def __init__(self, *, owner: str, pid: int) -> None:
        self.owner = owner
        self.pid = pid
        self.beat_due_s = 0.0
        self.sweep_due_s = 0.0
        self.failing = False

    def tick(self, now_s: float) -> None:
        if now_s >= self.beat_due_s:
            self.beat_due_s = now_s + settings.FAIRGATE_HEARTBEAT_S
            self._run(lambda: heartbeat_beat(owner=self.owner, pid=self.pid, recovered=self.failing))
        if now_s >= self.sweep_due_s and not self.failing:
            self.sweep_due_s = now_s + settings.FAIRGATE_ORPHAN_SWEEP_S
            self._run(holds_release_orphaned)

    def _run(self, work) -> None:
        try:
            close_old_connections()
            work()
        except DatabaseError as failed:
            if not self.failing:
                log.warning("billing housekeeping cannot reach the database (%s); trying again", failed)
            self.failing = True
            return
        self.failing = False

    def stop(self) -> None:
        """The process ended (cleanly, or its worker saw it die): what it still holds is released now."""
        self._run(lambda: heartbeat_stop(owner=self.owner))
        if not self.failing:
            self._run(holds_release_orphaned)

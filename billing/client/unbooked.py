"""Ends of requests (settlements, releases) that could not be booked: kept until they are.

A settlement whose booking fails (the database is down) is sent again every ``RETRY_S`` until
booked; then the journal (billing.journal) lets its line go. Releases are retried the same way,
not journaled (the heartbeat sweep releases a dead process's holds anyway). Journals of dead
processes on this host are adopted at start and every ``ADOPT_S``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from billing.booking_asks import Ask, SettleAsk
from billing.client import metrics
from billing.errors import transient
from billing.heartbeats import process_owner
from billing.journal import Journal

log = logging.getLogger("gateway.unbooked")  # the name its log lines have always had
RETRY_S = 1.0
ADOPT_S = 10.0  # how often to look for journals left by dead processes on this host


class Unbooked:
    def __init__(self, resubmit: Callable[[Ask], None]) -> None:
        self._resubmit = resubmit
        self._asks: dict[str, Ask] = {}
        self._journal: Journal | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._adopting: asyncio.TimerHandle | None = None

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            self._journal = Journal(process_owner())
        return self._journal

    def __len__(self) -> int:
        return len(self._asks)

    def failed(self, ask: Ask, error: BaseException) -> None:
        """``ask`` could not be booked: keep it and retry, unless retrying cannot help."""
        rid = ask.request_id
        if not transient(error):
            log.error("could not book %s of %s, and retrying cannot help: %r", type(ask).__name__, rid, error)
            self.booked(ask)  # nothing more to do for it
            return
        if rid not in self._asks:
            self._asks[rid] = ask
            metrics.BILLING_UNBOOKED.set(len(self._asks))
            log.warning(
                "could not book %s of %s (%r): kept, retrying every %ss", type(ask).__name__, rid, error, RETRY_S
            )
        self._retry_soon()

    def booked(self, ask: Ask) -> None:
        """Booked, or past help."""
        if isinstance(ask, SettleAsk) and self._journal is not None:
            self._journal.booked(ask.request_id)
        if self._asks.pop(ask.request_id, None) is None:
            return
        metrics.BILLING_UNBOOKED.set(len(self._asks))
        if not self._asks:
            log.warning("every kept billing ask is booked now")

    def adopt_orphans(self) -> int:
        """Take over the journals of dead processes on this host, now and every ``ADOPT_S``;
        returns the settlements adopted now."""
        if self._adopting is not None:
            self._adopting.cancel()
        self._adopting = asyncio.get_running_loop().call_later(ADOPT_S, self.adopt_orphans)
        fresh = [ask for ask in self.journal.adopt() if ask.request_id not in self._asks]
        if fresh:
            self._asks.update((ask.request_id, ask) for ask in fresh)
            metrics.BILLING_UNBOOKED.set(len(self._asks))
            log.warning("adopted %s unbooked settlements from journals of processes that are gone", len(fresh))
            self._retry_soon()
        return len(fresh)

    def _retry_soon(self, after_s: float = RETRY_S) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(after_s, self._retry)

    def _retry(self) -> None:
        self._timer = None
        for ask in list(self._asks.values()):
            self._resubmit(ask)

    def close(self) -> None:
        """At a clean stop: the journal keeps what is not booked for the next start on this host."""
        for timer in (self._timer, self._adopting):
            if timer is not None:
                timer.cancel()
        self._timer = self._adopting = None
        if self._journal is not None:
            self._journal.close()
            self._journal = None

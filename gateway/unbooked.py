"""Ends of requests (settlements, releases) that could not be booked: kept until they are.

While the database is down a served request's settlement cannot be booked. The Booker hands it
here: it is journaled (gateway.journal, on disk before the client gets its last byte) and sent
again every ``RETRY_S`` while the process lives, until booked; then its journal line is marked
done. Releases are retried the same way but not journaled: if this process dies, its holds are
released by the heartbeat sweep (billing.heartbeats) anyway. A refusal that retrying cannot
change (a billing error other than the database being out) is logged and dropped.

At start, journals left by dead processes on this host are adopted: their settlements are
copied into this process's journal, the old file removed, and booked like its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from billing.booking import Ask, SettleAsk
from billing.errors import BillingError, DatabaseUnavailable
from billing.heartbeats import process_owner
from gateway import metrics
from gateway.journal import Journal, journal_retire, journals_orphaned

log = logging.getLogger(__name__)
RETRY_S = 1.0


def transient(error: BaseException) -> bool:
    """A failure that may not recur: the database out, the billing worker gone."""
    return isinstance(error, DatabaseUnavailable) or not isinstance(error, BillingError)


class Unbooked:
    def __init__(self, resubmit: Callable[[Ask], None]) -> None:
        self._resubmit = resubmit
        self._asks: dict[str, Ask] = {}
        self._journal: Journal | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            self._journal = Journal(process_owner())
        return self._journal

    def __len__(self) -> int:
        return len(self._asks)

    def failed(self, ask: Ask, error: BaseException) -> None:
        """``ask`` could not be booked: keep it (a settlement durably) and retry, unless retrying
        cannot help."""
        rid = ask.request_id
        if not transient(error):
            log.error("could not book %s of %s, and retrying cannot help: %r", type(ask).__name__, rid, error)
            self._forget(ask)  # nothing more to do for it
            return
        if rid not in self._asks:
            if isinstance(ask, SettleAsk):
                self.journal.keep([ask])
            self._asks[rid] = ask
            metrics.BILLING_UNBOOKED.set(len(self._asks))
            log.warning(
                "could not book %s of %s (%r): kept, retrying every %ss", type(ask).__name__, rid, error, RETRY_S
            )
        self._retry_soon()

    def booked(self, ask: Ask) -> None:
        if self._forget(ask) and not self._asks:
            log.warning("every kept billing ask is booked now")

    def _forget(self, ask: Ask) -> bool:
        """No longer kept (booked, or past help); whether it was."""
        if self._asks.pop(ask.request_id, None) is None:
            return False
        metrics.BILLING_UNBOOKED.set(len(self._asks))
        if isinstance(ask, SettleAsk):
            self.journal.done([ask.request_id])
        return True

    def adopt_orphans(self) -> int:
        """Take over the journals of dead processes on this host; returns the settlements adopted."""
        adopted = 0
        for path, fd, asks in journals_orphaned():
            fresh = [ask for ask in asks if ask.request_id not in self._asks]
            if fresh:
                self.journal.keep(fresh)
                self._asks.update((ask.request_id, ask) for ask in fresh)
            journal_retire(path, fd)
            adopted += len(fresh)
        if adopted:
            metrics.BILLING_UNBOOKED.set(len(self._asks))
            log.warning("adopted %s unbooked settlements from journals of processes that are gone", adopted)
            self._retry_soon()
        return adopted

    def _retry_soon(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(RETRY_S, self._retry)

    def _retry(self) -> None:
        self._timer = None
        for ask in list(self._asks.values()):
            self._resubmit(ask)

    def close(self) -> None:
        """At a clean stop: a journal with nothing pending is removed; one with pending
        settlements stays for the next start on this host."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._journal is not None:
            pending = any(isinstance(ask, SettleAsk) for ask in self._asks.values())
            if not pending:
                self._journal.path.unlink(missing_ok=True)
            self._journal.close()
            self._journal = None

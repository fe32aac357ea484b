"""Downgrade events: recorded on the hot path into a buffer, written in batches off it, and
published (events.publish_on_commit) for the console once written."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from events import publish_on_commit
from gateway.db import db_call, log_failure
from gateway.models import DowngradeEvent

log = logging.getLogger(__name__)
MAX_BUFFERED = 50_000
DOWNGRADE = "downgrade"  # the live event's kind


@dataclass(frozen=True)
class Downgrade:
    tenant_id: int
    request_id: str
    from_class: str
    to_class: str
    rule: str
    at: datetime

    def as_news(self) -> dict[str, str]:
        """The live event's payload (the console's row)."""
        return {
            "request_id": self.request_id,
            "from": self.from_class,
            "to": self.to_class,
            "rule": self.rule,
            "at": self.at.isoformat(),
        }


class DowngradeLog:
    def __init__(self) -> None:
        self._pending: list[Downgrade] = []

    def record(self, *, tenant_id: int, request_id: str, from_class: str, to_class: str, rule: str) -> None:
        if len(self._pending) < MAX_BUFFERED:
            self._pending.append(Downgrade(tenant_id, request_id, from_class, to_class, rule, timezone.now()))
        else:
            log.warning("downgrade event buffer full: dropping the event of %s", request_id)

    async def flush(self) -> int:
        if not self._pending:
            return 0
        batch, self._pending = self._pending, []
        try:
            await db_call(_write)(batch)
        except Exception:  # the database may be briefly unavailable: keep the events for next time
            log_failure(log, "could not store %d downgrade events; retrying", len(batch))
            self._pending = batch + self._pending
            return 0
        return len(batch)


def _write(batch: list[Downgrade]) -> None:
    DowngradeEvent.objects.bulk_create(
        DowngradeEvent(
            tenant_id=d.tenant_id,
            request_id=d.request_id,
            from_class=d.from_class,
            to_class=d.to_class,
            rule=d.rule,
            at=d.at,
        )
        for d in batch
    )
    for d in batch:
        publish_on_commit(DOWNGRADE, d.tenant_id, d.as_news())

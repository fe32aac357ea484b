"""A gateway Booker whose billing worker is a test double: the tests of the billing seam
(gateway.charging) book through it without a worker process or a database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from billing import client
from billing.client import group_commit
from billing.inflight import held_clear


@contextmanager
def booker_with(worker, *, tmp_path, settings, monkeypatch, **overrides) -> Iterator[client.Booker]:
    """Billing on, the journal under ``tmp_path``, ``overrides`` as settings (e.g.
    FAIRGATE_EARLY_HOLDS=False); the process's Booker is a fresh one whose batches go to ``worker``
    (an object with ``dead`` and ``send(asks, on_answer)``)."""
    settings.VAR_DIR = tmp_path
    settings.FAIRGATE_BILLING = True
    for name, value in overrides.items():
        setattr(settings, name, value)
    books = client.Booker()
    monkeypatch.setattr(group_commit, "_booker", books)
    monkeypatch.setattr(books, "_ready_worker", lambda: worker)
    held_clear()
    try:
        yield books
    finally:
        held_clear()
        books.unbooked.close()
        client.budget_room_memo.clear()

"""Committed live events as a billing worker sends them to its gateway (events.Committed): packed
per tenant and kind, so the gateway's console publisher unpacks only the tenants watched there,
and finance still hears of every tenant charged. (Replaces the pickled `billing.news.Charges`.)"""

from __future__ import annotations

from console.live.hooks import console_event
from console.live.publisher import Publisher
from events import Committed, Event


def _charge(tenant_id: int, request_id: str) -> Event:
    return Event("charge", tenant_id, {"request_id": request_id})


def test_committed_keeps_every_event_grouped_by_tenant_and_kind():
    committed = Committed(Committed.of_events([_charge(1, "a"), _charge(2, "b"), _charge(1, "c")]).packed())
    assert sorted(committed.keys()) == [(1, "charge"), (2, "charge")]
    assert [e.payload["request_id"] for e in committed.of((1, "charge"))] == ["a", "c"]
    assert sorted(e.payload["request_id"] for e in committed) == ["a", "b", "c"]
    assert committed and not Committed.of_events([])


def test_the_publisher_makes_rows_only_for_watched_tenants_and_tells_finance_of_all():
    publisher = Publisher(layer=object())
    publisher.watched[1] += 1
    committed = Committed(Committed.of_events([_charge(1, "a"), _charge(2, "b"), _charge(1, "c")]).packed())
    committed.groups[(2, "charge")] = b"\xc1 not msgpack: an unwatched tenant is never unpacked"
    made = []

    def row(event):
        made.append(event.payload["request_id"])
        return console_event(event)

    publisher.add_committed(committed, row)
    assert made == ["a", "c"]
    assert publisher.pending == {1: {"charges": [{"request_id": "a"}, {"request_id": "c"}]}}
    assert publisher.finance_pending == {1, 2}

"""The charges a billing worker sends its gateway go pickled per tenant (billing.news.Charges): the
gateway's console publisher unpickles only the tenants watched there, and finance still hears of
every tenant charged."""

from __future__ import annotations

from types import SimpleNamespace

from billing.news import Charges
from console.live.publisher import Publisher


def _entry(tenant_id: int, request_id: str) -> SimpleNamespace:
    return SimpleNamespace(tenant_id=tenant_id, request_id=request_id)


def test_charges_keep_every_entry_grouped_by_tenant():
    charges = Charges.of([_entry(1, "a"), _entry(2, "b"), _entry(1, "c")])
    assert sorted(charges.tenant_ids) == [1, 2]
    assert [e.request_id for e in charges.of_tenant(1)] == ["a", "c"]
    assert sorted(e.request_id for e in charges) == ["a", "b", "c"]
    assert charges and not Charges.of([])


def test_the_publisher_makes_rows_only_for_watched_tenants_and_tells_finance_of_all():
    publisher = Publisher(layer=object())
    publisher.watched[1] += 1
    charges = Charges.of([_entry(1, "a"), _entry(2, "b"), _entry(1, "c")])
    charges.packed[2] = b"not a pickle: an unwatched tenant is never unpickled"
    made = []
    publisher.add_charges(charges, lambda entry: made.append(entry.request_id) or entry.request_id)
    assert made == ["a", "c"]
    assert publisher.pending == {1: {"charges": ["a", "c"]}}
    assert publisher.finance_pending == {1, 2}

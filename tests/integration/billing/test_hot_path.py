"""The hot path's cost and its caches: a batch of asks costs the statements of one ask, and what
is cached never lets a stale price, limit or hold through.

`book` runs a fixed set of statements per batch, whatever its size: lock the budget rows, read
the requests' entries, re-read the batch's price versions (only when it holds), append the
entries (on PostgreSQL one COPY, which Django does not count; elsewhere one INSERT per
INSERT_ROWS entries), one UPDATE of the moved budget rows (executemany elsewhere: one query as
Django counts), plus SAVEPOINT/RELEASE inside the test's transaction (BEGIN/COMMIT in the gateway).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal as D

import pytest
from django.db import transaction
from django.utils import timezone

from billing import cache
from billing.booking import book
from billing.booking_asks import Charged, HoldAsk, ReleaseAsk, SettleAsk
from billing.errors import BudgetExhausted, HoldNotFound
from billing.heartbeats import holds_release_unowned
from billing.inflight import HeldEntry, held_get, held_get_cached
from billing.models import Budget, LedgerEntry, PriceVersion, TenantBilling
from billing.selectors import ledger_mismatches
from billing.services import hold_release
from billing.statements import INSERT_ROWS
from scheduling.models import Backend
from tenants.models import Tenant
from tests.integration.billing.helpers import hold, settle, year_budget

PER_BATCH = 6  # SAVEPOINT, lock, entries so far, price versions, UPDATE, RELEASE; plus the INSERTs:
ASKS = 200


def inserts(entries: int) -> int:
    from django.db import connection

    # PostgreSQL: a COPY is not counted; the plans' SET LOCAL (statements.CUSTOM_PLANS_SQL) is, in the lock's round trip
    return 1 if connection.vendor == "postgresql" else -(-entries // INSERT_ROWS)


def _holds(prefix: str, n: int, *, tenant: str = "alpha") -> list[HoldAsk]:
    now = timezone.now()
    return [
        HoldAsk(
            request_id=f"{prefix}{i}",
            tenant_slug=tenant,
            class_name="INTERACTIVE",
            model="m",
            prompt_tokens=1000,
            max_output_tokens=500,
            at=now,
        )
        for i in range(n)
    ]


@pytest.mark.django_db
def test_a_batch_costs_the_statements_of_one_ask(
    world, django_assert_max_num_queries, django_capture_on_commit_callbacks
):
    hold("warm-up")  # fills the caches
    with django_capture_on_commit_callbacks(execute=True), django_assert_max_num_queries(PER_BATCH + inserts(ASKS)):
        held = book(_holds("r", ASKS))
    assert all(isinstance(h, HeldEntry) for h in held)
    now = timezone.now()
    settles = [  # each with its hold, as the serving process sends it (gateway.charging): no hold is read
        SettleAsk(
            request_id=f"r{i}", backend_name="gpu-b", prompt_tokens=1000, completion_tokens=200, at=now, held=held[i]
        )
        for i in range(ASKS // 2)
    ]
    releases = [
        ReleaseAsk(request_id=f"r{i}", reason="cancelled", at=now, held=held[i]) for i in range(ASKS // 2, ASKS)
    ]
    with django_assert_max_num_queries(PER_BATCH - 1 + inserts(3 * ASKS // 2)):  # no holds: no price check
        results = book(settles + releases)
    assert results == [Charged(D("1.12"))] * (ASKS // 2) + [True] * (ASKS // 2)
    budget = year_budget("alpha")
    assert (budget.spent, budget.held) == (D("1.12") * (ASKS // 2), D("3.2"))  # the warm-up is still held
    assert ledger_mismatches() == []


@pytest.mark.django_db
def test_a_batch_decides_in_order_and_refusals_do_not_fail_the_others(world):
    Tenant.objects.filter(slug="alpha").update(annual_budget=D("10"))  # room for three holds of 3.2
    asks = _holds("a", 5)
    asks.insert(2, asks[0])  # a retried admission inside the batch: the first hold stands
    results = book(asks + _holds("b", 2, tenant="beta"))
    assert [type(r).__name__ for r in results] == ["HeldEntry"] * 4 + ["BudgetExhausted"] * 2 + ["HeldEntry"] * 2
    assert results[2] == results[0]
    assert results[4].remaining == D("0.4") and results[4].needed == D("3.2")
    assert year_budget("alpha").held == D("9.6") and year_budget("beta").held == D("6.4")
    assert LedgerEntry.objects.filter(kind="hold", tenant__slug="alpha").count() == 3
    assert ledger_mismatches() == []


@pytest.mark.django_db
def test_settle_and_release_of_one_request_in_one_batch_end_it_once(world):
    hold("r1")
    now = timezone.now()
    results = book(
        [
            SettleAsk(request_id="r1", backend_name="gpu-b", prompt_tokens=1000, completion_tokens=200, at=now),
            ReleaseAsk(request_id="r1", reason="cancelled", at=now),
            SettleAsk(request_id="r1", backend_name="gpu-b", prompt_tokens=1000, completion_tokens=200, at=now),
        ]
    )
    assert results == [Charged(D("1.12")), False, Charged(D("1.12"))]
    assert sorted(LedgerEntry.objects.filter(request_id="r1").values_list("kind", flat=True)) == [
        "charge",
        "hold",
        "release",
    ]
    assert (year_budget("alpha").spent, year_budget("alpha").held) == (D("1.12"), D("0"))


@pytest.mark.django_db
def test_a_monthly_cap_moves_both_rows_in_the_same_statements(world, django_assert_max_num_queries):
    TenantBilling.objects.create(tenant=world["alpha"], monthly_cap=D("100"))
    hold("warm-up")
    with django_assert_max_num_queries(PER_BATCH + 1):
        book(_holds("r", 10))
    month = Budget.objects.get(tenant__slug="alpha", kind="month")
    assert month.held == year_budget("alpha").held == D("35.2")


@pytest.mark.django_db
def test_a_price_change_made_elsewhere_applies_to_the_next_admission(world):
    hold("before")  # caches INTERACTIVE's versions
    # Another process's change: no signal reaches this process's caches.
    PriceVersion.objects.bulk_create(
        [
            PriceVersion(
                priority_class_id=PriceVersion.objects.first().priority_class_id,
                price_factor=D("3"),
                effective_at=timezone.now(),
                created_by="x",
            )
        ]
    )
    cls = PriceVersion.objects.order_by("-pk").first().priority_class.name
    result = hold("after", cls=cls)
    assert result.factor == D("3")
    assert LedgerEntry.objects.get(request_id="after").price_version_id == PriceVersion.objects.order_by("-pk")[0].pk


@pytest.mark.django_db
def test_a_budget_changed_elsewhere_applies_to_the_next_hold(world):
    hold("r1")  # caches alpha's budget row
    Tenant.objects.filter(slug="alpha").update(annual_budget=D("5"))  # no signal: as from another process
    with pytest.raises(BudgetExhausted) as info:
        hold("r2")
    assert info.value.remaining == D("1.8")
    assert year_budget("alpha").limit == D("5")  # the row's copy of the limit follows too
    Tenant.objects.filter(slug="alpha").update(annual_budget=D("7"))
    hold("r3")


@pytest.mark.django_db
def test_a_monthly_cap_set_elsewhere_applies_within_the_cache_lifetime(world, monkeypatch):
    hold("r1")
    TenantBilling.objects.bulk_create([TenantBilling(tenant=world["alpha"], monthly_cap=D("4"))])  # no signal
    clock = [cache.time.monotonic() + cache.CACHE_TTL_S + 0.01]
    monkeypatch.setattr(cache.time, "monotonic", lambda: clock[0])
    hold("r2")  # the month budget starts at this hold: 3.2 of 4
    with pytest.raises(BudgetExhausted) as info:
        hold("r3")
    assert "month" in info.value.budget_label


@pytest.mark.django_db
def test_backend_prices_are_reread_after_the_cache_lifetime(world, monkeypatch):
    hold("r1")
    assert settle("r1") == D("1.12")
    Backend.objects.filter(name="gpu-b").update(input_price_per_1k=D("1"))  # no signal
    clock = [cache.time.monotonic() + cache.CACHE_TTL_S + 0.01]
    monkeypatch.setattr(cache.time, "monotonic", lambda: clock[0])
    hold("r2")
    assert settle("r2") == D("1.92")  # (1 + 0.2) × 1.6


@pytest.mark.django_db
def test_a_change_saved_in_this_process_applies_at_once(world):
    hold("r1")
    Backend.objects.filter(name="gpu-a").update(enabled=False)  # no signal: the cached upper bound stands
    assert hold("r2").amount == D("3.2")
    backend = Backend.objects.get(name="gpu-a")
    backend.save()  # a save in this process (admin, console) drops the caches
    assert hold("r3").amount == D("1.6")  # gpu-b: 0.5 + 0.5 = 1.0 × 1.6


@pytest.mark.django_db
def test_a_hold_rolled_back_is_not_remembered(world):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            hold("ghost")
            raise RuntimeError("the caller's transaction fails")
    assert held_get("ghost") is None
    with pytest.raises(HoldNotFound):
        settle("ghost")


@pytest.mark.django_db
def test_the_booking_keeps_no_memo_of_holds(world, django_capture_on_commit_callbacks):
    """The memo is the serving process's (gateway.charging); the billing worker's booking keeps none."""
    with django_capture_on_commit_callbacks(execute=True):
        held = book(_holds("m", 2))
    assert all(isinstance(h, HeldEntry) for h in held)
    assert held_get_cached("m0") is None and held_get_cached("m1") is None
    assert held_get("m0") == held[0]  # read from the ledger


@pytest.mark.django_db
def test_the_billing_worker_remembers_the_holds_it_booked_until_their_end(
    world, django_capture_on_commit_callbacks, django_assert_max_num_queries
):
    """The gateway sends its ends without their hold: its billing worker remembers what it booked
    (billing.worker `book_batch`, as `_remember`), so the booking finds each hold with no read of
    the ledger, and forgets it once the end is booked."""
    from billing.worker_loop import _remember

    asks: list = _holds("w", 2)
    with django_capture_on_commit_callbacks(execute=True):
        held = book(asks)
    _remember(asks, held)
    assert held_get_cached("w0") == held[0] and held_get_cached("w1") == held[1]
    now = timezone.now()
    asks = [
        SettleAsk(request_id="w0", backend_name="gpu-b", prompt_tokens=1000, completion_tokens=200, at=now),
        ReleaseAsk(request_id="w1", reason="cancelled", at=now),
    ]
    with django_capture_on_commit_callbacks(execute=True), django_assert_max_num_queries(PER_BATCH - 1 + inserts(3)):
        results = book(asks)  # a hold read from the ledger would be a query each
    _remember(asks, results)
    assert results == [Charged(D("1.12")), True]
    assert held_get_cached("w0") is None and held_get_cached("w1") is None
    assert ledger_mismatches() == []


@pytest.mark.django_db
def test_the_billing_worker_forgets_holds_older_than_its_memo_keeps(
    world, django_capture_on_commit_callbacks, monkeypatch
):
    """A hold whose end never reaches the worker (another process ends it) leaves its memo after
    MEMO_S; an end that comes later still finds it, in the ledger."""
    from billing import worker_loop as worker

    monkeypatch.setattr(worker, "_remembered", worker.deque())
    asks: list = _holds("old", 1)
    with django_capture_on_commit_callbacks(execute=True):
        held = book(asks)
    worker._remember(asks, held, now_s=1000.0)
    worker._remember([], [], now_s=1000.0 + worker.MEMO_S / 2)
    assert held_get_cached("old0") == held[0]
    worker._remember([], [], now_s=1001.0 + worker.MEMO_S)
    assert held_get_cached("old0") is None
    assert settle("old0") == D("1.12")


@pytest.mark.django_db
def test_settling_from_another_process_reads_the_hold_from_the_ledger(world, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        hold("r1")
    assert held_get("r1") is not None
    cache.caches_invalidate()  # also forgets the in-flight holds, as a process that did not admit it
    assert settle("r1") == D("1.12")
    assert settle("r1") == D("1.12")  # and a retry still charges once
    assert LedgerEntry.objects.filter(request_id="r1", kind="charge").count() == 1


@pytest.mark.django_db
def test_a_late_settlement_after_the_stale_sweep_charges_once(world):
    hold("slow", at=timezone.now() - timedelta(hours=3))
    assert holds_release_unowned(older_than=timedelta(hours=2)) == 1
    assert settle("slow") == settle("slow") == D("1.12")
    hold_release(request_id="slow", reason="cancelled")  # changes nothing now
    budget = year_budget("alpha")
    assert (budget.spent, budget.held) == (D("1.12"), D("0"))
    assert ledger_mismatches() == []


@pytest.mark.django_db
def test_an_id_whose_request_ended_unserved_may_be_sent_again_and_a_served_one_is_refused(world):
    from billing.errors import RequestIdUsed

    first = hold("r1")
    hold_release(request_id="r1", reason="queue_full")  # refused: the client retries with the same id
    second = hold("r1")
    assert (first.request_id, second.request_id) == ("r1", "r1#2")  # the attempts are told apart
    hold_release(request_id="r1#2", reason="queue_timeout")
    third = hold("r1")
    assert third.request_id == "r1#3"
    assert settle("r1#3") == D("1.12")
    with pytest.raises(RequestIdUsed):  # served: the id stays spent
        hold("r1")
    assert (year_budget("alpha").spent, year_budget("alpha").held) == (D("1.12"), D("0"))
    assert ledger_mismatches() == []


@pytest.mark.django_db
def test_a_retried_admission_of_a_live_hold_returns_it_to_its_own_process_only(world):
    from billing.errors import RequestIdInUse

    def hold_as(owner: str):
        return book(
            [
                HoldAsk(
                    request_id="r1",
                    tenant_slug="alpha",
                    class_name="INTERACTIVE",
                    model="m",
                    prompt_tokens=1000,
                    max_output_tokens=500,
                    at=timezone.now(),
                    owner=owner,
                )
            ]
        )[0]

    mine = hold_as("gw-1")
    assert hold_as("gw-1") == mine  # its billing worker was replaced mid-batch: booked once
    assert isinstance(hold_as("gw-2"), RequestIdInUse)  # the same id live in another process
    assert year_budget("alpha").held == D("3.2")


def test_billing_refusals_cross_a_process_boundary_intact():
    import pickle

    from billing.errors import BudgetExhausted

    refused = BudgetExhausted("alpha FY2026", D("0.4"), D("3.2"), "USD")
    back = pickle.loads(pickle.dumps(refused))
    assert (type(back), back.budget_label, back.remaining, back.needed, back.currency, str(back)) == (
        BudgetExhausted,
        "alpha FY2026",
        D("0.4"),
        D("3.2"),
        "USD",
        str(refused),
    )


@pytest.mark.django_db
def test_the_longest_id_a_client_may_send_is_booked_with_its_attempts(world):
    longest = "t" * 64 + "/" + "r" * 128  # the longest slug, "/", the longest X-Request-Id
    hold(longest)
    hold_release(request_id=longest, reason="queue_full")
    assert hold(longest).request_id == f"{longest}#2"
    assert LedgerEntry.objects.filter(request_id=f"{longest}#2", kind="hold").exists()


@pytest.mark.django_db
def test_entries_keep_text_that_a_copy_must_escape(world, django_capture_on_commit_callbacks):
    """On PostgreSQL the entries go in by COPY, whose text format gives tabs, newlines, backslashes
    and its NULL marker meanings of their own: each is stored as sent."""
    awkward = "tab\there, new\nline, back\\slash, \\N, ütf-8"
    with django_capture_on_commit_callbacks(execute=True):
        [held] = book(_holds("esc", 1))
    assert isinstance(held, HeldEntry)
    [released] = book([ReleaseAsk(request_id="esc0", reason=awkward, at=timezone.now())])
    assert released is True
    entry = LedgerEntry.objects.get(request_id="esc0", kind="release")
    assert entry.reason == awkward and entry.month_budget_id is None and entry.price_version_id == held.price_version_id
    assert ledger_mismatches() == []

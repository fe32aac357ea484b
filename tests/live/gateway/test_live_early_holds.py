"""Early holds on the live path (gateway.charging): a tenant with ample room has its hold booked
while its request goes upstream, and a hold refused then serves nothing and charges nothing.
Real `serve`, simulated backend, the official openai SDK.

The refusal is a race in production (another process spent the room since this one last heard
of it); here the room is taken away directly, and the gateway trusts what it last heard for an
hour (FAIRGATE_EARLY_HOLD_ROOM_MS), so the next request of the tenant is certainly held early."""

from __future__ import annotations

import json
from decimal import Decimal

import httpx
import openai
import pytest

from simbackend import SimConfig, start_in_thread
from tests.support.livestack import start_gateway, wait_for
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live


KEYS = {"plain": ("plain", "INTERACTIVE"), "saver": ("saver", "INTERACTIVE")}
BUDGET = """
import json
from billing.models import Budget
print(json.dumps([[str(b.spent), str(b.held), str(b.limit)] for b in Budget.objects.filter(tenant__slug={slug!r})]))
"""
SHRINK = """
from decimal import Decimal
from tenants.models import Tenant
from billing.models import Budget
b = Budget.objects.get(tenant__slug={slug!r}, kind="year")
Tenant.objects.filter(slug={slug!r}).update(annual_budget=b.spent + b.held + Decimal("{room}"))
"""
LEDGER = """
import json
from billing.models import LedgerEntry
print(json.dumps([e.kind for e in LedgerEntry.objects.filter(request_id={rid!r}).order_by("pk")]))
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    sim = start_in_thread(SimConfig(port=0, slots=4, ttft_ms=1, tokens_per_s=100_000, seed=8))
    gateway = start_gateway(
        tmp_path_factory.mktemp("gw-early"),
        scheduler_yaml(tenants=[tenant("plain"), tenant("saver")], backends=[backend("priced", f"{sim.url}/v1")]),
        KEYS,
        FAIRGATE_EARLY_HOLD_ROOM_MS="3600000",
    )
    gateway.shell(
        "from billing.models import TenantBilling; from tenants.models import Tenant; "
        "TenantBilling.objects.create(tenant=Tenant.objects.get(slug='saver'), fallback_on_exhausted=True)"
    )
    gateway.extra["sim"] = sim
    yield gateway
    gateway.stop()
    sim.stop()


def ask(gateway, key: str, request_id: str):
    return gateway.sdk(key).chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "hold me early"}],
        max_tokens=50,
        extra_headers={"X-Request-Id": request_id},
    )


def early(gateway, outcome: str) -> float:
    return gateway.metric("fairgate_billing_early_holds_total", outcome=outcome)


def upstream_saw(gateway, public_id: str) -> bool:
    stats = httpx.get(f"{gateway.extra['sim'].url}/stats", params={"request_id": public_id}).json()
    return stats["seen"]


def budget_ok(gateway, slug: str) -> None:
    for spent, held, limit in json.loads(gateway.shell(BUDGET.format(slug=slug)).strip()):
        assert Decimal(spent) + Decimal(held) <= Decimal(limit)


def ledger(gateway, engine_id: str) -> list[str]:
    return json.loads(gateway.shell(LEDGER.format(rid=engine_id)).strip())


def settled(gateway, engine_id: str) -> list[str]:
    """The request's ledger once its settlement is booked (it is, just after the answer)."""
    return wait_for(lambda: ledger(gateway, engine_id), lambda kinds: "charge" in kinds, what=f"{engine_id} settled")


def test_a_tenant_with_room_is_held_early_and_charged_as_before(stack):
    booked = early(stack, "booked")
    first = ask(stack, "plain", "early-1")  # nothing known of the room yet: held first
    assert early(stack, "booked") == booked
    second = ask(stack, "plain", "early-2")
    assert early(stack, "booked") == booked + 1
    for raw, rid in ((first, "plain/early-1"), (second, "plain/early-2")):
        assert Decimal(raw.headers["X-Charge"]) > 0
        assert settled(stack, rid) == ["hold", "release", "charge"]


def test_an_early_hold_refused_serves_nothing_charges_nothing_and_the_answer_is_the_402(stack):
    ask(stack, "plain", "early-3")  # the gateway hears of ample room
    stack.shell(SHRINK.format(slug="plain", room="0.000001"))  # spent elsewhere, say
    refused = early(stack, "refused")
    with pytest.raises(openai.APIStatusError) as info:
        ask(stack, "plain", "early-4")
    assert info.value.status_code == 402 and info.value.code == "budget_exhausted"
    assert early(stack, "refused") == refused + 1
    assert upstream_saw(stack, "early-4")  # it went upstream while its hold was booked
    assert ledger(stack, "plain/early-4") == []  # and left no trace in the ledger
    budget_ok(stack, "plain")


def test_a_tenant_set_to_fall_back_refused_early_is_served_at_the_class_that_fits(stack):
    ask(stack, "saver", "early-5")
    # held: prompt bound (its ~90 body bytes + 24) at 1/1k + 50 output at 2/1k = about 0.21 at 1x:
    # room for it at BATCH's 0.7, not at INTERACTIVE's 1.6
    stack.shell(SHRINK.format(slug="saver", room="0.25"))
    refused = early(stack, "refused")
    raw = ask(stack, "saver", "early-6")
    assert early(stack, "refused") == refused + 1
    assert raw.headers["X-Priority-Class"] == "BATCH"
    assert raw.headers["X-Priority-Downgraded"] == "INTERACTIVE; rule=budget"
    assert Decimal(raw.headers["X-Charge"]) > 0
    assert settled(stack, "saver/early-6") == ["hold", "release", "charge"]
    budget_ok(stack, "saver")

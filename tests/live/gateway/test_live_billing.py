"""Billing on the live request path: X-Charge, 402 budget_exhausted, budget fallback, no charge
for requests that were not served. Real `serve`, simulated backend, official openai SDK."""

from __future__ import annotations

import json
import os
import signal
from decimal import Decimal
from pathlib import Path

import openai
import pytest

from simbackend import SimConfig, start_in_thread
from tests.support.livestack import start_gateway, wait_for, wait_until
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live


KEYS = {"rich": ("rich", "INTERACTIVE"), "thrifty": ("thrifty", "INTERACTIVE"), "saver": ("saver", "INTERACTIVE")}
LEDGER = """
import json
from billing.models import LedgerEntry
rows = LedgerEntry.objects.filter(request_id={rid!r}).order_by("pk")
print(json.dumps([[e.kind, str(e.amount), e.tenant.slug] for e in rows]))
"""


@pytest.fixture(scope="module")
def billed(tmp_path_factory):
    sim = start_in_thread(SimConfig(port=0, slots=2, ttft_ms=2, tokens_per_s=5000, seed=3))
    yaml = scheduler_yaml(
        classes=["INTERACTIVE", "NEAR_RT", "BATCH", "RETRY"],
        tenants=[
            tenant("rich", share=0.5),
            tenant("thrifty", budget=0.01, share=0.2),
            tenant("saver", budget=0.25, share=0.2),
        ],
        backends=[backend("priced", f"{sim.url}/v1")],
    )
    gateway = start_gateway(tmp_path_factory.mktemp("gw-billing"), yaml, KEYS)
    gateway.shell(
        "from billing.models import TenantBilling; from tenants.models import Tenant; "
        "TenantBilling.objects.create(tenant=Tenant.objects.get(slug='saver'), fallback_on_exhausted=True)"
    )
    yield gateway
    gateway.stop()
    sim.stop()


def ledger(gateway, tenant: str, public_id: str) -> list[list[str]]:
    return json.loads(gateway.shell(LEDGER.format(rid=f"{tenant}/{public_id}")).strip())


def settled(gateway, tenant: str, public_id: str) -> list[list[str]]:
    """The request's ledger once its settlement is booked (it is, just after the answer)."""
    return wait_for(
        lambda: ledger(gateway, tenant, public_id),
        lambda rows: any(kind == "charge" for kind, _, _ in rows),
        what=f"{public_id}'s settlement booked",
    )


def ask(gateway, key: str, request_id: str, max_tokens: int = 100):
    return gateway.sdk(key).chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "price me"}],
        max_tokens=max_tokens,
        extra_headers={"X-Request-Id": request_id},
    )


def test_completion_carries_its_charge_and_the_ledger_agrees(billed):
    raw = ask(billed, "rich", "bill-1")
    usage = raw.parse().usage
    expected = (Decimal(usage.prompt_tokens) * 1 + Decimal(usage.completion_tokens) * 2) / 1000 * Decimal("1.6")
    assert Decimal(raw.headers["X-Charge"]) == expected.quantize(Decimal("0.000001"))
    assert raw.headers["X-Charge-Currency"]
    entries = {kind: Decimal(amount) for kind, amount, _ in settled(billed, "rich", "bill-1")}
    assert sorted(entries) == ["charge", "hold", "release"]
    assert entries["charge"] == Decimal(raw.headers["X-Charge"])


def test_a_budget_that_cannot_hold_the_request_is_402_and_never_retried(billed):
    with pytest.raises(openai.APIStatusError) as info:
        ask(billed, "thrifty", "bill-2")
    err = info.value
    assert err.status_code == 402 and err.code == "budget_exhausted"
    assert err.response.headers["x-should-retry"] == "false"
    assert "remaining" in err.message and "thrifty" in err.message.lower()
    assert ledger(billed, "thrifty", "bill-2") == []  # refused before any hold


def test_a_tenant_set_to_fall_back_gets_the_cheapest_class_that_fits(billed):
    raw = ask(billed, "saver", "bill-3")
    # held: prompt bound (its ~130 body bytes) + 100 output = about 0.33 base: 1.6x and 1.2x do not fit 0.25; 0.7x does
    assert raw.headers["X-Priority-Class"] == "BATCH"
    assert raw.headers["X-Priority-Downgraded"] == "INTERACTIVE; rule=budget"
    assert Decimal(raw.headers["X-Charge"]) > 0


def test_a_request_refused_by_the_queue_is_not_charged(billed):
    with pytest.raises(openai.BadRequestError):
        billed.sdk("rich").chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"X-Priority-Class": "PLATINUM", "X-Request-Id": "bill-4"},
        )
    assert ledger(billed, "rich", "bill-4") == []


def test_a_request_id_reused_after_its_request_ended_is_refused_and_not_served_free(billed):
    ask(billed, "rich", "bill-5")  # its settlement is booked before a hold asked after it (one queue)
    with pytest.raises(openai.BadRequestError) as info:
        ask(billed, "rich", "bill-5")
    assert "bill-5" in info.value.message and "earlier request that was served" in info.value.message
    assert [kind for kind, _, _ in settled(billed, "rich", "bill-5")] == ["hold", "release", "charge"]


def test_billing_is_booked_by_a_worker_process_that_is_replaced_if_it_dies(billed):
    ask(billed, "rich", "bill-6")
    worker = billed.billing_worker_pid()
    os.kill(worker, signal.SIGKILL)
    wait_until(
        lambda: (
            not Path(f"/proc/{worker}").exists()
            or b"Z" in Path(f"/proc/{worker}/stat").read_bytes().split(b")")[-1][:3]
        ),
        what="the billing worker gone",
    )
    raw = ask(billed, "rich", "bill-7")  # the next batch starts a new worker
    assert Decimal(raw.headers["X-Charge"]) > 0
    assert billed.billing_worker_pid() != worker
    assert [kind for kind, _, _ in settled(billed, "rich", "bill-7")] == ["hold", "release", "charge"]

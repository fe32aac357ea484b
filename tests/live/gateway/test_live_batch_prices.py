"""A batch is charged at the prices in force when it was created: BATCH's factor raised 100x
(through the ORM, past every door's range check) while a batch runs leaves its lines' holds and
charges at the old factor, and its total within the cost bound its card promised; a request sent
after the change pays the new factor. The gateway serves over HTTP with the official openai SDK, a
real Celery worker runs the lines, the simulated backend's gate holds the first line until the
price has changed, and one line at a time is fed (each later line is held after the change)."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal

import pytest

from simbackend import SimConfig, start_in_thread
from tests.live.gateway.test_live_batches import chat_line, ended, upload
from tests.support.livestack import celery_broker, start_celery, start_gateway, stop_process, wait_for
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live

OLD, NEW = Decimal("0.7"), Decimal("70")  # BATCH's factor in tests.support.scheduler_yaml, and 100x it
LINES = 4
RAISE = """
from django.utils import timezone
from billing.models import PriceVersion
from scheduling.models import PriorityClass
v = PriceVersion.objects.create(
    priority_class=PriorityClass.objects.get(name="BATCH"), price_factor={factor!r}, effective_at=timezone.now()
)
print(v.effective_at.isoformat())
"""
ENTRIES = """
import json
from batches.models import Batch
from billing.models import LedgerEntry
rows = LedgerEntry.objects.filter(request_id__startswith={prefix!r}, kind__in=("hold", "charge")).order_by("pk")
bound = Batch.objects.get(id={batch_id!r}).forecast["cost_bound"] if {batch_id!r} else None
print(json.dumps({{"bound": bound, "rows": [[r.kind, str(r.factor), str(r.amount), r.at.isoformat()] for r in rows]}}))
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    sim = start_in_thread(SimConfig(port=0, slots=1, ttft_ms=2, tokens_per_s=5000, seed=3))
    yaml = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH"],
        tenants=[tenant("fin", share=0.5)],
        backends=[backend("b", f"{sim.url}/v1", models=("m",), slots=1)],
    )
    settings = {"FAIRGATE_BATCH_LINES_PER_PROCESS": "1", **celery_broker()}  # one line held at a time
    var_dir = tmp_path_factory.mktemp("gw-batch-prices")
    gateway = start_gateway(var_dir, yaml, {"fin": ("fin", "BATCH")}, **settings)
    worker = start_celery(gateway.env, var_dir / "worker.log")
    yield gateway, sim
    stop_process(worker)
    gateway.stop()
    sim.stop()


def entries(gateway, prefix: str, batch_id: str = "") -> dict:
    return json.loads(gateway.shell(ENTRIES.format(prefix=prefix, batch_id=batch_id)).strip())


def test_a_price_raised_mid_batch_charges_its_lines_at_the_price_of_its_creation(stack):
    gateway, sim = stack
    sdk = gateway.sdk("fin")
    sim.gate.close()
    try:
        lines = [chat_line(f"q{i}", f"question {i}") for i in range(LINES)]
        batch = sdk.batches.create(
            input_file_id=upload(sdk, lines), endpoint="/v1/chat/completions", completion_window="24h"
        )
        wait_for(lambda: sim.gate.waiting, bool, what="the first line at the backend", limit_s=60)
        raised_at = gateway.shell(RAISE.format(factor=str(NEW))).strip()
    finally:
        sim.gate.open()
    done = ended(sdk, batch.id, gateway=gateway)
    assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)

    seen = entries(gateway, f"fin/{batch.id}.", batch.id)
    holds = [row for row in seen["rows"] if row[0] == "hold"]
    charges = [row for row in seen["rows"] if row[0] == "charge"]
    assert len(charges) == LINES
    changed = datetime.fromisoformat(raised_at)
    held_after = sum(datetime.fromisoformat(row[3]) > changed for row in holds)
    assert held_after >= LINES - 1  # every line but the first was held after the change
    assert {Decimal(row[1]) for row in holds + charges} == {OLD}  # every hold and charge at the old factor
    assert sum(Decimal(row[2]) for row in charges) <= Decimal(seen["bound"])  # what its card promised

    sdk.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "after"}],
        max_tokens=5,
        extra_headers={"X-Request-Id": "after"},
    )
    after = entries(gateway, "fin/after")["rows"]
    assert {Decimal(row[1]) for row in after if row[0] == "charge"} == {NEW}  # new work pays the new price

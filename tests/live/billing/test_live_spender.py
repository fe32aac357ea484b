"""Who spent, on the live request path: requests served by a real `serve` (its Booker, billing
worker and COPY into PostgreSQL) leave ledger entries that carry the key's prefix, the request's
X-Job-Id and the key's creator; finance's script pulls spend by key as CSV with `curl` and a
report token, and it adds up to the ledger."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import openai
import pytest

from simbackend import SimConfig, start_in_thread
from tests.live.billing.test_live_report_token import curl
from tests.support.livestack import start_gateway, wait_for
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = [pytest.mark.live, pytest.mark.postgres]

MAKE_KEY = """
from scheduling.selectors import class_names_active
from tenants.services import apikey_create
key, secret = apikey_create(tenant_slug="acme", default_class="INTERACTIVE", label="carol's", actor="console:carol",
                            known_classes=class_names_active())
print("KEY=" + secret)
"""
ENTRIES = """
import json
from django.db import connection
from billing.models import LedgerEntry
rows = LedgerEntry.objects.filter(request_id__startswith="acme/sp-").order_by("request_id", "pk")
print("ENTRIES=" + json.dumps({"vendor": connection.vendor, "rows": [
    [e.request_id, e.kind, e.key_prefix, e.job_id, e.key_creator, str(e.amount)] for e in rows]}))
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    sim = start_in_thread(SimConfig(port=0, slots=2, ttft_ms=2, tokens_per_s=5000, seed=11))
    yaml = scheduler_yaml(tenants=[tenant("acme", share=0.5)], backends=[backend("priced", f"{sim.url}/v1")])
    gateway = start_gateway(tmp_path_factory.mktemp("gw-spender"), yaml, {"setup": ("acme", "INTERACTIVE")})
    gateway.manage("user", "create", "fay", "--role", "finance")
    yield gateway
    gateway.stop()
    sim.stop()


def entries(gateway) -> dict:
    out = gateway.shell(ENTRIES)
    return json.loads(next(line for line in out.splitlines() if line.startswith("ENTRIES="))[8:])


def test_served_requests_record_key_job_and_creator_and_finance_pulls_them_by_key(gateway):
    made = gateway.shell(MAKE_KEY)
    secret = next(line for line in made.splitlines() if line.startswith("KEY="))[4:]
    prefix = secret.split("_")[1]
    carol = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=secret, max_retries=0)
    for n in range(2):
        carol.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": f"job {n}"}],
            max_tokens=20,
            extra_headers={"X-Job-Id": "nightly-42", "X-Request-Id": f"sp-{n}"},
        )
    gateway.sdk("setup").chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "no job"}],
        max_tokens=20,
        extra_headers={"X-Request-Id": "sp-untagged"},
    )
    found = wait_for(
        lambda: entries(gateway),
        lambda got: sum(row[1] == "charge" for row in got["rows"]) == 3,
        what="three charges booked",
    )
    assert found["vendor"] == "postgresql"  # the booking's COPY path
    by_request: dict[str, set] = {}
    for request_id, kind, key, job, creator, _ in found["rows"]:
        by_request.setdefault(request_id, set()).add((kind, key, job, creator))
    setup_prefix = gateway.keys["setup"].split("_")[1]
    for n in range(2):
        assert by_request[f"acme/sp-{n}"] == {(k, prefix, "nightly-42", "carol") for k in ("hold", "release", "charge")}
    assert by_request["acme/sp-untagged"] == {(k, setup_prefix, "", "setup") for k in ("hold", "release", "charge")}

    charges = {}
    for _rid, kind, key, _, _, amount in found["rows"]:
        if kind == "charge":
            charges[key] = charges.get(key, Decimal(0)) + Decimal(amount)
    token = gateway.manage("reporttoken", "create", "fay", "--label", "spend by key", "--days", "31").strip()
    today = datetime.now(UTC).date()
    url = (
        f"{gateway.url}/api/billing/spend/?group_by=key&format=csv"
        f"&since={today.replace(day=1)}&until={today + timedelta(days=1)}"
    )
    pulled = curl("-f", "-H", f"Authorization: Bearer {token}", url)
    assert pulled.returncode == 0, pulled.stderr
    rows = list(csv.DictReader(io.StringIO(pulled.stdout)))
    assert {r["key_prefix"]: Decimal(r["charge"]) for r in rows} == charges
    assert {r["key_prefix"]: (r["key_creator"], int(r["requests"])) for r in rows} == {
        prefix: ("carol", 2),
        setup_prefix: ("setup", 1),
    }
    by_job = curl("-f", "-H", f"Authorization: Bearer {token}", f"{gateway.url}/api/billing/spend/?group_by=job")
    jobs = {r["job"]: r["requests"] for r in json.loads(by_job.stdout)["rows"]}
    assert jobs == {"nightly-42": 2, "": 1}

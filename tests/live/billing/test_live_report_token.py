"""Finance's monthly script: `curl` with a report token pulls the charges CSV from a real `serve`
after traffic sent with the official openai SDK; the token is refused by the OpenAI API, and an API
key by the report API."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import openai
import pytest

from simbackend import SimConfig, start_in_thread
from tests.support.livestack import start_gateway, wait_for
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live

CHARGES = """
from billing.models import LedgerEntry
print(sum(e.amount for e in LedgerEntry.objects.filter(kind="charge", tenant__slug="acme")))
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    sim = start_in_thread(SimConfig(port=0, slots=2, ttft_ms=2, tokens_per_s=5000, seed=5))
    yaml = scheduler_yaml(tenants=[tenant("acme", share=0.5)], backends=[backend("priced", f"{sim.url}/v1")])
    gateway = start_gateway(tmp_path_factory.mktemp("gw-report-token"), yaml, {"acme": ("acme", "INTERACTIVE")})
    gateway.manage("user", "create", "fay", "--role", "finance")
    yield gateway
    gateway.stop()
    sim.stop()


def curl(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("curl")
    if tool is None:
        pytest.fail("curl is missing: apt-get install -y curl")
    return subprocess.run([tool, "-sS", *args], capture_output=True, text=True, timeout=60)


def test_a_script_pulls_the_monthly_csv_with_curl_and_a_token(gateway):
    client = gateway.sdk("acme")
    for n in range(3):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"report {n}"}], max_tokens=20)
    booked = wait_for(
        lambda: Decimal(gateway.shell(CHARGES).strip() or "0"),
        lambda total: total > 0,
        what="the three charges booked",
    )
    token = gateway.manage("reporttoken", "create", "fay", "--label", "monthly csv", "--days", "31").strip()
    today = datetime.now(UTC).date()
    since, until = today.replace(day=1), today + timedelta(days=1)
    url = f"{gateway.url}/api/billing/charges/?format=csv&since={since}&until={until}"
    pulled = curl("-f", "-H", f"Authorization: Bearer {token}", url)
    assert pulled.returncode == 0, pulled.stderr
    rows = list(csv.DictReader(io.StringIO(pulled.stdout)))
    assert {r["tenant"] for r in rows} == {"acme"}
    assert sum(int(r["requests"]) for r in rows) == 3
    assert sum(Decimal(r["charge"]) for r in rows) == booked

    as_api_key = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=token, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        as_api_key.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5)

    with_key = curl("-o", "/dev/null", "-w", "%{http_code}", "-H", f"Authorization: Bearer {gateway.keys['acme']}", url)
    assert with_key.stdout in ("401", "403")

    prefix = token.split("_")[1]
    gateway.manage("reporttoken", "revoke", prefix)
    revoked = curl("-o", "/dev/null", "-w", "%{http_code}", "-H", f"Authorization: Bearer {token}", url)
    assert revoked.stdout in ("401", "403")

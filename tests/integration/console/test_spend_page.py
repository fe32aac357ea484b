"""The member's spend page: this month's charges of their own department by class, by API key and
by job, summed as the ledger has them; members see only their own, admins pick one, months page."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

from django.db.models import Sum
from django.utils import timezone

from billing.models import LedgerEntry
from billing.services import budget_hold, charge_settle
from console.formatting import money_text
from tests.integration.console.conftest import A, B


def charged(tenant: str, request_id: str, *, key: str, job: str, cls: str = "INTERACTIVE", at=None) -> None:
    budget_hold(
        tenant_slug=tenant,
        request_id=request_id,
        class_name=cls,
        model="sim-llama",
        prompt_tokens=200,
        max_output_tokens=100,
        key_prefix=key,
        job_id=job,
        key_creator="ann",
        at=at,
    )
    charge_settle(request_id=request_id, backend_name="sim-gpu", prompt_tokens=200, completion_tokens=60, at=at)


def cell(page: str, table: str, attr: str, value: str) -> str:
    """The 'Charged' cell of one row of a spend table."""
    body = re.search(rf'<table[^>]*id="{table}".*?</table>', page, re.S).group(0)
    row = re.search(rf'<tr {attr}="{re.escape(value)}">(.*?)</tr>', body, re.S)
    assert row, f"no row {attr}={value} in {table}"
    return re.findall(r'<td class="money"[^>]*>(.*?)</td>', row.group(1))[-1]


def ledger_sum(**filters) -> Decimal:
    return LedgerEntry.objects.filter(kind="charge", **filters).aggregate(s=Sum("amount"))["s"]


def test_a_member_sees_this_months_charges_by_class_key_and_job(member_a, world):
    for n in range(3):
        charged(A, f"sp-a-{n}", key="fgkeyaaa", job="invoices")
    charged(A, "sp-a-batch", key="fgkeybbb", job="batch_0123", cls="BATCH")
    charged(B, "sp-b-1", key="fgkeyccc", job="secret-job")  # another department's
    page = member_a.client.get("/console/spend/").content.decode()
    tenant = world[A]
    assert cell(page, "spend-by-key", "data-key", "fgkeyaaa") == money_text(ledger_sum(key_prefix="fgkeyaaa"))
    assert cell(page, "spend-by-job", "data-job", "invoices") == money_text(ledger_sum(job_id="invoices"))
    assert cell(page, "spend-by-class", "data-class", "BATCH") == money_text(
        ledger_sum(tenant=tenant, class_name="BATCH")
    )
    month_total = ledger_sum(tenant=tenant, at__gte=timezone.now().replace(day=1) - timedelta(days=1))
    assert money_text(month_total) in page  # the fixture's own charge is this month's too
    assert "fgkeyccc" not in page and "secret-job" not in page
    asked = member_a.client.get(f"/console/spend/?tenant={B}").content.decode()
    assert "secret-job" not in asked  # a member's answer is their own department, whatever they ask


def test_an_admin_picks_the_department_and_months_page(admin, world):
    charged(A, "sp-a-now", key="fgkeynow", job="this-month")
    page = admin.client.get(f"/console/spend/?tenant={A}").content.decode()
    assert "this-month" in page and 'id="month-next"' not in page  # no month after this one yet
    previous = re.search(r'href="\?month=(\d{4}-\d{2})&amp;tenant=' + A + '" id="month-previous"', page).group(1)
    earlier = admin.client.get(f"/console/spend/?tenant={A}&month={previous}").content.decode()
    assert "this-month" not in earlier and "No charges this month" in earlier and 'id="month-next"' in earlier
    assert admin.client.get(f"/console/spend/?tenant={A}&month=2026-13").status_code == 404

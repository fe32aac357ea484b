"""The console in plain words: feedback beside the form that was saved, display names and units,
the audit log as field: old → new, and no dead ends (404 page, /, login, another department)."""

from __future__ import annotations

import re

from audit.models import AuditLog
from console.wording import audit_changes, class_label, sla_minutes
from scheduling.models import PriorityClass
from tests.integration.console.conftest import A, B


def _row(page: str, row_id: str) -> str:
    """The HTML of the table row with ``id=row_id``."""
    match = re.search(rf'<tr[^>]*id="{re.escape(row_id)}"[^>]*>(.*?)</tr>', page, re.S)
    assert match, f"no row {row_id} on the page"
    return match.group(1)


def test_a_refused_price_is_said_beside_its_field_not_in_the_banner(admin):
    response = admin.client.post("/console/policy/class/INTERACTIVE/", {"price_factor": "-0.5"})
    assert response.status_code == 302 and response["Location"].endswith("#class-INTERACTIVE")
    page = admin.client.get(response["Location"]).content.decode()
    row = _row(page, "class-INTERACTIVE")
    assert 'class="feedback error"' in row and "Refused" in row
    assert "Refused" not in _row(page, "class-BATCH")
    banner = re.search(r'<ul class="messages">(.*?)</ul>', page, re.S)
    assert banner is None or "Refused" not in banner.group(1)
    again = admin.client.get("/console/policy/").content.decode()
    assert "Refused" not in again  # said once


def test_a_saved_share_is_said_beside_its_department(admin):
    response = admin.client.post(f"/console/policy/tenant/{A}/", {"quota_share": "0.3"}, follow=True)
    row = _row(response.content.decode(), f"tenant-{A}")
    assert 'class="feedback success"' in row and "Saved" in row


def test_target_wait_is_shown_and_taken_in_minutes(admin):
    admin.client.post("/console/policy/class/NEAR_RT/", {"sla_min": "0.5"})
    assert PriorityClass.objects.get(name="NEAR_RT").sla_ms == 30_000
    page = admin.client.get("/console/policy/").content.decode()
    row = _row(page, "class-NEAR_RT")
    assert "Near real-time" in row and re.search(r'<td class="sla"[^>]*>0.5</td>', row)
    assert "1800000" not in page and "wait_ratio boost [k]" not in page
    assert 'title="The floor of every active department' in page  # min_share explained on hover
    admin.client.post("/console/policy/class/NEAR_RT/", {"sla_ms": "20000"})  # scripts may still post ms
    assert PriorityClass.objects.get(name="NEAR_RT").sla_ms == 20_000
    refused = admin.client.post("/console/policy/class/NEAR_RT/", {"sla_min": "NaN"}, follow=True)
    assert "is not a number of minutes" in refused.content.decode()


def test_the_audit_log_shows_field_old_to_new_not_python_text(admin):
    AuditLog.objects.create(
        actor="console:ada",
        action="update",
        entity="class",
        key="BATCH",
        field="",
        old={"price_factor": "0.7", "sla_ms": 1800000},
        new={"price_factor": "1.4", "sla_ms": 1800000},
    )
    page = admin.client.get("/console/audit/?entity=class").content.decode()
    assert "price_factor: 0.7 → 1.4" in page
    assert "{&#x27;" not in page and "{'" not in page and "sla_ms: 1800000" not in page  # unchanged keys left out


def test_wording_helpers():
    assert class_label("NEAR_RT") == "Near real-time" and class_label("GOLD_TIER") == "Gold tier"
    assert sla_minutes(1_800_000) == "30" and sla_minutes(90_000) == "1.5" and sla_minutes(None) == "—"
    assert audit_changes("enabled", True, False) == [("enabled", "yes", "no")]
    assert audit_changes("", None, {"a": 1}) == [("a", "—", "1")]
    assert audit_changes("models", ["x"], ["x", "y"]) == [("models", "x", "x, y")]


def test_an_unknown_console_page_is_a_page_without_resolver_names(admin):
    response = admin.client.get("/console/no-such-page/")
    text = response.content.decode()
    assert response.status_code == 404 and "Nothing here" in text and "Resolver404" not in text
    reasoned = admin.client.get("/console/queue/?tenant=nobody").content.decode()
    assert "No tenant" in reasoned  # a view's own reason is still said


def test_the_site_root_leads_to_the_console(client, db):
    response = client.get("/")
    assert response.status_code == 302 and response["Location"] == "/console/"


def test_a_wrong_password_keeps_the_username(admin):
    admin.client.logout()
    response = admin.client.post("/console/login/", {"username": "ada", "password": "wrong"})
    text = response.content.decode()
    assert "did not match" in text and 'value="ada"' in text


def test_an_admin_looking_at_another_department_is_not_told_it_is_theirs(admin, world):
    own = admin.client.get(f"/console/queue/?tenant={B}").content.decode()  # ada belongs to B
    assert "My queue —" in own
    other = admin.client.get(f"/console/queue/?tenant={A}").content.decode()
    assert "My queue —" not in other and f"Queue — {world[A].name}" in other

"""The report-tokens page: a user creates a token (shown once), sees its expiry and last use, and
revokes it; nobody reaches another user's tokens."""

from __future__ import annotations

from audit.models import AuditLog
from tenants.models import ReportToken


def test_a_token_is_shown_once_and_revoked_with_an_audit_trail(member_a, member_b):
    created = member_a.client.post("/console/tokens/create/", {"label": "monthly", "days": "30"})
    assert created.status_code == 302
    token = ReportToken.objects.get(user=member_a.user)
    first = member_a.client.get("/console/tokens/").content.decode()
    assert f"fgr_{token.prefix}_" in first and 'id="token-created"' in first
    again = member_a.client.get("/console/tokens/").content.decode()
    assert f"fgr_{token.prefix}_" not in again and f"fgr_{token.prefix}…" in again and "never" in again
    assert member_b.client.post(f"/console/tokens/{token.prefix}/revoke/").status_code == 404
    assert ReportToken.objects.get(pk=token.pk).revoked_at is None
    member_a.client.post(f"/console/tokens/{token.prefix}/revoke/")
    assert ReportToken.objects.get(pk=token.pk).revoked_at is not None
    assert {e.action for e in AuditLog.objects.filter(entity="report_token", key=token.prefix)} == {"create", "revoke"}


def test_a_bad_lifetime_is_refused_with_a_message(member_a):
    for days in ("0", "999", "soon"):
        page = member_a.client.post("/console/tokens/create/", {"days": days}, follow=True).content.decode()
        assert "days" in page and 'class="error"' in page
    assert not ReportToken.objects.exists()

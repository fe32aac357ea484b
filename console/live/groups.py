"""Channel-layer group names: one per tenant, one per role. Isolation starts here: a socket is
added only to the groups ``groups_for`` returns, decided on the server from the session's user."""

from __future__ import annotations

from console.access import ADMIN, FINANCE, role_of

FINANCE_GROUP = "role.finance"
ADMIN_GROUP = "role.admin"


def tenant_group(tenant_id: int) -> str:
    return f"tenant.{int(tenant_id)}"


def groups_for(user, tenant_id: int | None) -> list[str]:
    """``tenant_id`` is the queue the user may watch (see ``console.access.queue_tenant``)."""
    role = role_of(user)
    groups = [tenant_group(tenant_id)] if tenant_id is not None else []
    if role in (FINANCE, ADMIN):
        groups.append(FINANCE_GROUP)
    if role == ADMIN:
        groups.append(ADMIN_GROUP)
    return groups

"""What invalidates billing's caches (billing.cache): every save or delete of a row they are
built from, connected at start-up (BillingConfig.ready)."""

from __future__ import annotations

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from billing.cache import caches_invalidate
from billing.models import PriceVersion, TenantBilling
from scheduling.models import Backend, PriorityClass
from tenants.models import Tenant


def _on_config_saved(**_signal_kwargs) -> None:
    """Invalidate now, and again when the change commits (a load in between read the old rows)."""
    caches_invalidate()
    transaction.on_commit(caches_invalidate)  # runs at once outside a transaction


def connect_invalidation() -> None:
    """Invalidate on every save/delete of the rows the caches are built from."""
    for model in (Tenant, TenantBilling, PriorityClass, PriceVersion, Backend):
        for signal in (post_save, post_delete):
            signal.connect(_on_config_saved, sender=model, dispatch_uid=f"billing-cache-{model.__name__}-{id(signal)}")

from __future__ import annotations

from decimal import Decimal

from billing.models import Budget, LedgerEntry
from billing.services import budget_hold, charge_settle


def hold(
    request_id: str,
    *,
    tenant: str = "alpha",
    cls: str = "INTERACTIVE",
    prompt: int = 1000,
    max_out: int = 500,
    model: str = "m",
    at=None,
):
    """Default: base on gpu-a = 1000/1k×1 + 500/1k×2 = 2; ×1.6 = 3.2."""
    return budget_hold(
        tenant_slug=tenant,
        request_id=request_id,
        class_name=cls,
        model=model,
        prompt_tokens=prompt,
        max_output_tokens=max_out,
        at=at,
    )


def settle(request_id: str, *, backend: str = "gpu-b", prompt: int = 1000, completion: int = 200, at=None) -> Decimal:
    """Default on gpu-b: 1000/1k×0.5 + 200/1k×1 = 0.7 base."""
    return charge_settle(
        request_id=request_id, backend_name=backend, prompt_tokens=prompt, completion_tokens=completion, at=at
    )


def year_budget(slug: str) -> Budget:
    return Budget.objects.get(tenant__slug=slug, kind=Budget.Kind.YEAR)


def kinds(request_id: str) -> dict[str, Decimal]:
    return dict(LedgerEntry.objects.filter(request_id=request_id).values_list("kind", "amount"))

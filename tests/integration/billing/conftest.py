"""Billing fixtures: four priced classes, three backends, tenants alpha/beta/gamma, and personas."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from billing.price_versions import price_set
from scheduling.models import Backend, PriorityClass
from tenants.models import Tenant, User

D = Decimal
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
CLASSES = (("INTERACTIVE", 0, "1.6"), ("NEAR_RT", 1, "1.2"), ("BATCH", 2, "0.7"), ("RETRY", 3, "0.4"))


def make_world() -> dict[str, Tenant]:
    for name, level, factor in CLASSES:
        row = PriorityClass.objects.create(name=name, level=level, sla_ms=1000 * (level + 1))
        price_set(priority_class=row, price_factor=D(factor), actor="fixture", effective_at=LONG_AGO)
    # per 1k tokens: gpu-a is the dearest enabled backend for model "m"; gpu-x is dearer but disabled
    Backend.objects.create(
        name="gpu-a", model_names=["m"], slots=4, input_price_per_1k=D("1"), output_price_per_1k=D("2")
    )
    Backend.objects.create(
        name="gpu-b", model_names=["m", "n"], slots=4, input_price_per_1k=D("0.5"), output_price_per_1k=D("1")
    )
    Backend.objects.create(
        name="gpu-x",
        model_names=["m"],
        slots=1,
        input_price_per_1k=D("100"),
        output_price_per_1k=D("100"),
        enabled=False,
    )
    return {
        "alpha": Tenant.objects.create(slug="alpha", name="Alpha", quota_share=D("0.5"), annual_budget=D("1000")),
        "beta": Tenant.objects.create(slug="beta", name="Beta", quota_share=D("0.3"), annual_budget=D("1000")),
        "gamma": Tenant.objects.create(slug="gamma", name="Gamma", quota_share=D("0.2"), annual_budget=None),
    }


@pytest.fixture
def world(db) -> dict[str, Tenant]:
    return make_world()


def _persona(username: str, *, tenant: Tenant | None, role: str) -> APIClient:
    user = User.objects.create_user(username=username, password="x", tenant=tenant, role=role)
    client = APIClient()
    client.force_authenticate(user=user)
    client.user = user
    return client


@pytest.fixture
def member_a(world) -> APIClient:
    return _persona("ann", tenant=world["alpha"], role=User.Role.MEMBER)


@pytest.fixture
def teammate_a(world) -> APIClient:
    return _persona("tom", tenant=world["alpha"], role=User.Role.MEMBER)


@pytest.fixture
def member_b(world) -> APIClient:
    return _persona("bob", tenant=world["beta"], role=User.Role.MEMBER)


@pytest.fixture
def finance(world) -> APIClient:
    return _persona("fay", tenant=None, role=User.Role.FINANCE)


@pytest.fixture
def admin_user(world) -> APIClient:
    return _persona("ada", tenant=world["beta"], role=User.Role.ADMIN)


@pytest.fixture(autouse=True)
def fresh_billing_caches():
    """Each test starts with empty in-process billing caches (the database was rolled back)."""
    from billing.cache import caches_invalidate

    caches_invalidate()
    yield

"""Console personas on the example configuration: a member of tenant A (support), a teammate in
A, a member of tenant B (sales), a finance user and an admin; plus one settled charge per tenant
so every isolation check has something of A's to not show to B."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from django.test import Client

from billing.services import budget_hold, charge_settle
from scheduling.config_files import config_load_file
from tenants.models import Tenant, User

EXAMPLE = Path(__file__).resolve().parents[3] / "config" / "scheduler.example.yaml"
A, B = "support", "sales"
A_REQUEST, B_REQUEST = "req-a-secret-1", "req-b-secret-1"


@dataclass
class Persona:
    user: User
    client: Client


def world_load() -> dict[str, Tenant]:
    config_load_file(EXAMPLE, actor="fixture")
    for slug, request_id in ((A, A_REQUEST), (B, B_REQUEST)):
        budget_hold(
            tenant_slug=slug,
            request_id=request_id,
            class_name="INTERACTIVE",
            model="sim-llama",
            prompt_tokens=100,
            max_output_tokens=50,
        )
        charge_settle(request_id=request_id, backend_name="sim-gpu", prompt_tokens=100, completion_tokens=40)
    return {t.slug: t for t in Tenant.objects.all()}


def persona(username: str, *, role: str, tenant: Tenant | None) -> Persona:
    user = User.objects.create_user(username=username, password="pw-" + username, role=role, tenant=tenant)
    client = Client()
    client.force_login(user)
    return Persona(user, client)


@pytest.fixture(autouse=True)
def fresh_redis_channel_layer():
    """Each test runs its own event loop; channels_redis keeps per-channel asyncio locks on the layer
    object that a receive cancelled at a socket's close can leave behind, bound to that loop. A
    Redis layer object per test keeps them from failing a later test (its state is in Redis)."""
    yield
    from channels.layers import channel_layers

    if any(type(layer).__module__.startswith("channels_redis") for layer in channel_layers.backends.values()):
        channel_layers.backends = {}


@pytest.fixture
def world(db):
    return world_load()


@pytest.fixture
def member_a(world) -> Persona:
    return persona("ann", role=User.Role.MEMBER, tenant=world[A])


@pytest.fixture
def teammate_a(world) -> Persona:
    return persona("tom", role=User.Role.MEMBER, tenant=world[A])


@pytest.fixture
def member_b(world) -> Persona:
    return persona("bob", role=User.Role.MEMBER, tenant=world[B])


@pytest.fixture
def finance(world) -> Persona:
    return persona("fay", role=User.Role.FINANCE, tenant=None)


@pytest.fixture
def admin(world) -> Persona:
    return persona("ada", role=User.Role.ADMIN, tenant=world[B])

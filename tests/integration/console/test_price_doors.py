"""Every door that sets prices refuses what the others refuse (scheduling.prices): a class factor
outside FAIRGATE_FACTOR_MIN..MAX, a back-dated version, a negative backend price; and a factor moved
more than 2x is applied only once confirmed, after saying what it touches (open holds, open batches,
a day's spend at the new price). Doors: the console's policy page, `scheduler_config load`, the
Django admin, `manage.py backend create`."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from batches.models import Batch
from billing.models import PriceVersion
from billing.services import budget_hold, charge_settle
from scheduling.models import Backend, PriorityClass
from tenants.models import User
from tests.integration.console.conftest import EXAMPLE

OUT_OF_RANGE = ["100", "0", "0.05", "10.5", "-1"]


def versions(class_name: str = "BATCH") -> list[Decimal]:
    return list(PriceVersion.objects.filter(priority_class__name=class_name).values_list("price_factor", flat=True))


@pytest.fixture
def superuser(world) -> Client:
    user = User.objects.create_superuser(username="root", password="pw-root-1", email="root@example.com")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def exposed(world):
    """BATCH as a price change touches it: one request held (waiting), one charged today, one open batch."""
    tenant = world["support"]
    hold_args = {"tenant_slug": "support", "class_name": "BATCH", "model": "sim-llama", "prompt_tokens": 1000}
    budget_hold(request_id="batch-waiting", max_output_tokens=100, **hold_args)
    budget_hold(request_id="batch-done", max_output_tokens=100, **hold_args)
    charged = charge_settle(request_id="batch-done", backend_name="sim-gpu", prompt_tokens=1000, completion_tokens=100)
    Batch.objects.create(
        id="batch_open_1",
        tenant=tenant,
        key_prefix="k",
        endpoint="/v1/chat/completions",
        priority_class="BATCH",
        expires_at=timezone.now() + timedelta(hours=24),
    )
    return charged


def yaml_with_batch_factor(tmp_path: Path, factor: str) -> Path:
    text = EXAMPLE.read_text()
    changed = re.sub(r"(name: BATCH,.*price_factor: )0\.7", rf"\g<1>{factor}", text)
    assert changed != text
    path = tmp_path / "prices.yaml"
    path.write_text(changed)
    return path


def admin_post(client: Client, class_name: str, factor: str, *, when=None, confirm: bool = False):
    """The admin's change form of a class, adding one price version in its inline."""
    row = PriorityClass.objects.get(name=class_name)
    old = list(row.prices.order_by("pk"))
    data = {
        "name": row.name,
        "level": row.level,
        "sla_ms": row.sla_ms,
        "active": "on",
        "prices-TOTAL_FORMS": len(old) + 1,
        "prices-INITIAL_FORMS": len(old),
        "prices-MIN_NUM_FORMS": 0,
        "prices-MAX_NUM_FORMS": 1000,
    }
    for i, version in enumerate(old):
        data |= {f"prices-{i}-id": version.pk, f"prices-{i}-priority_class": row.pk}
    new = f"prices-{len(old)}"
    data |= {f"{new}-priority_class": row.pk, f"{new}-price_factor": factor}
    if when is not None:
        local = timezone.localtime(when)
        data |= {f"{new}-effective_at_0": f"{local:%Y-%m-%d}", f"{new}-effective_at_1": f"{local:%H:%M:%S}"}
    if confirm:
        data[f"{new}-confirm"] = "on"
    return client.post(f"/admin/scheduling/priorityclass/{row.pk}/change/", data)


# --- out of range: refused by every door --------------------------------------------------


@pytest.mark.parametrize("factor", OUT_OF_RANGE)
def test_the_console_refuses_a_factor_out_of_range(admin, factor):
    before = versions()
    page = admin.client.post("/console/policy/class/BATCH/", {"price_factor": factor}, follow=True).content.decode()
    assert "Refused" in page and "outside the allowed range 0.1–10" in page
    assert versions() == before


@pytest.mark.parametrize("factor", ["100", "0.05", "10.5"])
def test_yaml_load_refuses_a_factor_out_of_range_even_confirmed(world, tmp_path, factor):
    before = versions()
    with pytest.raises(CommandError, match="outside the allowed range"):
        call_command("scheduler_config", "load", str(yaml_with_batch_factor(tmp_path, factor)), "--confirm")
    assert versions() == before


@pytest.mark.parametrize("factor", OUT_OF_RANGE)
def test_the_admin_refuses_a_factor_out_of_range_even_confirmed(superuser, factor):
    before = versions()
    response = admin_post(superuser, "BATCH", factor, confirm=True)
    assert response.status_code == 200  # the form again, with its errors
    assert "outside the allowed range" in response.content.decode() or factor == "-1"
    assert versions() == before


def test_the_range_is_a_setting(admin, settings):
    settings.FAIRGATE_FACTOR_MAX = Decimal("200")
    admin.client.post("/console/policy/class/BATCH/", {"price_factor": "100", "confirm": "yes"})
    assert versions()[0] == Decimal("100")  # newest first


# --- the admin refuses what YAML and the console refuse -------------------------------------


def test_the_admin_refuses_a_back_dated_version(superuser):
    before = versions()
    response = admin_post(superuser, "BATCH", "0.8", when=timezone.now() - timedelta(days=1))
    assert response.status_code == 200 and "cannot take effect in the past" in response.content.decode()
    assert versions() == before


def test_the_admin_adds_a_version_effective_now_or_later(superuser):
    assert admin_post(superuser, "BATCH", "0.8").status_code == 302  # effective at: empty is now
    later = timezone.now() + timedelta(days=1)
    assert admin_post(superuser, "BATCH", "0.9", when=later).status_code == 302
    assert versions()[:2] == [Decimal("0.9"), Decimal("0.8")]


def test_the_admin_refuses_a_negative_backend_price(superuser):
    backend = Backend.objects.get(name="sim-gpu")
    data = {
        "name": backend.name,
        "url": backend.url,
        "model_names": '["sim-llama"]',
        "embedding_models": "[]",
        "slots": backend.slots,
        "reserved_slots": 0,
        "input_price_per_1k": "-0.002",
        "output_price_per_1k": "0.006",
        "enabled": "on",
    }
    response = superuser.post(f"/admin/scheduling/backend/{backend.pk}/change/", data)
    assert response.status_code == 200 and "input_price_per_1k must be &gt;= 0" in response.content.decode()
    backend.refresh_from_db()
    assert backend.input_price_per_1k == Decimal("0.002")


def test_manage_py_backend_create_refuses_a_negative_price(world):
    with pytest.raises(CommandError, match="output_price_per_1k must be >= 0"):
        call_command(
            "backend", "create", "cheap", "--url", "http://x/v1", "--model", "m", "--slots", "1",
            "--output-price-per-1k", "-1",
        )  # fmt: skip
    assert not Backend.objects.filter(name="cheap").exists()


# --- more than 2x: confirmed first, after saying what it touches ---------------------------


def test_the_console_asks_to_confirm_a_move_of_more_than_2x_and_says_what_it_touches(admin, exposed):
    before = versions()
    response = admin.client.post("/console/policy/class/BATCH/", {"price_factor": "7", "sla_ms": "70000"})
    page = response.content.decode()
    assert response.status_code == 200 and 'id="price-confirm"' in page
    assert versions() == before and PriorityClass.objects.get(name="BATCH").sla_ms == 1_800_000  # nothing saved yet
    assert re.search(r'class="open-holds">1<', page) and re.search(r'class="open-batches">1<', page)
    assert f"{exposed} → {exposed * 10:.6f}" in page  # a day's spend, at 7 / 0.7
    assert 'name="confirm" value="yes"' in page and 'name="price_factor" value="7"' in page
    saved = admin.client.post(
        "/console/policy/class/BATCH/", {"price_factor": "7", "sla_ms": "70000", "confirm": "yes"}, follow=True
    ).content.decode()
    assert "price ×7" in saved and "target wait 1.17 min" in saved  # shown in minutes (70,000 ms)
    assert versions()[0] == Decimal("7")


def test_the_console_applies_a_move_within_2x_at_once(admin):
    page = admin.client.post("/console/policy/class/BATCH/", {"price_factor": "1.4"}, follow=True).content.decode()
    assert "price ×1.4" in page and versions()[0] == Decimal("1.4")


def test_yaml_load_refuses_a_move_of_more_than_2x_without_confirm(exposed, tmp_path):
    path = yaml_with_batch_factor(tmp_path, "0.3")  # 0.7 → 0.3: 2.33x down
    before = versions()
    with pytest.raises(CommandError) as refused:
        call_command("scheduler_config", "load", str(path))
    text = str(refused.value)
    assert "1 requests waiting or running, 1 open batches" in text and "--confirm" in text
    assert f"a day's spend {exposed} → " in text
    assert versions() == before
    call_command("scheduler_config", "load", str(path), "--confirm")
    assert versions()[0] == Decimal("0.3")


def test_the_admin_asks_to_confirm_a_move_of_more_than_2x(superuser, exposed):
    before = versions()
    refused = admin_post(superuser, "BATCH", "5")
    assert refused.status_code == 200
    page = refused.content.decode()
    assert "1 requests waiting or running, 1 open batches" in page and "confirm to apply it" in page
    assert versions() == before
    assert admin_post(superuser, "BATCH", "5", confirm=True).status_code == 302
    assert versions()[0] == Decimal("5")

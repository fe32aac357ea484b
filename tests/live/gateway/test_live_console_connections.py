"""The console's pages leave no PostgreSQL connection open behind them.

Under ASGI Django runs each page's synchronous part in a thread of its own; a connection kept for
``CONN_MAX_AGE`` outlived that thread, open on the server until the collector happened to free
it, so a run of page views could use up the server's ``max_connections`` (found when the
gateway's collector thresholds were raised: the console's browser test got "too many clients").
Each page's connection now closes with its request (gateway.db.close_at_request_end)."""

from __future__ import annotations

import re

import httpx
import psycopg
import pytest

from simbackend import SimConfig, start_in_thread
from tests.support.livestack import start_gateway
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = [pytest.mark.live, pytest.mark.postgres]

PAGES = 60
USER = """
from console.services import user_create
user_create(username="ann", role="member", tenant_slug="acme", password="ann-password-1", actor="test")
"""


def _connections(database_url: str) -> int:
    server, name = database_url.rsplit("/", 1)
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        (count,) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [name]).fetchone()
    return int(count)


def test_page_views_leave_no_connection_open_on_the_server(tmp_path):
    sim = start_in_thread(SimConfig(port=0, slots=1, seed=1))
    gateway = start_gateway(
        tmp_path / "gw",
        scheduler_yaml(tenants=[tenant("acme", share=0.5)], backends=[backend("b", f"{sim.url}/v1", slots=1)]),
        {"k": ("acme", "INTERACTIVE")},
    )
    try:
        gateway.shell(USER)
        with httpx.Client(base_url=gateway.url, timeout=30) as client:
            form = client.get("/console/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
            assert token is not None
            login = client.post(
                "/console/login/",
                data={"csrfmiddlewaretoken": token.group(1), "username": "ann", "password": "ann-password-1"},
            )
            assert login.status_code == 302, login.text[:300]
            before = _connections(gateway.env["DATABASE_URL"])
            for _ in range(PAGES):
                assert client.get("/console/queue/").status_code == 200
            after = _connections(gateway.env["DATABASE_URL"])
        assert after - before < 5, f"{after - before} more connections open after {PAGES} pages ({before} before)"
    finally:
        gateway.stop()
        sim.stop()

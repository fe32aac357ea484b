"""A served request is charged exactly once, even when the database is down as it ends: its
settlement is journaled before the client gets its last byte (with the charge it will book in
``X-Charge``), retried while the process lives, and, if the process is killed first, booked by
its billing worker or by the next process on the host. The gateway reaches PostgreSQL through a
`PgProxy` the test cuts and restores (the shared server is never stopped)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import psycopg
import pytest

from simbackend import SimConfig, start_in_thread
from tests.support import livestack
from tests.support.livestack import (
    FAST_HOUSEKEEPING,
    Gateway,
    another_process,
    one_tenant_yaml,
    start_gateway,
    wait_until,
)
from tests.support.pgproxy import PgProxy

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.redis]

SETTINGS = {"FAIRGATE_AUTH_CACHE_MS": "600000", **FAST_HOUSEKEEPING}


class Stack:
    def __init__(self, gateway: Gateway, proxy: PgProxy, direct_url: str) -> None:
        self.gateway, self.proxy, self.direct_url = gateway, proxy, direct_url

    def ledger(self, rid: str) -> list[tuple[str, Decimal]]:
        with psycopg.connect(self.direct_url) as conn:
            rows = conn.execute(
                "SELECT kind, amount FROM billing_ledgerentry WHERE request_id = %s ORDER BY id", [rid]
            ).fetchall()
        return [(kind, Decimal(amount)) for kind, amount in rows]

    def journals(self) -> list[Path]:
        directory = Path(self.gateway.env["FAIRGATE_VAR_DIR"]) / "journal"
        return sorted(directory.glob("*.jsonl")) if directory.exists() else []

    def journal_lines(self) -> str:
        return "".join(path.read_text() for path in self.journals())

    def journaled(self) -> set[str]:
        """Request ids of the settlements in the host's journals (booked ones too: a journal has
        no booked marks, a segment goes once all of it is booked)."""
        return {
            json.loads(line)["settle"]["request_id"]
            for line in self.journal_lines().splitlines()
            if line.startswith('{"settle"')
        }


@pytest.fixture
def stack(tmp_path) -> Iterator[Stack]:
    sim = start_in_thread(SimConfig(port=0, slots=8, ttft_ms=1, tokens_per_s=20, seed=4))  # 40 tokens: 2 s
    proxy = PgProxy().start()
    direct = livestack._postgres_database
    made: dict[str, str] = {}

    def through(var_dir):
        made["url"] = direct(var_dir)
        return proxy.url_through(made["url"])

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(livestack, "_postgres_database", through)
            gateway = start_gateway(
                tmp_path / "gw",
                one_tenant_yaml(f"{sim.url}/v1", slots=8),
                {"acme": ("acme", "INTERACTIVE")},
                REDIS_URL=os.environ.get("REDIS_URL", ""),
                **SETTINGS,
            )
        yield Stack(gateway, proxy, made["url"])
        proxy.restore()
        gateway.stop()
    finally:
        proxy.stop()
        sim.stop()


def answered_during_an_outage(stack: Stack, rid: str, *, stream: bool) -> httpx.Response | str:
    """Sends a request, cuts the database while the backend is answering it, returns its answer."""
    answer: dict = {}

    def ask() -> None:
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "count slowly"}],
            "max_tokens": 40,
            "stream": stream,
        }
        with stack.gateway.http("acme", timeout=120) as client:
            response = client.post("/v1/chat/completions", json=body, headers={"X-Request-Id": rid})
            answer["response"] = response

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    wait_until(
        lambda: (
            stack.ledger(f"acme/{rid}") == [("hold", stack.ledger(f"acme/{rid}")[0][1])]
            if stack.ledger(f"acme/{rid}")
            else False
        ),
        limit_s=60,
        what="the request held",
    )
    stack.proxy.cut()  # the backend is still answering it
    thread.join(timeout=120)
    return answer["response"]


def charges(stack: Stack, rid: str) -> list[Decimal]:
    return [amount for kind, amount in stack.ledger(rid) if kind == "charge"]


def charged_as_told(stack: Stack, rid: str, told: Decimal | None) -> None:
    """Exactly one charge, the one its client was told, and the ledger consistent."""
    wait_until(lambda: charges(stack, f"acme/{rid}"), limit_s=60, step_s=0.2, what=f"the settlement of {rid} booked")
    assert charges(stack, f"acme/{rid}") == ([told] if told is not None else charges(stack, f"acme/{rid}")[:1])
    kinds = sorted(kind for kind, _ in stack.ledger(f"acme/{rid}"))
    assert kinds == ["charge", "hold", "release"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_settlement_made_while_the_database_is_down_is_booked_once_it_is_back(stack, stream):
    response = answered_during_an_outage(stack, "out-1", stream=stream)
    assert response.status_code == 200
    told = None
    if stream:
        assert response.text.rstrip().endswith("data: [DONE]")  # the whole stream: served
    else:
        assert response.json()["choices"]
        told = Decimal(response.headers["X-Charge"])  # priced before it could be booked
    assert "acme/out-1" in stack.journaled()  # on disk before the client got its last byte
    assert charges(stack, "acme/out-1") == []
    stack.proxy.restore()
    charged_as_told(stack, "out-1", told)
    wait_until(lambda: stack.gateway.metric("fairgate_billing_unbooked") == 0, limit_s=30, what="nothing kept")
    stack.gateway.manage("ledger", "verify")


def test_a_killed_gateways_billing_worker_books_what_it_journaled_without_a_restart(stack):
    response = answered_during_an_outage(stack, "out-3", stream=False)
    told = Decimal(response.headers["X-Charge"])
    stack.gateway.kill()  # the gateway only: its billing worker sees the pipe end
    assert "acme/out-3" in stack.journaled()
    stack.proxy.restore()  # no gateway is started again
    charged_as_told(stack, "out-3", told)
    wait_until(lambda: not stack.journals(), limit_s=30, what="the journal booked and removed")
    released = [amount for kind, amount in stack.ledger("acme/out-3") if kind == "release"]
    assert len(released) == 1  # released once, as settled (not as a dead process's hold)


def test_a_journaled_settlement_of_a_killed_process_is_booked_by_the_next_one_on_the_host(stack):
    response = answered_during_an_outage(stack, "out-2", stream=False)
    told = Decimal(response.headers["X-Charge"])
    worker = stack.gateway.billing_worker_pid()
    stack.gateway.kill()  # before the database came back: only the journal knows the request was served
    os.kill(worker, 9)  # and its billing worker with it (a machine's crash, or the whole group killed)
    (left_behind,) = stack.journals()
    assert stack.journaled() == {"acme/out-2"}
    stack.proxy.restore()
    restarted = another_process(stack.gateway, "the restarted gateway")
    try:
        charged_as_told(stack, "out-2", told)
        wait_until(lambda: not left_behind.exists(), limit_s=30, what="the old journal retired")
        restarted.manage("ledger", "verify")
    finally:
        restarted.stop()

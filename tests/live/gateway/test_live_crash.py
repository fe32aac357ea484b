"""A crash leaves nothing held: two `serve` processes on one database, one killed with SIGKILL
mid-request; the survivor's billing worker releases the dead one's holds within the bound and
never touches its own, whose requests are charged once. (The production shape: REDIS_URL set,
so a process does not take every open hold for its own leftovers at start.)"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
from decimal import Decimal

import openai
import pytest

from simbackend import SimConfig, start_in_thread
from tests.support.livestack import FAST_HOUSEKEEPING, another_process, one_tenant_yaml, start_gateway, wait_until

pytestmark = [pytest.mark.live, pytest.mark.redis]


def query(gateway, sql: str) -> list[tuple]:
    url = gateway.env.get("DATABASE_URL")
    if url:
        import psycopg

        with psycopg.connect(url) as conn:
            return conn.execute(sql).fetchall()
    with sqlite3.connect(os.path.join(gateway.env["FAIRGATE_VAR_DIR"], "fairgate.sqlite3")) as conn:
        return conn.execute(sql).fetchall()


def entries(gateway) -> dict[str, dict[str, tuple]]:
    """request id -> kind -> (amount, reason, owner)."""
    found: dict[str, dict[str, tuple]] = {}
    for rid, kind, amount, reason, owner in query(
        gateway, "SELECT request_id, kind, amount, reason, owner FROM billing_ledgerentry"
    ):
        found.setdefault(rid, {})[kind] = (Decimal(str(amount)), reason, owner)
    return found


def balances(gateway) -> list[tuple[Decimal, Decimal, Decimal]]:
    return [
        tuple(Decimal(str(v)) for v in row) for row in query(gateway, 'SELECT spent, held, "limit" FROM billing_budget')
    ]


@pytest.fixture
def stack(tmp_path):
    sim = start_in_thread(SimConfig(port=0, slots=16, ttft_ms=1, tokens_per_s=20, seed=9))  # 100 tokens: 5 s
    yaml = one_tenant_yaml(f"{sim.url}/v1", slots=16)
    first = start_gateway(
        tmp_path / "gw",
        yaml,
        {"acme": ("acme", "INTERACTIVE")},
        REDIS_URL=os.environ.get("REDIS_URL", ""),
        **FAST_HOUSEKEEPING,
    )
    second = another_process(first)
    yield first, second
    second.stop()
    first.stop()
    sim.stop()


def send(gateway, prefix: str, count: int, results: dict) -> list[threading.Thread]:
    def one(index: int) -> None:
        rid = f"{prefix}-{index}"
        try:
            reply = gateway.sdk("acme", timeout=120).chat.completions.with_raw_response.create(
                model="m",
                messages=[{"role": "user", "content": "tell me a long story"}],
                max_tokens=100,
                extra_headers={"X-Request-Id": rid},
            )
            results[rid] = Decimal(reply.headers["X-Charge"])
        except (openai.APIError, KeyError) as failed:
            results[rid] = failed

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


def test_the_holds_of_a_killed_process_are_released_and_a_live_ones_are_kept(stack):
    first, second = stack
    results: dict = {}
    threads = send(first, "doomed", 4, results) + send(second, "alive", 4, results)
    wait_until(
        lambda: sum("hold" in kinds for kinds in entries(first).values()) == 8, limit_s=60, what="eight requests held"
    )
    first.kill()  # its billing worker follows it within a second
    wait_until(
        lambda: all("release" in entries(first)[f"acme/doomed-{i}"] for i in range(4)),
        limit_s=60,
        step_s=0.2,
        what="the dead process's holds released",
    )
    for thread in threads:
        thread.join(timeout=120)
    wait_until(  # answered once journaled: booked just after
        lambda: all("charge" in entries(first).get(f"acme/alive-{i}", {}) for i in range(4)),
        limit_s=60,
        step_s=0.2,
        what="the live process's settlements booked",
    )
    ledger = entries(first)
    for i in range(4):
        assert ledger[f"acme/doomed-{i}"]["release"][1] == "owner_gone"
        assert "charge" not in ledger[f"acme/doomed-{i}"]
        alive = ledger[f"acme/alive-{i}"]
        assert alive["release"][1] == "settled", alive  # never released as its process's leftover
        assert alive["charge"][0] == results[f"alive-{i}"]  # the X-Charge its client got
    assert all(spent + held <= limit for spent, held, limit in balances(first))
    assert all(held == 0 for _, held, _ in balances(first))
    second.manage("ledger", "verify")


def test_a_stop_signal_to_the_whole_process_group_is_a_clean_stop(stack):
    first, second = stack
    worker = first.billing_worker_pid()
    os.kill(worker, signal.SIGTERM)  # as honcho or systemd signal every process of the group
    os.kill(first.process.pid, signal.SIGTERM)
    first.process.wait(timeout=60)
    stopped = query(first, "SELECT owner FROM billing_gatewayprocess WHERE stopped_at IS NOT NULL")
    assert len(stopped) == 1  # recorded by its billing worker, which outlived the signal to end last
    assert (
        not os.path.exists(f"/proc/{worker}") or b"Z" in open(f"/proc/{worker}/stat", "rb").read().split(b")")[-1][:3]
    )

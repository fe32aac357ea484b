"""Two gateway processes, one shared scheduler (``FAIRGATE_SCHEDULER=shared``) on real Redis.

With the embedded scheduler each process believes it owns every backend slot and keeps its own
queue: two processes on one backend of 2 slots sent it up to 4 at once (it answered 429), weights
3:1 across processes came out inverted, and an interactive request in one process could not pass
the batch queued in the other. Shared, one dispatcher decides for both. (Each of these tests fails
with ``FAIRGATE_SCHEDULER=embedded``.)"""

from __future__ import annotations

import os
import secrets
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis

from bench.launch import postgres_drop
from tests.support.livestack import another_process, start_gateway, wait_for
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.redis
SLOTS = 2
REQUESTS = 24


def _shared(tmp_path, start_sim, latency_ms: int = 150):
    sim = start_sim(slots=SLOTS, fixed_latency_ms=latency_ms)
    yaml_text = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH"],
        tenants=[tenant("acme", share=0.5)],
        backends=[backend("gpu", f"{sim.url}/v1", slots=SLOTS)],
        queue={"enforce_depth": False},  # all of them wait: the point is who gets the slots
    )
    settings = {
        "FAIRGATE_SCHEDULER": "shared",
        "FAIRGATE_SHARED_PREFIX": f"fairgate:test:shared:{os.getpid()}:{secrets.token_hex(4)}",
    }
    first = start_gateway(tmp_path, yaml_text, {"batch": ("acme", "BATCH")}, **settings)
    second = another_process(first)
    return sim, first, second


def test_two_gateways_never_send_a_backend_more_than_its_slots(tmp_path, start_sim):
    sim, first, second = _shared(tmp_path, start_sim)
    try:
        clients = [gw.http(gw.keys["batch"], timeout=60) for gw in (first, second)]
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}

        def send(i: int) -> int:
            return clients[i % 2].post("/v1/chat/completions", json=body).status_code

        with ThreadPoolExecutor(REQUESTS) as pool:
            statuses = list(pool.map(send, range(REQUESTS)))
        assert statuses == [200] * REQUESTS
        stats = httpx.get(f"{sim.url}/stats").json()
        assert stats["completed"] == REQUESTS
        assert stats["rejected_429"] == 0 and stats["max_in_flight"] <= SLOTS
    finally:
        second.stop()
        first.stop()


def test_a_standby_takes_over_when_the_dispatcher_s_owner_is_killed(tmp_path, start_sim):
    """kill -9 of the process holding the dispatcher's lease, with requests waiting on the other:
    the other takes over from what is in Redis and serves every one of them."""
    sim, first, second = _shared(tmp_path, start_sim, latency_ms=400)
    store = redis.Redis.from_url(os.environ["REDIS_URL"])
    lease = f"{first.env['FAIRGATE_SHARED_PREFIX']}:lease"
    try:
        token = wait_for(lambda: store.get(lease), bool, what="a dispatcher holding the lease", limit_s=30)
        owner_pid = int(token.decode().split(":")[-2])  # <epoch>:<host>:<pid>:<nonce>
        owner, survivor = (first, second) if first.process.pid == owner_pid else (second, first)
        assert owner.process.pid == owner_pid
        client = survivor.http(survivor.keys["batch"], timeout=60)
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
        waiting = 3 * SLOTS
        with ThreadPoolExecutor(waiting) as pool:
            sent = [pool.submit(client.post, "/v1/chat/completions", json=body) for _ in range(waiting)]
            wait_for(lambda: httpx.get(f"{sim.url}/stats").json()["requests"], lambda n: n >= SLOTS, what="running")
            owner.kill()  # the others are queued in the shared engine, granted by nobody now
            statuses = [future.result().status_code for future in sent]
        assert statuses == [200] * waiting
        taken = store.get(lease)
        assert taken is not None and taken != token  # a new owner, with a new token
        assert int(taken.decode().split(":")[-2]) == survivor.process.pid
    finally:
        store.close()
        for gw in (second, first):  # first last: its database is dropped with it
            if gw.process.poll() is None:
                gw.stop()
            elif gw.owns_database and "DATABASE_URL" in gw.env:
                postgres_drop(gw.env["DATABASE_URL"])


def _two_tenants(tmp_path, start_sim, tenants):
    """One backend slot held at the sim's gate, two gateway processes; keys per tenant."""
    sim = start_sim(slots=1, fixed_latency_ms=20)
    sim.gate.close()
    yaml_text = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH"],
        tenants=tenants,
        backends=[backend("gpu", f"{sim.url}/v1", slots=1)],
        queue={"enforce_depth": False},
    )
    keys = {f"{t['slug']}-{cls.lower()}": (t["slug"], cls) for t in tenants for cls in ("BATCH", "INTERACTIVE")}
    first = start_gateway(tmp_path, yaml_text, keys, FAIRGATE_SCHEDULER="shared")
    return sim, first, another_process(first)


def _send_all(pool, gateway, key, ids, cls_header=None):
    client = gateway.http(gateway.keys[key], timeout=60)
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    return [pool.submit(client.post, "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}) for rid in ids]


def _queue(gateway, key) -> list[dict]:
    return gateway.http(gateway.keys[key]).get("/v1/queue").json()["data"]


def _queued(gateway, key) -> int:
    return len(_queue(gateway, key))


def test_weights_3_to_1_across_processes_give_3_to_1_service(tmp_path, start_sim):
    """Two tenants of weights 3:1 flooding BATCH through different processes (with the embedded
    scheduler this came out 15:21, inverted): one queue, so the service is 3:1."""
    sim, first, second = _two_tenants(tmp_path, start_sim, [tenant("big", share=0.6), tenant("small", share=0.2)])
    try:
        with ThreadPoolExecutor(50) as pool:
            blocker = _send_all(pool, first, "big-batch", ["blocker"])  # holds the one slot, at the gate
            wait_for(lambda: sim.gate.waiting, bool, what="the slot taken")
            sent = _send_all(pool, first, "big-batch", [f"big-{i}" for i in range(24)])
            sent += _send_all(pool, second, "small-batch", [f"small-{i}" for i in range(24)])
            wait_for(
                lambda: (_queued(first, "big-batch"), _queued(second, "small-batch")),
                lambda q: q == (25, 24),
                what="all queued",
            )
            # one queue: each process lists the tenant's requests sent through the other too, with
            # the same positions and ETAs
            through_first, through_second = _queue(first, "small-batch"), _queue(second, "small-batch")
            assert len(through_first) == 24
            assert [(r["id"], r["state"], r["position"], r["eta_ms"]) for r in through_first] == [
                (r["id"], r["state"], r["position"], r["eta_ms"]) for r in through_second
            ]
            sim.gate.open()
            assert [f.result().status_code for f in blocker + sent] == [200] * 49
        served = httpx.get(f"{sim.url}/stats").json()["recent_request_ids"]
        first_16 = [rid for rid in served if rid != "blocker"][:16]
        big = sum(rid.startswith("big-") for rid in first_16)
        assert 10 <= big <= 14, first_16  # 12 of 16 at 3:1 (8 at 1:1)
    finally:
        second.stop()
        first.stop()


def test_interactive_through_one_process_overtakes_batch_through_the_other(tmp_path, start_sim):
    sim, first, second = _two_tenants(tmp_path, start_sim, [tenant("acme", share=0.5), tenant("vip", share=0.5)])
    try:
        with ThreadPoolExecutor(20) as pool:
            sent = _send_all(pool, first, "acme-batch", ["blocker"])
            wait_for(lambda: sim.gate.waiting, bool, what="the slot taken")
            sent += _send_all(pool, first, "acme-batch", [f"batch-{i}" for i in range(10)])
            wait_for(lambda: _queued(first, "acme-batch"), lambda q: q == 11, what="the batch queued")
            sent += _send_all(pool, second, "vip-interactive", ["urgent"])
            wait_for(lambda: _queued(second, "vip-interactive"), lambda q: q == 1, what="the interactive one queued")
            sim.gate.open()
            assert [f.result().status_code for f in sent] == [200] * 12
        stats = httpx.get(f"{sim.url}/stats").json()
        assert stats["rejected_429"] == 0  # nothing was sent past the one slot (each arrival is recorded)
        assert stats["recent_request_ids"][:2] == ["blocker", "urgent"], stats["recent_request_ids"]
    finally:
        second.stop()
        first.stop()


def test_a_killed_gateway_s_slot_comes_back_to_the_others(tmp_path, start_sim):
    """kill -9 of a gateway that is not the dispatcher, while its request holds the one slot and
    a request through the other process waits for it: once the dead one's heartbeat has expired
    the dispatcher ends what it had, and the waiting request is served."""
    sim, first, second = _two_tenants(tmp_path, start_sim, [tenant("acme", share=0.5)])
    store = redis.Redis.from_url(os.environ["REDIS_URL"])
    lease = f"{first.env['FAIRGATE_SHARED_PREFIX']}:lease"
    try:
        token = wait_for(lambda: store.get(lease), bool, what="a dispatcher holding the lease", limit_s=30)
        owner_pid = int(token.decode().split(":")[-2])
        victim, survivor = (second, first) if first.process.pid == owner_pid else (first, second)
        with ThreadPoolExecutor(4) as pool:
            doomed = _send_all(pool, victim, "acme-batch", ["doomed"])
            wait_for(lambda: sim.gate.waiting, bool, what="the slot taken by the doomed gateway's request")
            waiting = _send_all(pool, survivor, "acme-batch", ["patient"])
            wait_for(  # the survivor lists the doomed one too: one queue
                lambda: {r["id"]: r["state"] for r in _queue(survivor, "acme-batch")},
                lambda states: states == {"doomed": "running", "patient": "queued"},
                what="the other's request queued behind the doomed one",
            )
            victim.kill()
            with pytest.raises(httpx.TransportError):  # its client saw its connection die
                doomed[0].result()
            sim.gate.open()
            assert waiting[0].result().status_code == 200  # granted once the dead gateway's slot came back
        served = httpx.get(f"{sim.url}/stats").json()["recent_request_ids"]
        assert "patient" in served
    finally:
        store.close()
        for gw in (second, first):
            if gw.process.poll() is None:
                gw.stop()
            elif gw.owns_database and "DATABASE_URL" in gw.env:
                postgres_drop(gw.env["DATABASE_URL"])


def test_a_circuit_opened_by_failures_through_one_gateway_keeps_the_other_away(tmp_path, start_sim):
    """Three failures of a backend seen through one process open its circuit in the dispatcher:
    a request for that backend's model through the other process is refused with 503 at once,
    and the backend sees nothing of it (with each gateway's own circuits, the other would have
    sent it there)."""
    sim = start_sim(slots=4, fail_rate=1.0)
    yaml_text = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH"],
        tenants=[tenant("acme", share=0.5)],
        backends=[backend("bad", f"{sim.url}/v1", slots=4, models=["m"])],
    )
    settings = {
        "FAIRGATE_SCHEDULER": "shared",
        "FAIRGATE_SHARED_PREFIX": f"fairgate:test:shared:{os.getpid()}:{secrets.token_hex(4)}",
        "FAIRGATE_CIRCUIT_FAILURES": "3",
        "FAIRGATE_CIRCUIT_COOLDOWN_MS": "60000",
        "FAIRGATE_UPSTREAM_RETRIES": "0",
    }
    first = start_gateway(tmp_path, yaml_text, {"batch": ("acme", "BATCH")}, **settings)
    second = another_process(first)
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
        through_first = first.http(first.keys["batch"], timeout=30)
        for _ in range(3):
            assert through_first.post("/v1/chat/completions", json=body).status_code == 502
        assert httpx.get(f"{sim.url}/stats").json()["requests"] == 3
        wait_for(  # the other process's replica has the dispatcher's step with the third failure
            lambda: second.metric("fairgate_backend_circuit_open", backend="bad"),
            lambda v: v == 1,
            what="the circuit open in the other process's view",
        )
        refused = second.http(second.keys["batch"], timeout=30).post("/v1/chat/completions", json=body)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "no_backend"
        assert httpx.get(f"{sim.url}/stats").json()["requests"] == 3  # nothing more reached it
    finally:
        second.stop()
        first.stop()


def test_a_request_finished_through_one_process_is_found_through_every_other(tmp_path, start_sim):
    """GET /v1/queue/{id} and the console's job cards read the terminal log of finished requests;
    each process appends its own to the shared stream, so one that ended through the first process
    is found through the second, and through a third started after it ended (read back at start)."""
    sim, first, second = _shared(tmp_path, start_sim, latency_ms=5)
    third = None
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        served = first.http(first.keys["batch"], timeout=30).post(
            "/v1/chat/completions", json=body, headers={"X-Request-Id": "done-1", "X-Job-Id": "report-1"}
        )
        assert served.status_code == 200
        through_first = first.http(first.keys["batch"]).get("/v1/queue/done-1").json()
        assert through_first["state"] == "completed" and through_first["job"] == "report-1"

        def read(gateway) -> dict:
            answer = gateway.http(gateway.keys["batch"]).get("/v1/queue/done-1")
            return answer.json() if answer.status_code == 200 else {}

        def ended(record: dict) -> bool:  # (a moment after the end, another process may still see it run)
            return record.get("state") == "completed"

        found = wait_for(lambda: read(second), ended, what="the finished request found through the other process")
        assert found == through_first
        third = another_process(first, name="a process started after the request ended")
        assert wait_for(lambda: read(third), ended, what="the finished request found after a start") == through_first
    finally:
        for gateway in (third, second, first):
            if gateway is not None:
                gateway.stop()

"""Two gateway processes, one shared scheduler (``FAIRGATE_SCHEDULER=shared``) on real Redis.

With the embedded scheduler each process believes it owns every backend slot: two processes on
one backend of 2 slots sent it up to 4 at once, and it answered 429. Shared, one dispatcher
grants for both, so the backend never sees more than its slots, and every request is served."""

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
    settings = {"FAIRGATE_SCHEDULER": "shared", "FAIRGATE_SHARED_PREFIX": f"fairgate:test:{secrets.token_hex(4)}"}
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

"""The shared path decides exactly as the embedded engine does, through a handover too.

The same random sequence of submits, completions, failures, requeues, cancels and clock ticks (each
with the gateways' renewals of their running requests' leases, as their heartbeats send) goes (a)
straight into an in-memory engine, pumped after each operation, as the embedded dispatcher pumps
it, and (b) through the full shared path on real Redis, from two gateways: the gateway of
the owner's own process hands its commands to the owner in process and gets its answers in
process, the other's client sends each command to the stream and reads its answers back from its
list; the owning dispatcher (virtual clock) takes both and commits its step; a replica (what every
gateway keeps to read positions and counters) replays the owner's steps. Mid-sequence the owner is
dropped (its lease expires, nothing handed over), sometimes after a snapshot, with its own
gateway's last commands still untaken: they go to the stream when the stale owner finds itself
fenced out, and a new owner — in either gateway's process — rebuilds from Redis and takes them.
Every answer — admissions, refusals with their retry-after, grants with backend, wait and
stage, expiries, cancels — must be the same, in the same order, and the replica's counters and
every waiting request's position and ETA the same as the embedded engine's."""

from __future__ import annotations

import asyncio
import os
import secrets

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import Scheduler, TenantSpec, apply_policy
from scheduling.engine.circuits import Circuits
from scheduling.engine.model import Request, RequestId, SchedulerConfig
from scheduling.shared.client import Client
from scheduling.shared.owner import LostLease, Owner
from scheduling.shared.protocol import submit
from scheduling.shared.replica import Keys, Replica
from tests.unit.engine.engine_helpers import backend, config, with_sla

pytestmark = pytest.mark.redis

TENANTS = (TenantSpec("a", 0.6), TenantSpec("b", 0.3), TenantSpec("c", 0.1, vip=True))
CLASSES = ("INTERACTIVE", "NEAR_RT", "BATCH", "RETRY")
GATEWAYS = ("gw1", "gw2")
CIRCUIT_FAILURES, CIRCUIT_COOLDOWN_MS = 1, 400  # each reported failure opens a circuit


def _config() -> SchedulerConfig:
    cfg = config(enforce_depth=True, service_ms_prior=200)
    for name, sla in (("INTERACTIVE", 600), ("NEAR_RT", 1500), ("BATCH", 4000), ("RETRY", 8000)):
        cfg = with_sla(cfg, name, sla)
    cfg = apply_policy(cfg, "fairgate")
    return SchedulerConfig(
        classes=cfg.classes,
        aging=cfg.aging,
        fairness=cfg.fairness,
        queue=cfg.queue,
        policy=cfg.policy,
        tenants=TENANTS,
        backends=(backend("g1", slots=3, tpm=200_000), backend("g2", slots=1, reserved_slots=1)),
    )


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.sampled_from(GATEWAYS),
            st.sampled_from([t.slug for t in TENANTS]),
            st.sampled_from(CLASSES),
            st.sampled_from([50, 400, 1500]),
            st.integers(1, 800),
            st.one_of(st.none(), st.integers(50, 3000)),
        ),
        st.tuples(st.just("advance"), st.integers(1, 700)),
        st.tuples(st.just("complete"), st.integers(0, 20), st.integers(0, 2000)),
        st.tuples(st.just("fail"), st.integers(0, 20)),
        st.tuples(st.just("requeue"), st.integers(0, 20), st.integers(0, 300)),
        st.tuples(st.just("cancel"), st.integers(0, 20)),
        st.tuples(st.just("handover"), st.booleans()),  # before the next step; True: a snapshot first
        st.tuples(st.just("down"), st.sampled_from(["g1", "g2"])),  # an upstream failure reported
    ),
    min_size=10,
    max_size=70,
)


class Reference:
    """The embedded path: engine calls, then expire and dispatch, answered in the protocol's words;
    circuit breakers as the embedded dispatcher keeps them (a completion counts as a success)."""

    def __init__(self, cfg: SchedulerConfig) -> None:
        self.sched = Scheduler(apply_policy(cfg, cfg.policy), tenants=cfg.tenants or (), backends=cfg.backends or ())
        self.backends = cfg.backends or ()
        self.circuits = Circuits(threshold=CIRCUIT_FAILURES, cooldown_ms=CIRCUIT_COOLDOWN_MS)
        self.running: list[str] = []
        self.waiting: list[str] = []

    def backends_changed(self, now: int) -> None:
        self.sched.reconfigure(now_ms=now, backends=self.circuits.effective(self.backends, now))

    def pump(self, now: int, out: list) -> None:
        if self.circuits.reopen_due(now):
            self.backends_changed(now)
        for request in self.sched.expire(now_ms=now):
            self.waiting.remove(request.id)
            out.append(["expired", request.id, now - request.enqueued_ms])
        for grant in self.sched.dispatch(now_ms=now):
            rid = grant.request.id
            self.waiting.remove(rid)
            self.running.append(rid)
            out.append(["granted", rid, grant.backend, grant.waited_ms, grant.preempt, grant.boosted])


def _in_world(body) -> None:
    """Runs ``body(redis_client, keys)`` on real Redis under keys of its own, removed afterwards."""
    import redis.asyncio

    async def run() -> None:
        client = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])
        keys = Keys(f"test:{secrets.token_hex(4)}")
        try:
            await body(client, keys)
        finally:
            names = [key async for key in client.scan_iter(match=f"{keys.prefix}:*")]
            if names:
                await client.delete(*names)
            await client.aclose()

    asyncio.run(run())


async def _scenario(redis, keys: Keys, steps) -> None:
    cfg = _config()
    now = [1_000_000]
    ref = Reference(cfg)
    clients = {gw: Client(redis, gw, keys=keys) for gw in GATEWAYS}
    delivered: dict[str, list] = {gw: [] for gw in GATEWAYS}  # answers handed over in process
    for gw, gateway_client in clients.items():
        gateway_client.on_answer = delivered[gw].append
    gateway_of: dict[str, str] = {}
    replica = Replica(redis, keys=keys)  # what a gateway reads positions and counters from
    owner = Owner(redis, cfg, keys=keys, clock=lambda: now[0], name="first")
    owner.attach(clients["gw1"])  # the owner runs in gw1's process
    owner_of = {"gw1": owner}
    assert await owner.acquire()
    seq, handover = 0, None

    def send(rid: str, command: list) -> None:
        send_as(gateway_of[rid], command)

    def send_as(gw: str, command: list) -> None:
        """As the gateway sends it: in process to the owner of its own process, if that one can take it."""
        local = owner_of.get(gw)
        if local is None or not local.offer(command):
            clients[gw].send(command)

    try:
        for op in steps:
            expected: list = []
            kind = op[0]
            if kind == "handover":
                handover = op[1]
            elif kind == "submit":
                _, gw, tenant, cls, prompt, output, timeout = op
                seq += 1
                rid = f"{tenant}/r{seq}"
                gateway_of[rid] = gw
                request = Request(RequestId(rid), tenant, cls, "m", prompt, output, now[0], None)
                if timeout is not None:
                    request.deadline_ms = now[0] + timeout
                admission = ref.sched.submit(request, now_ms=now[0])
                if admission.admitted:
                    ref.waiting.append(rid)
                    expected.append(["admitted", rid])
                else:
                    expected.append(["refused", rid, admission.reason, admission.retry_after_ms])
                send(
                    rid,
                    submit(
                        gw,
                        rid,
                        tenant=tenant,
                        cls=cls,
                        model="m",
                        prompt_tokens=prompt,
                        expected_output_tokens=output,
                        timeout_ms=timeout,
                    ),
                )
            elif kind == "advance":
                now[0] += op[1]
                for gw in GATEWAYS:  # each renews its running requests' leases, as it does with its heartbeat
                    mine = [rid for rid in ref.running if gateway_of[rid] == gw]
                    if mine:
                        send_as(gw, ["renew", gw, mine])
            elif kind in ("complete", "fail", "requeue") and ref.running:
                rid = ref.running[op[1] % len(ref.running)]
                key = RequestId(rid)
                if kind == "complete":
                    backend_of = ref.sched.backend_of(key)
                    assert backend_of is not None
                    ref.circuits.success(backend_of)
                    ref.sched.complete(key, now_ms=now[0], prompt_tokens=100, output_tokens=op[2])
                    send(rid, ["complete", rid, 100, op[2]])
                elif kind == "fail":
                    ref.sched.fail(key, now_ms=now[0], reason="upstream_error")
                    send(rid, ["fail", rid, "upstream_error"])
                else:
                    ref.sched.requeue(key, now_ms=now[0], backend_retry_after_ms=op[2])
                    ref.waiting.append(rid)
                    send(rid, ["requeue", rid, op[2]])
                ref.running.remove(rid)
            elif kind == "down":
                if ref.circuits.failure(op[1], now[0]):
                    ref.backends_changed(now[0])
                clients["gw2"].send(["upstream", op[1], False, CIRCUIT_FAILURES, CIRCUIT_COOLDOWN_MS])
            elif kind == "cancel" and ref.waiting:
                rid = ref.waiting[op[1] % len(ref.waiting)]
                left = ref.sched.cancel(RequestId(rid), now_ms=now[0])
                if left:
                    ref.waiting.remove(rid)
                expected.append(["cancelled", rid, left])
                send(rid, ["cancel", rid])
            ref.pump(now[0], expected)
            for gateway_client in clients.values():
                await gateway_client.flushed()
            if handover is not None and kind != "handover":  # with this op's commands untaken
                if handover:
                    await owner.snapshot()
                else:  # its quiet steps logged (one that dies with them: test_quiet_steps_...)
                    await owner.commit()
                await redis.delete(keys.lease)  # its lease ran out: nothing is handed over
                stale, handover = owner, None
                owner = Owner(redis, cfg, keys=keys, clock=lambda: now[0], name=f"next-{seq}")
                here = GATEWAYS[seq % 2]  # the new owner's process: either gateway's
                owner.attach(clients[here])
                owner_of[here] = owner
                assert await owner.acquire()
                with pytest.raises(LostLease):  # the old owner wakes up: fenced, it tells nobody anything
                    await stale.step(await stale.commands(block_ms=None))
                    await stale.commit()  # a quiet step is fenced when it is logged
                for gateway_client in clients.values():  # what its own gateway had handed it goes to the stream
                    await gateway_client.flushed()
            await owner.step(await owner.commands(block_ms=None))
            for gw, gateway_client in clients.items():
                got = await gateway_client.answers(block_s=None) + delivered[gw]
                delivered[gw].clear()
                assert got == [a for a in expected if gateway_of[a[1]] == gw], f"{gw}, after {op}"
            if owner.unlogged:  # a quiet step waits for the next one: the replicas see both together
                continue
            await replica.catch_up()
            assert replica.engine().counters.as_dict() == ref.sched.counters.as_dict()
            for rid in ref.waiting:
                key = RequestId(rid)
                assert replica.engine().position(key, now_ms=now[0]) == ref.sched.position(key, now_ms=now[0])
        await owner.commit()
        await replica.catch_up()
        assert replica.engine().counters.as_dict() == ref.sched.counters.as_dict()
    finally:
        await owner.resign()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=ops)
def test_the_shared_path_answers_as_the_embedded_engine_through_handovers(steps):
    _in_world(lambda redis_client, keys: _scenario(redis_client, keys, steps))


def test_a_malformed_command_is_skipped_alike_by_the_owner_and_its_replicas():
    async def body(redis_client, keys) -> None:
        cfg = _config()
        owner = Owner(redis_client, cfg, keys=keys, clock=lambda: 1_000_000, name="only")
        assert await owner.acquire()
        for raw in (b"not json", b'{"a": 1}', b'["launch", 1]', b'["submit", "gw1", "a/x", "a", "NOPE"]'):
            await redis_client.xadd(keys.cmds, {"c": raw})  # one JSON command: the format before the batches
        for packed in (b"\xc1", b"\x92\x01", msgpack.packb({"a": 1}), msgpack.packb([["launch", 1], 5, [], "x"])):
            await redis_client.xadd(keys.cmds, {"m": packed})  # not msgpack, cut short, not a list, not commands
        await redis_client.xadd(keys.cmds, {"other": b"1"})
        client = Client(redis_client, "gw1", keys=keys)
        client.send(
            submit("gw1", "a/ok", tenant="a", cls="BATCH", model="m", prompt_tokens=5, expected_output_tokens=5)
        )
        await client.flushed()
        await owner.step(await owner.commands(block_ms=None))
        assert await client.answers(block_s=None) == [
            ["refused", "a/x", "invalid", None],  # a submit the engine cannot take is refused, not dropped
            ["admitted", "a/ok"],
            ["granted", "a/ok", "g1", 0, False, False],
        ]
        replica = Replica(redis_client, keys=keys)
        await replica.load()
        assert replica.engine().counters.as_dict() == owner.engine().counters.as_dict()
        assert replica.routes == owner.routes

    _in_world(body)


def test_quiet_steps_an_owner_dies_with_are_taken_again_by_the_next():
    """A completion that answered nobody waits to be logged with the next step; if its owner dies
    first, the next owner takes the completion again from the stream: the slot comes back."""

    async def body(redis_client, keys) -> None:
        cfg = _config()
        owner = Owner(redis_client, cfg, keys=keys, clock=lambda: 1_000_000, name="first")
        assert await owner.acquire()
        client = Client(redis_client, "gw2", keys=keys)
        client.send(
            submit("gw2", "a/one", tenant="a", cls="BATCH", model="m", prompt_tokens=5, expected_output_tokens=5)
        )
        await client.flushed()
        await owner.step(await owner.commands(block_ms=None))
        assert await client.answers(block_s=None) == [
            ["admitted", "a/one"],
            ["granted", "a/one", "g1", 0, False, False],
        ]
        client.send(["complete", "a/one", 5, 5])
        await client.flushed()
        await owner.step(await owner.commands(block_ms=None))
        assert owner.unlogged == 1  # quiet: nobody was told anything
        await redis_client.delete(keys.lease)  # the owner died before logging it
        new = Owner(redis_client, cfg, keys=keys, clock=lambda: 1_000_500, name="next")
        assert await new.acquire()
        assert new.engine().state_of(RequestId("a/one")) == "running"  # as the log has it
        await new.step(await new.commands(block_ms=None))
        assert new.engine().state_of(RequestId("a/one")) is None
        assert new.engine().counters.as_dict()["classes"]["BATCH"]["completed"] == 1

    _in_world(body)

"""Running slots of the shared scheduler are leased one by one: a grant holds its slot for
`RUN_LEASE_MS`, each gateway renews its own running requests' leases with its heartbeat, and a
request nobody renews (its gateway lost track of it) gives its slot back when its lease ends."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from gateway.shared import SharedDispatcher
from scheduling.engine.model import Request, RequestId
from scheduling.shared.client import Client
from scheduling.shared.owner import Owner
from scheduling.shared.protocol import RUN_CHECK_MS, RUN_LEASE_MS, submit
from scheduling.shared.replica import Replica
from tests.integration.scheduling.test_shared_differential import _config, _in_world
from tests.integration.scheduling.test_shared_wire import _submit

pytestmark = pytest.mark.redis


def test_a_running_request_not_renewed_gives_its_slot_back_when_its_lease_ends():
    """A grant leases its slot for `RUN_LEASE_MS`; a gateway's renewal extends the leases of its own
    running requests, not another gateway's; at the first check (every `RUN_CHECK_MS`) after a lease
    ends the request is failed, its gateway told, and the slot granted in the same step to a request
    waiting for one; replicas alike."""

    async def body(redis_client, keys) -> None:
        now = [1_000_000]
        owner = Owner(redis_client, _config(), keys=keys, clock=lambda: now[0], name="only")
        assert await owner.acquire()
        gw1, gw2 = Client(redis_client, "gw1", keys=keys), Client(redis_client, "gw2", keys=keys)

        async def step(*sent: tuple[Client, list]) -> dict[str, list]:
            for client, command in sent:
                client.send(command)
            for client in (gw1, gw2):
                await client.flushed()
            await owner.step(await owner.commands(block_ms=None))
            await owner.commit()
            return {client.gateway: await client.answers(block_s=None) for client in (gw1, gw2)}

        def kinds(answers: list, kind: str) -> list[str]:
            return sorted(answer[1] for answer in answers if answer[0] == kind)

        first = await step(*((gw1, _submit("gw1", f"a/{n}")) for n in range(3)))
        assert kinds(first["gw1"], "granted") == ["a/0", "a/1", "a/2"]
        granted_ms = now[0]

        now[0] += RUN_LEASE_MS // 2
        told = await step((gw1, ["renew", "gw1", ["a/0", "a/1"]]), (gw2, ["renew", "gw2", ["a/2"]]))
        assert told == {"gw1": [], "gw2": []}

        now[0] = granted_ms + RUN_LEASE_MS - 1  # no lease has ended yet
        waiting = submit("gw2", "b/0", tenant="b", cls="BATCH", model="m", prompt_tokens=5, expected_output_tokens=5)
        assert await step((gw2, waiting)) == {"gw1": [], "gw2": [["admitted", "b/0"]]}  # every slot it may take is held

        now[0] = granted_ms + RUN_LEASE_MS + RUN_CHECK_MS  # a/2's lease has ended (gw2's renewal of it did not count)
        told = await step()
        assert kinds(told["gw1"], "reclaimed") == ["a/2"] and kinds(told["gw1"], "granted") == []
        assert kinds(told["gw2"], "granted") == ["b/0"]
        assert owner.sched is not None and owner.sched.state_of(RequestId("a/2")) is None
        assert sorted(owner.routes.of) == ["a/0", "a/1", "b/0"]

        now[0] = granted_ms + RUN_LEASE_MS // 2 + RUN_LEASE_MS + RUN_CHECK_MS  # a/0's, a/1's renewed leases ended
        told = await step()
        assert kinds(told["gw1"], "reclaimed") == ["a/0", "a/1"] and told["gw2"] == []
        assert owner.routes.of == {"b/0": "gw2"} and list(owner.routes.leased) == ["b/0"]

        replica = Replica(redis_client, keys=keys)
        await replica.catch_up()
        assert replica.engine().counters.as_dict() == owner.sched.counters.as_dict()
        assert replica.routes.leased == owner.routes.leased
        await owner.resign()

    _in_world(body)


def test_a_gateway_renews_the_leases_of_its_running_requests_only(settings):
    """What the gateway sends with each heartbeat (`SharedDispatcher._renew_running`): a ``renew``
    of its running requests, which moves their leases' end; a waiting one is not in it."""
    settings.FAIRGATE_SHARED_PREFIX = prefix = f"test:leases:{secrets.token_hex(4)}"
    cfg = _config()

    async def run() -> None:
        d = SharedDispatcher(cfg, audit_pk=None, loop=asyncio.get_running_loop())
        owner = d.owner
        try:
            assert await owner.acquire()  # this process holds the role: its commands go in process
            entries = []
            for n in range(5):  # 4 slots (3 + 1 reserved): the fifth waits
                now_ms = d.now_ms()
                request = Request(RequestId(f"a/r{n}"), "a", "INTERACTIVE", "m", 5, 5, now_ms, None)
                admitting = asyncio.ensure_future(
                    d.admit(request, public_id=f"r{n}", declared_class="INTERACTIVE", rule=None)
                )
                await asyncio.sleep(0)  # its submit is offered to the owner
                await owner.step([])
                entries.append(await admitting)
            running = sorted(e.key for e in entries if e.future.done())
            waiting = [e.key for e in entries if not e.future.done()]
            assert len(running) >= 1 and waiting, (running, waiting)
            before = dict(owner.routes.leased)
            assert sorted(before) == running
            await asyncio.sleep(0.005)  # the next step's instant is later
            d._renew_running()
            await owner.step([])
            assert sorted(owner.routes.leased) == running  # the waiting one has no lease
            assert all(owner.routes.leased[key] > before[key] for key in running)
        finally:
            await owner.resign()
            names = [key async for key in d.redis.scan_iter(match=f"{prefix}:*")]
            if names:
                await d.redis.delete(*names)
            await d.redis.aclose()

    asyncio.run(run())

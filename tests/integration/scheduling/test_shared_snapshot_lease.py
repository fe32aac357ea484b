"""A snapshot does not cost the dispatcher its lease (issue 13): recording the engine holds the
event loop, so nothing renews the lease meanwhile; the owner stretches the lease first to cover
what the last snapshot cost per live request, renewals never shorten it, and the snapshot's
script gives it back its usual time. On real Redis."""

from __future__ import annotations

import time

import pytest

from scheduling.shared import owner as owner_module
from scheduling.shared.owner import LEASE_MS, Owner
from scheduling.shared.protocol import submit
from scheduling.shared.state import pack_state as owner_pack_state
from tests.integration.scheduling.test_shared_differential import _config, _in_world

pytestmark = pytest.mark.redis


def _slow_pack_state(hold_s: list[float]):
    """The owner's ``pack_state``, holding the thread (so the event loop) ``hold_s[0]`` seconds
    longer, as a large engine does."""

    def pack_state(*state):
        time.sleep(hold_s[0])
        return owner_pack_state(*state)

    return pack_state


async def _owner_with_requests(redis_client, keys) -> Owner:
    owner = Owner(redis_client, _config(), keys=keys, clock=lambda: 1_000_000, name="only")
    assert await owner.acquire()
    commands = [
        submit("gw", f"a/{n}", tenant="a", cls="BATCH", model="m", prompt_tokens=5, expected_output_tokens=5)
        for n in range(20)
    ]
    await redis_client.xadd(keys.cmds, {"m": owner_module.pack(commands)})
    await owner.step(await owner.commands(block_ms=None))
    await owner.commit()
    assert len(owner.routes.of) == 20  # 4 running, 16 waiting
    return owner


def test_a_snapshot_that_takes_longer_than_the_lease_keeps_it(monkeypatch):
    """The first snapshot measures the cost (a fraction of the lease); the next one, slower than
    the whole lease, is covered by the stretch that cost gives."""

    async def body(redis_client, keys) -> None:
        owner = await _owner_with_requests(redis_client, keys)
        hold_s = [0.5 * LEASE_MS / 1000]
        monkeypatch.setattr(owner_module, "pack_state", _slow_pack_state(hold_s))
        await owner.snapshot()
        assert owner.snapshot_ms_per_request * owner_module.SNAPSHOT_REQUESTS_FLOOR >= 0.5 * LEASE_MS
        hold_s[0] = 1.25 * LEASE_MS / 1000
        await owner.snapshot()  # before the stretch: the lease expired under the recording, LostLease
        assert owner.owns and await redis_client.get(keys.lease) == owner.token.encode()
        assert 0 < await redis_client.pttl(keys.lease) <= LEASE_MS  # back to its usual time
        assert await redis_client.hget(keys.snap, "step") == owner.last_step
        await owner.resign()

    _in_world(body)


def test_renewals_never_shorten_a_stretched_lease():
    async def body(redis_client, keys) -> None:
        owner = await _owner_with_requests(redis_client, keys)
        owner.snapshot_ms_per_request = 10 * LEASE_MS / owner_module.SNAPSHOT_REQUESTS_FLOOR
        await owner._stretch_for_snapshot()
        assert await redis_client.pttl(keys.lease) > 10 * LEASE_MS
        await owner.renew()
        more = submit("gw", "a/late", tenant="a", cls="BATCH", model="m", prompt_tokens=5, expected_output_tokens=5)
        await redis_client.xadd(keys.cmds, {"m": owner_module.pack([more])})
        assert await owner.step(await owner.commands(block_ms=None))  # it answers: committed, which renews too
        assert owner.unlogged == 0
        assert await redis_client.pttl(keys.lease) > 10 * LEASE_MS
        await owner.snapshot()
        assert 0 < await redis_client.pttl(keys.lease) <= LEASE_MS
        await owner.resign()

    _in_world(body)

"""A replica knows it missed no step (issue 13): each logged step names the one before it
(``prev``), so a replica that follows the owner through its snapshots replays on, and one whose
next steps were trimmed away reloads from the snapshot. Before, a snapshot taken while a replica
read the steps it had just logged made the replica reload every few seconds ("fell behind the
trimmed step log"). On real Redis."""

from __future__ import annotations

import logging

import pytest

from scheduling.shared import owner as owner_module
from scheduling.shared.owner import Owner
from scheduling.shared.protocol import submit
from scheduling.shared.replica import Replica
from tests.integration.scheduling.test_shared_differential import _config, _in_world

pytestmark = pytest.mark.redis
BEHIND = "fell behind the trimmed step log"


async def _step(owner: Owner, redis_client, keys, n: int) -> None:
    command = submit("gw", f"a/{n}", tenant="a", cls="BATCH", model="m", prompt_tokens=5, expected_output_tokens=5)
    await redis_client.xadd(keys.cmds, {"m": owner_module.pack([command])})
    await owner.step(await owner.commands(block_ms=None))
    await owner.commit()


def test_a_replica_following_the_owner_through_its_snapshots_never_reloads(caplog):
    async def body(redis_client, keys) -> None:
        owner = Owner(redis_client, _config(), keys=keys, clock=lambda: 1_000_000, name="only")
        assert await owner.acquire()
        replica = Replica(redis_client, keys=keys)
        await replica.load()
        reloads = 0
        for n in range(6):
            await _step(owner, redis_client, keys, n)
            await owner.snapshot()  # the steps just logged are trimmed up to this one's, before the replica reads
            loaded = replica.loaded
            await replica.follow(block_ms=10)
            reloads += BEHIND in caplog.text
            caplog.clear()
            assert loaded and replica.last_step == owner.last_step
            assert sorted(replica.routes.of) == sorted(owner.routes.of)
        assert reloads == 0
        await owner.resign()

    with caplog.at_level(logging.WARNING, logger="scheduling.shared.replica"):
        _in_world(body)


def test_a_replica_whose_next_steps_were_trimmed_reloads_from_the_snapshot(caplog):
    async def body(redis_client, keys) -> None:
        owner = Owner(redis_client, _config(), keys=keys, clock=lambda: 1_000_000, name="only")
        assert await owner.acquire()
        await _step(owner, redis_client, keys, 0)
        replica = Replica(redis_client, keys=keys)
        await replica.load()
        behind = replica.last_step
        for n in range(1, 4):
            await _step(owner, redis_client, keys, n)
        await owner.snapshot()  # trims the steps after `behind`, but the snapshot's own
        await _step(owner, redis_client, keys, 4)
        assert await replica.follow(block_ms=10) == 0  # what it read does not follow its last step
        assert BEHIND in caplog.text
        assert replica.last_step != behind
        await replica.catch_up()
        assert replica.last_step == owner.last_step
        assert sorted(replica.routes.of) == sorted(owner.routes.of)
        await owner.resign()

    with caplog.at_level(logging.WARNING, logger="scheduling.shared.replica"):
        _in_world(body)

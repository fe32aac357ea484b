"""The shared scheduler's wire on real Redis: commands and answers go in batches, and a gateway's
heartbeat is there before its first command (else the dispatcher could end its requests at once)."""

from __future__ import annotations

import pytest

from scheduling.shared.client import Client
from scheduling.shared.owner import Owner
from scheduling.shared.protocol import submit
from tests.integration.scheduling.test_shared_differential import _config, _in_world

pytestmark = pytest.mark.redis


def _submit(gateway: str, rid: str) -> list:
    return submit(gateway, rid, tenant="a", cls="BATCH", model="m", prompt_tokens=5, expected_output_tokens=5)


def test_one_turn_of_commands_is_one_entry_and_one_commit_is_one_element_per_gateway():
    async def body(redis_client, keys) -> None:
        owner = Owner(redis_client, _config(), keys=keys, clock=lambda: 1_000_000, name="only")
        assert await owner.acquire()
        client = Client(redis_client, "gw1", keys=keys)
        for n in range(3):  # one turn of the event loop
            client.send(_submit("gw1", f"a/{n}"))
        await client.flushed()
        assert await redis_client.xlen(keys.cmds) == 1
        await owner.step(await owner.commands(block_ms=None))
        assert await redis_client.llen(keys.out("gw1")) == 1
        answers = await client.answers(block_s=None)
        assert [a[:2] for a in answers if a[0] == "admitted"] == [["admitted", f"a/{n}"] for n in range(3)]
        assert sorted(a[1] for a in answers if a[0] == "granted") == ["a/0", "a/1", "a/2"]  # 3 + 1 slots
        await owner.resign()

    _in_world(body)


def test_a_gateway_beats_before_its_first_command_so_the_dispatcher_keeps_its_requests():
    async def body(redis_client, keys) -> None:
        owner = Owner(redis_client, _config(), keys=keys, clock=lambda: 1_000_000, name="only")
        assert await owner.acquire()
        client = Client(redis_client, "fresh", keys=keys)  # never run(): no heartbeat loop
        client.send(_submit("fresh", "a/x"))
        await client.flushed()
        assert await redis_client.exists(keys.gateway("fresh"))
        await owner.step(await owner.commands(block_ms=None))
        await owner.check_gateways()
        assert await redis_client.xlen(keys.cmds) == 1  # no "gone" command was added for it
        assert owner.routes.of == {"a/x": "fresh"}
        await owner.resign()

    _in_world(body)

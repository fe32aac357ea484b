"""The shared scheduler's wire on real Redis: commands and answers go in batches, a gateway's
heartbeat is there before its first command (else the dispatcher could end its requests at once),
and a gateway's reader ends when stopped."""

from __future__ import annotations

import asyncio
import os

import pytest

from scheduling.shared.client import Client, connect
from scheduling.shared.owner import Owner
from scheduling.shared.protocol import pack, submit
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


def test_clients_reading_under_a_stream_of_answers_end_when_stopped():
    """Each client ends once its stop event is set, while answers keep arriving on its list. (A
    cancelled loop may not: on Python 3.11 a redis-py command under a socket timeout that is
    cancelled as its reply arrives drops the cancellation, and the loop reads on.)"""

    async def body(_plain, keys) -> None:
        redis_client = connect(os.environ["REDIS_URL"])  # with the socket timeout the product runs with
        stop, pushing = asyncio.Event(), asyncio.Event()
        clients = [Client(redis_client, f"gw{n}", keys=keys) for n in range(4)]
        delivered = [0] * len(clients)
        for n, client in enumerate(clients):
            client.on_answer = lambda answer, n=n: delivered.__setitem__(n, delivered[n] + 1)
        answer = pack([["granted", "a/1", "b", 1]])

        async def push(gateway: str) -> None:
            while not pushing.is_set():
                await redis_client.rpush(keys.out(gateway), answer)

        pushers = [asyncio.ensure_future(push(client.gateway)) for client in clients]
        readers = [asyncio.ensure_future(client.run(stop)) for client in clients]
        try:
            while min(delivered) < 50:  # every client is reading, and answers keep coming
                await asyncio.sleep(0.01)
            stop.set()
            done, late = await asyncio.wait(readers, timeout=30)
            assert not late, f"{len(late)} of {len(readers)} clients still reading after their stop"
            for task in done:
                task.result()
        finally:
            pushing.set()
            await asyncio.gather(*pushers)
            for task in readers:
                task.cancel()
            await redis_client.aclose()

    _in_world(body)

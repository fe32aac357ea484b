"""The billing worker yields the CPU to its gateway's event loop (FAIRGATE_BILLING_WORKER_NICE):
the real worker, spawned as a gateway spawns it, is that much nicer than the gateway, and as nice
as it with 0. (The setting is read in the spawned process, from the environment.)"""

from __future__ import annotations

import asyncio
import os

import pytest

from billing.client import pipe as billing_worker


def _worker_niceness() -> int:
    async def scenario() -> int:
        worker = billing_worker.Worker()
        try:
            await worker.started()  # ready is sent after the worker has set its priority
            return os.getpriority(os.PRIO_PROCESS, worker.process.pid)
        finally:
            await worker.stop()

    return asyncio.run(scenario())


@pytest.mark.parametrize("nice", [0, 3])
def test_the_billing_worker_is_as_much_nicer_than_its_gateway_as_configured(nice, monkeypatch):
    monkeypatch.setenv("FAIRGATE_BILLING_WORKER_NICE", str(nice))
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert _worker_niceness() == min(mine + nice, 19)

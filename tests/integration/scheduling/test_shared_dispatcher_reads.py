"""A gateway with the shared scheduler never changes the shared engine's replica itself.

Its configuration poll and its circuit breaker reconfigured the engine in place, as the embedded
dispatcher does; with the shared scheduler that engine is the replica of the dispatcher's (or, in
the process holding the lease, the dispatcher's own), so one process's copy drifted from the
others'. Only the dispatcher's logged steps may change it: a new configuration goes to the
dispatcher, which logs it with its next step."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gateway.shared import SharedDispatcher
from scheduling.engine import TenantSpec
from scheduling.shared.replica import engine_of
from tests.integration.scheduling.test_shared_differential import _config

pytestmark = pytest.mark.redis


def test_a_new_configuration_or_an_open_circuit_leaves_the_replica_alone(settings):
    settings.FAIRGATE_SHARED_PREFIX = "test:reads"
    cfg = _config()

    async def run() -> None:
        d = SharedDispatcher(cfg, audit_pk=None, loop=asyncio.get_running_loop())
        try:
            replica = engine_of(cfg)
            d.owner.sched = replica  # as if replayed from the dispatcher's steps
            before = (replica.counters.as_dict(), [c.name for c in replica._config.classes], replica._tenant_specs)
            changed = replace(cfg, tenants=(*cfg.tenants, TenantSpec("d", 0.2)))
            d.apply_config(changed)
            for _ in range(10):  # the circuit of g1 opens
                d.upstream_result("g1", ok=False)
            assert d.owner.sched is replica and d.sched is replica
            after = (replica.counters.as_dict(), [c.name for c in replica._config.classes], replica._tenant_specs)
            assert after == before
            assert "d" not in replica._tenant_specs  # not applied here: the dispatcher logs it
            assert d.owner._config == changed  # and it is the one sent to the dispatcher
        finally:
            await d.redis.aclose()

    asyncio.run(run())

"""The process's dispatcher: started by the ASGI lifespan, or lazily by the first request
(servers without lifespan, in-process tests). One per event loop."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from django.conf import settings

from gateway import metrics, proxy
from gateway.dispatcher import Dispatcher

log = logging.getLogger(__name__)
_current: Dispatcher | None = None
_starting: asyncio.Task | None = None


def _kind() -> type[Dispatcher]:
    """The embedded dispatcher, or the shared scheduler's (``FAIRGATE_SCHEDULER=shared``)."""
    if settings.FAIRGATE_SCHEDULER == "shared":
        from gateway.shared import SharedDispatcher

        return SharedDispatcher
    return Dispatcher


def current() -> Dispatcher | None:
    """The running dispatcher, if any (for reads such as /metrics and /readyz)."""
    return _current


async def dispatcher_get() -> Dispatcher:
    global _current, _starting
    loop = asyncio.get_running_loop()
    if _current is not None and _current.loop is loop:
        return _current
    if _starting is None or _starting.get_loop() is not loop:
        _starting = loop.create_task(_kind().create(), name="fairgate-dispatcher-start")
    try:
        dispatcher = await asyncio.shield(_starting)
    except Exception:
        _starting = None
        raise
    _current = dispatcher
    return dispatcher


async def dispatcher_stop() -> None:
    global _current, _starting
    dispatcher, _current, _starting = _current, None, None
    if dispatcher is not None:
        await dispatcher.close()
    await proxy.clients_close()


def snapshot() -> dict | None:
    dispatcher = _current
    if dispatcher is None:
        return None
    sched = dispatcher.sched
    now_ms = dispatcher.now_ms()
    counters = sched.counters
    classes = {}
    for spec in dispatcher.config.classes:
        tally = counters.classes.get(spec.name)
        classes[spec.name] = {
            "depth": sched.depth(spec.name),
            "depth_limit": sched.depth_limit(spec.name, now_ms=now_ms),
            "boosted": tally.boosted if tally else 0,
            "preempted": tally.preempted if tally else 0,
        }
    running = Counter(sched.backend_of(request.id) for request in sched.running())  # every process's (shared)
    backends = {}
    for name, backend in dispatcher.backend_specs.items():
        health = dispatcher.circuits.of(name)
        backends[name] = {
            "in_use": running[name],
            "slots": backend.slots,
            "tpm_used": health.tpm_used(now_ms),
            "circuit_open": dispatcher.circuit_open(name, now_ms),
        }
    return {"classes": classes, "backends": backends}


metrics.install_collector(snapshot)

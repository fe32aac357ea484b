"""The process's dispatcher: started by the ASGI lifespan, or lazily by the first request
(servers without lifespan, in-process tests). One per event loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from django.conf import settings

from gateway import metrics, proxy
from gateway.dispatcher import Dispatcher
from gateway.port import SchedulerPort
from gateway.shared import SharedDispatcher

log = logging.getLogger(__name__)
_current: SchedulerPort | None = None
_starting: asyncio.Task | None = None


def _kind() -> Callable[[], Coroutine[Any, Any, SchedulerPort]]:
    """How to start the embedded dispatcher, or the shared scheduler's (``FAIRGATE_SCHEDULER=shared``)."""
    if settings.FAIRGATE_SCHEDULER == "shared":
        return SharedDispatcher.create
    return Dispatcher.create


def current() -> SchedulerPort | None:
    """The running dispatcher, if any (for reads such as /metrics and /readyz)."""
    return _current


async def dispatcher_get() -> SchedulerPort:
    global _current, _starting
    loop = asyncio.get_running_loop()
    if _current is not None and _current.loop is loop:
        return _current
    if _starting is None or _starting.get_loop() is not loop:
        _starting = loop.create_task(_kind()(), name="fairgate-dispatcher-start")
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
    view = dispatcher.queue_view()
    now_ms = dispatcher.now_ms()
    tallies = view.class_tallies()
    classes = {}
    for spec in view.classes():
        tally = tallies.get(spec.name)
        classes[spec.name] = {
            "depth": view.depth(spec.name),
            "depth_limit": view.depth_limit(spec.name, now_ms=now_ms),
            "boosted": tally.boosted if tally else 0,
            "preempted": tally.preempted if tally else 0,
        }
    running = view.running_by_backend()  # every process's (shared)
    backends = {}
    for name, backend in view.backends().items():
        health = view.backend_health(name)
        backends[name] = {
            "in_use": running[name],
            "slots": backend.slots,
            "tpm_used": health.tpm_used(now_ms),
            "circuit_open": dispatcher.circuit_open(name, now_ms),
        }
    return {"classes": classes, "backends": backends}


metrics.install_collector(snapshot)

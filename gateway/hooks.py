"""Work that the apps above the gateway run in every ``serve`` process (the Batch API's feeder):
started once the dispatcher and billing are up, cancelled before they stop (gateway.asgi.Lifespan).
The gateway imports none of those apps; they register here (their AppConfig.ready)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)
_runners: list[Callable[[], Coroutine[Any, Any, None]]] = []
_tasks: list[asyncio.Task] = []


def on_serving(run: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``run()`` is started in every serving process, and cancelled when it stops."""
    if run not in _runners:
        _runners.append(run)


def _ended(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("serving task %s ended", task.get_name(), exc_info=task.exception())


def start() -> None:
    for run in _runners:
        task = asyncio.get_running_loop().create_task(run(), name=getattr(run, "__qualname__", "serving task"))
        task.add_done_callback(_ended)
        _tasks.append(task)


async def stop() -> None:
    tasks, _tasks[:] = list(_tasks), []
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)

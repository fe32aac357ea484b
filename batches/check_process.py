"""The process that checks uploaded batch files (batches.file_check) for a serving process: one
child, spawned at the first upload and kept, at a lower CPU priority, with Django set up on its
own. It ends with its serving process: stopped with it (`checker_stop`), and on its own once that
process is gone however it ended (config.lifeline). Nothing here imports Django's models at the
top: the child imports this module before it has set Django up."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import django
from django.db import connections

from config.lifeline import exit_with_parent

log = logging.getLogger(__name__)
CHECK_NICE = 10  # the checking process yields the CPU to the serving ones
_pool: ProcessPoolExecutor | None = None


def _child_start(parent_pid: int) -> None:
    exit_with_parent(parent_pid)
    os.nice(CHECK_NICE)
    django.setup()


def _child_check(file_id: str) -> None:
    from batches.file_check import file_lines_check  # noqa: PLC0415 -- Django not set up yet when the child imports this module

    try:
        file_lines_check(file_id=file_id)
    finally:
        connections.close_all()


def _checker() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:  # spawned, not forked: the serving process has threads and an event loop
        context = multiprocessing.get_context("spawn")
        _pool = ProcessPoolExecutor(
            max_workers=1, mp_context=context, initializer=_child_start, initargs=(os.getpid(),)
        )
    return _pool


async def file_check_off_process(file_id: str) -> bool:
    """Checks an uploaded file in the checking process; False if that failed (the file stays
    unchecked, and a batch created from it checks it then)."""
    global _pool
    try:
        await asyncio.get_running_loop().run_in_executor(_checker(), _child_check, file_id)
    except Exception:
        log.exception("the lines of file %s could not be checked at upload; a batch made from it checks them", file_id)
        broken, _pool = _pool, None
        if broken is not None:
            broken.shutdown(wait=False, cancel_futures=True)
        return False
    return True


async def checker_stop() -> None:
    """The serving process stops: its checking process, if it started one, ends now (its last
    check done; none is asked once the server has stopped taking requests)."""
    global _pool
    pool, _pool = _pool, None
    if pool is not None:
        await asyncio.get_running_loop().run_in_executor(None, partial(pool.shutdown, wait=True, cancel_futures=True))

"""The shared dispatcher owner's live loop (`run_owner`, behind `Owner.run`): follow and bid for
the lease, then step and commit in two tasks of their own until stopped or the lease is lost."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from scheduling.shared.bell import sleep_or
from scheduling.shared.lease import (
    GATEWAY_CHECK_S,
    IDLE_PUMP_MS,
    LEASE_MS,
    QUIET_COMMIT_MS,
    RETRY_S,
    STANDBY_POLL_MS,
    LostLease,
)

if TYPE_CHECKING:
    from scheduling.shared.owner import Owner, Taken

log = logging.getLogger("scheduling.shared.owner")  # logged as the owner


async def run_owner(owner: Owner, stop: asyncio.Event) -> None:
    """Follow the steps (a standby) and bid for the lease until it is won, then dispatch until
    stopped or the lease is lost (then follow and bid again). ``stop``: set to stop cleanly
    (the lease is given back)."""
    try:
        while not stop.is_set():
            try:
                if not owner.owns:
                    await owner.follow(block_ms=STANDBY_POLL_MS)
                    if not await owner.acquire():
                        continue
                await _serve(owner, stop)
            except LostLease:
                continue
            except Exception:  # Redis out of reach, most likely: stand down, then bid again
                log.exception("dispatcher %s failed; it stands down and bids again", owner.name)
                owner.token = None  # a lease it cannot renew expires: a standby may take over
                owner._hand_back()
                owner._reset()
                await sleep_or(stop, RETRY_S)
    finally:
        try:
            await owner.resign()
        except Exception:  # Redis gone: the lease expires by itself
            log.warning("dispatcher %s could not give its lease back", owner.name)


async def _serve(owner: Owner, stop: asyncio.Event) -> None:
    """Holds the role until stopped (then logs what is applied) or the lease is lost: one task
    applies steps (`_step_forever`, and `_step_local` for this process's gateway), one commits
    them (`_commit_forever`)."""
    owner._serving, owner._closing = True, False
    stepper = asyncio.ensure_future(_step_forever(owner, stop))
    committer = asyncio.ensure_future(_commit_forever(owner))
    if owner._local:
        owner._local_due = True
        asyncio.get_running_loop().call_soon(owner._step_local)
    try:
        done, _ = await asyncio.wait((stepper, committer), return_when=asyncio.FIRST_COMPLETED)
        if stepper in done:
            stepper.result()  # a failure is raised here
            owner._closing = True  # stopped: the committer logs what was applied, then ends
            owner._committer.ring()
        await committer
    finally:
        owner._serving = False
        for task in (stepper, committer):
            task.cancel()
        await asyncio.gather(stepper, committer, return_exceptions=True)


async def _step_forever(owner: Owner, stop: asyncio.Event) -> None:
    """Steps when commands come from the stream, when the engine's next wakeup (an expiry, an
    aging bound, a rate window reopening) has come, and, while requests wait, at least every
    `IDLE_PUMP_MS` (as the embedded dispatcher pumps at each configuration poll); renews the
    lease when no commit did for a while. One read of the stream is always waiting in Redis
    (for `LEASE_MS` / 4 at most), so a command from any gateway wakes the owner at once."""
    limit_ms = LEASE_MS // 4  # the lease is renewed at least this often
    reading: asyncio.Task[Taken] | None = None
    try:
        while not stop.is_set():
            if reading is None:
                reading = asyncio.ensure_future(owner.commands(block_ms=limit_ms))
                reading.add_done_callback(lambda _: owner._stepper.ring())
            now_ms = owner.now_ms()
            wakeup = owner._next_wakeup_ms(now_ms)
            due = owner._config_due or owner.sched is None
            if not (due or reading.done()):
                wait_ms = limit_ms if wakeup is None else max(1, min(limit_ms, wakeup - now_ms))
                await owner._stepper.sleep(wait_ms / 1000)
            taken: Taken = []
            if reading.done():
                taken, reading = reading.result(), None
            now_ms = owner.now_ms()
            waiting = owner.sched is not None and owner.sched.waiting_count > 0
            if (
                taken
                or owner._local
                or due
                or (wakeup is not None and now_ms >= wakeup)
                or (waiting and now_ms - owner.step_ms >= IDLE_PUMP_MS)
            ):
                owner._apply(taken)
                owner._committer.ring()  # a quiet step starts its wait there
            if time.monotonic() - owner._renewed_s >= limit_ms / 1000:
                await owner.renew()
            if time.monotonic() - owner._checked_at_s >= GATEWAY_CHECK_S:
                owner._checked_at_s = time.monotonic()
                await owner.check_gateways()
    finally:
        if reading is not None:  # what it read (if anything) stays in the stream for the next owner
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)


async def _commit_forever(owner: Owner) -> None:
    """Commits the applied steps: at once when one answers someone, quiet ones after
    `QUIET_COMMIT_MS`, with a snapshot every ``snapshot_every_s``; ends once stopped and all
    is logged. The steps applied while a commit is on its way go with the next one."""
    while True:
        snapshot_in_s = owner.snapshot_every_s - (time.monotonic() - owner._snapshot_at_s)
        if owner.sched is None:  # nothing to store yet
            snapshot_in_s = owner.snapshot_every_s
        snap = snapshot_in_s <= 0
        if owner._loud or snap or owner._quiet_too_long or (owner._closing and owner._unlogged):
            await owner.commit(snapshot=snap)
            continue
        if owner._closing:
            return
        wait_s = snapshot_in_s
        if owner._unlogged:
            wait_s = min(wait_s, QUIET_COMMIT_MS / 1000 - (time.monotonic() - owner._unlogged_since_s))
        await owner._committer.sleep(max(0.0, wait_s))

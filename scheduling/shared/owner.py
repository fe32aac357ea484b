"""The shared dispatcher: one owner at a time runs the engine for every gateway, through Redis.

`Owner` bids for the lease (scheduling.shared.lease), catches up as a replica, then takes the
gateways' commands (the Redis stream, or in process from its own gateway), applies them as steps
and commits each with its answers in one fenced script; a snapshot now and then bounds what a
new owner replays. Its live loop: scheduling.shared.owner_loop. Redis keys, the handover and why
nothing is lost or answered twice: docs/shared-scheduler.md.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from scheduling.engine.model import SchedulerConfig
from scheduling.shared.bell import Bell
from scheduling.shared.lease import (
    COMMIT_SCRIPT,
    LEASE_MS,
    MAX_ENTRIES,
    OUT_TTL_MS,
    QUIET_COMMIT_MS,
    RELEASE_SCRIPT,
    RENEW_SCRIPT,
    SNAPSHOT_EVERY_S,
    SNAPSHOT_MS_PER_REQUEST,
    SNAPSHOT_REQUESTS_FLOOR,
    SNAPSHOT_SCRIPT,
    SNAPSHOT_STRETCH_MAX_MS,
    STRETCH_SCRIPT,
    LostLease,
)
from scheduling.shared.owner_loop import run_owner
from scheduling.shared.protocol import Answer, Command, Step, entry_commands, pack
from scheduling.shared.replica import Keys, Replica, id_key, stream_read
from scheduling.shared.state import pack_config, pack_state

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from scheduling.shared.client import Client

log = logging.getLogger(__name__)
Taken = list[tuple[bytes, list[Command | None]]]  # stream entries read: each one's id and commands


def wall_ms() -> int:
    return int(time.time() * 1000)


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class _Applied(NamedTuple):
    """A step applied to the engine and not yet committed."""

    now_ms: int
    last: bytes  # the last command of the stream it took
    cfg: bytes  # the configuration it logs, or b""
    own: bytes  # the attached gateway's commands it took, packed, or b""
    out: dict[str, list[Answer]]  # its answers per gateway
    local: list[Command]  # those commands (handed to the stream if the lease is lost first)


class Owner(Replica):
    """One process's bid for the dispatcher role (a replica kept caught up meanwhile), and the
    role once held.

    ``redis``: a ``redis.asyncio.Redis`` with ``decode_responses=False``. ``config``: the
    configuration to run (`configure` a newer one: it takes effect at the next step, logged
    with it). ``clock``: ms; tests inject a virtual one."""

    def __init__(
        self,
        redis: Redis,
        config: SchedulerConfig,
        *,
        keys: Keys | None = None,
        clock: Callable[[], int] = wall_ms,
        name: str | None = None,
        snapshot_every_s: float = SNAPSHOT_EVERY_S,
    ) -> None:
        super().__init__(redis, keys=keys)
        self.clock = clock
        self.name = name or owner_id()
        self.snapshot_every_s = snapshot_every_s
        self.token: str | None = None
        self._config = config
        self._snapshot_at_s = time.monotonic()
        self._gone_sent: set[str] = set()
        self._checked_at_s = 0.0
        self._commit = redis.register_script(COMMIT_SCRIPT)
        self._renew = redis.register_script(RENEW_SCRIPT)
        self._snapshot = redis.register_script(SNAPSHOT_SCRIPT)
        self._stretch = redis.register_script(STRETCH_SCRIPT)
        self.snapshot_ms_per_request = SNAPSHOT_MS_PER_REQUEST  # measured at each snapshot (`_pack_state`)
        self.snapshot_bytes = 0  # the last snapshot's size
        self._release = redis.register_script(RELEASE_SCRIPT)
        # The gateway of this process, when a serve process holds the role (`attach`): while this
        # owner holds the lease, its commands are taken in process and its answers handed back in
        # process once their step is committed — no stream entry, no answer list, for them.
        self._own: Client | None = None
        self._local: list[Command] = []  # its commands for the next step
        self._local_ok = False  # its stream entries have all been taken: in process from now on
        self._local_due = False  # a step for them is scheduled (`_step_local`)
        # Steps are applied as soon as their commands come and committed by a task of their own
        # (scheduling.shared.owner_loop), several per script: applying never waits for Redis.
        self._unlogged: list[_Applied] = []
        self._inflight: list[_Applied] = []  # the steps of the commit on its way
        self._loud = False  # an unlogged step answers someone: commit at once
        self._unlogged_since_s = 0.0
        self._renewed_s = 0.0
        self._serving = False
        self._closing = False
        self._stepper = Bell()
        self._committer = Bell()
        self._due_key: tuple[int, int] | None = None
        self._due = True
        self._config_version = 0

    # --- the role ----------------------------------------------------------------------------

    @property
    def owns(self) -> bool:
        return self.token is not None

    async def acquire(self) -> bool:
        """Takes the lease if it is free, then catches up with every step logged (the old owner,
        fenced out, can log no more). False: another holds it."""
        if await self.redis.exists(self.keys.lease):
            return False
        epoch = await self.redis.incr(self.keys.epoch)
        token = f"{epoch}:{self.name}"
        if not await self.redis.set(self.keys.lease, token, nx=True, px=LEASE_MS):
            return False
        self.token = token
        self._renewed_s = time.monotonic()
        try:
            replayed = await self.catch_up()
        except BaseException:
            await self.resign()
            raise
        log.info(
            "dispatcher %s took the lease (epoch %s) after %d steps replayed, at command %s",
            self.name,
            epoch,
            replayed,
            self.cursor.decode(),
        )
        return True

    async def resign(self) -> None:
        """Gives the lease back (a clean stop): a standby takes over at once, not after the lease's time."""
        if self.token is not None and self._unlogged:
            try:
                await self.commit()
            except Exception:  # lost already, or Redis out of reach: the next owner takes them again
                log.warning("dispatcher %s could not log its last steps", self.name)
        token, self.token = self.token, None
        self._hand_back()
        if token is not None:
            await self._release(keys=[self.keys.lease], args=[token])

    # --- the gateway of this process ---------------------------------------------------------

    def attach(self, client: Client) -> None:
        """``client``'s commands may come in process (`offer`) and its answers go to its
        ``on_answer`` in process, while this owner holds the lease."""
        self._own = client

    def offer(self, command: Command) -> bool:
        """Takes a command of the attached gateway for the next step, if this owner holds the lease
        and everything that gateway sent through the stream has been taken (so its commands stay
        in order); False: it goes through the stream."""
        own = self._own
        if self.token is None or own is None:
            return False
        if not self._local_ok:
            sent = own.last_sent
            if not own.idle or (sent is not None and id_key(sent) > id_key(self.cursor)):
                return False
            self._local_ok = True
        self._local.append(command)
        if self._serving and not self._local_due:
            self._local_due = True
            asyncio.get_running_loop().call_soon(self._step_local)
        return True

    def _step_local(self) -> None:
        """The attached gateway's commands of this turn of the event loop, in one step."""
        self._local_due = False
        if self._serving and self.token is not None and self._local:
            self._apply([])
            self._stepper.ring()  # the engine's next wakeup may have moved

    def _hand_back(self) -> None:
        """The lease is gone: the attached gateway's commands no step committed go through the
        stream, in their order, before anything it sends next (the next owner takes them). Not
        those of a commit whose fate is unknown (Redis failed under it): they may be logged."""
        pending = [c for applied in (*self._inflight, *self._unlogged) for c in applied.local] + self._local
        self._inflight, self._unlogged, self._local = [], [], []
        self._local_ok = self._loud = False
        if pending and self._own is not None:
            log.warning("dispatcher %s hands %d commands of its gateway to the next owner", self.name, len(pending))
            for command in pending:
                self._own.send(command)

    async def replayed_some(self) -> None:
        if self.token is not None:  # catching up after taking the lease: keep it while replaying
            await self.renew()

    def configure(self, config: SchedulerConfig) -> None:
        self._config = config
        self._config_version += 1

    @property
    def _config_due(self) -> bool:
        """The configuration to run differs from the last one logged (compared once per change of either)."""
        key = (self._config_version, self.logged_version)
        if key != self._due_key:
            self._due_key, self._due = key, self._config != self.logged
        return self._due

    @property
    def unlogged(self) -> int:
        """Steps applied and not yet committed (quiet ones wait for the next step, `QUIET_COMMIT_MS` at most)."""
        return len(self._unlogged)

    # --- stepping ------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return max(self.step_ms, self.clock())

    async def commands(self, *, block_ms: int | None) -> Taken:
        """The stream's entries after the cursor (`MAX_ENTRIES` at most; waiting up to ``block_ms``
        for one; None: not at all), each with its commands. A malformed one is None (skipped by the step)."""
        read = await self.redis.xread({self.keys.cmds: self.cursor}, count=MAX_ENTRIES, block=block_ms)
        return [(entry_id, entry_commands(fields)) for entry_id, fields in stream_read(read)]

    def _apply(self, taken: Taken) -> Step:
        """Applies ``taken`` (from `commands`), then the attached gateway's commands in process,
        at the clock's now, and pumps; the step waits for its commit (`commit`)."""
        now_ms = self.now_ms()
        cfg = pack_config(self._config) if self._config_due else b""
        local, self._local = self._local, []
        step = self.replay(now_ms, [*(command for _, commands in taken for command in commands), *local], cfg)
        if taken:
            self.cursor = taken[-1][0]
        if not self._unlogged:
            self._unlogged_since_s = time.monotonic()
        self._unlogged.append(_Applied(now_ms, self.cursor, cfg, pack(local) if local else b"", step.out, local))
        if step.out:
            self._loud = True
            self._committer.ring()
        return step

    @property
    def _quiet_too_long(self) -> bool:
        return bool(self._unlogged) and time.monotonic() - self._unlogged_since_s >= QUIET_COMMIT_MS / 1000

    async def step(self, taken: Taken) -> dict[str, list[Answer]]:
        """`_apply`, then `commit` unless the step is quiet (then it waits for the next step, or
        `QUIET_COMMIT_MS`); its answers per gateway. Raises LostLease (and stands down) if another
        owner took over. (The live loop applies and commits in tasks of their own: owner_loop.)"""
        if self.token is None:
            raise LostLease("not the owner")
        step = self._apply(taken)
        if step.out or self._quiet_too_long:
            await self.commit()
        return step.out

    async def commit(self, *, snapshot: bool = False) -> None:
        """Logs the steps applied since the last commit, pushes their answers and renews the lease,
        in one script; then hands the attached gateway its answers. ``snapshot``: the engine as
        of those steps is stored too (taken before the script is sent, so it is exactly theirs).

        Recording the engine holds the event loop, so nothing renews the lease meanwhile: with
        tens of thousands of requests waiting it takes longer than the lease, which expired under
        it (and a standby took over, to lose the lease the same way at its own first snapshot).
        So the lease is first stretched to cover it (`_stretch_for_snapshot`); renewals never
        shorten it, and the snapshot's script gives it back its usual time."""
        if self.token is None:
            raise LostLease("not the owner")
        if snapshot:
            await self._stretch_for_snapshot()
        batch, self._unlogged, self._loud = self._unlogged, [], False
        cursor, step_ms = self.cursor, self.step_ms
        state = self._pack_state() if snapshot else None
        self._inflight = batch
        try:
            if batch:
                answers: dict[str, list[Answer]] = {}
                for applied in batch:
                    for gateway, told in applied.out.items():
                        answers.setdefault(gateway, []).extend(told)
                mine = answers.pop(self._own.gateway, []) if self._own is not None else []
                args: list[bytes | str | int] = [self.token, LEASE_MS, OUT_TTL_MS, len(batch)]
                for applied in batch:
                    args.extend((applied.now_ms, applied.last, applied.cfg, applied.own))
                args.extend(pack(told) for told in answers.values())  # one element per gateway
                keys = [self.keys.lease, self.keys.steps, *map(self.keys.out, answers)]
                step_id = await self._commit(keys=keys, args=args)
                if step_id is None:
                    self._stand_down()
                    raise LostLease(f"dispatcher {self.name} lost its lease")
                self.last_step = step_id
                self._renewed_s = time.monotonic()
                if mine:
                    assert self._own is not None
                    self._own.deliver(mine)
            if state is not None:
                keys = [self.keys.lease, self.keys.snap, self.keys.steps, self.keys.cmds]
                snap_args: list[bytes | str | int] = [self.token, state, self.last_step, cursor, step_ms, LEASE_MS]
                if not await self._snapshot(keys=keys, args=snap_args):
                    self._stand_down()
                    raise LostLease(f"dispatcher {self.name} lost its lease")
                self._snapshot_at_s = time.monotonic()
        finally:
            self._inflight = []

    async def _stretch_for_snapshot(self) -> None:
        """Sets the lease's time to the usual one plus twice what the snapshot should take (its
        cost per live request as last measured, times the requests live now), so that the event
        loop held by the recording cannot cost the lease. Should this owner die meanwhile, a
        standby waits that much longer to take over (`SNAPSHOT_STRETCH_MAX_MS` at most)."""
        expected_ms = self.snapshot_ms_per_request * max(len(self.routes.of), SNAPSHOT_REQUESTS_FLOOR)
        stretch_ms = min(LEASE_MS + int(2 * expected_ms), SNAPSHOT_STRETCH_MAX_MS)
        token = self.token
        if token is None or not await self._stretch(keys=[self.keys.lease], args=[token, stretch_ms]):
            self._stand_down()
            raise LostLease(f"dispatcher {self.name} lost its lease")
        self._renewed_s = time.monotonic()

    def _pack_state(self) -> bytes:
        """The engine, its routes and its configuration, packed (scheduling.shared.state); measures
        the cost per live request (spread over `SNAPSHOT_REQUESTS_FLOOR` at least: an engine with
        few has a cost of its own). The collector is paused meanwhile: the engine's many objects
        made its full collections, set off by the packer's own allocations, a large share of the time."""
        started_s = time.monotonic()
        paused = gc.isenabled()
        gc.disable()
        try:
            state = pack_state(self.sched, self.routes, self.logged)
        finally:
            if paused:
                gc.enable()
        took_ms = 1000 * (time.monotonic() - started_s)
        self.snapshot_ms_per_request = took_ms / max(len(self.routes.of), SNAPSHOT_REQUESTS_FLOOR)
        self.snapshot_bytes = len(state)
        if took_ms > LEASE_MS / 2:
            log.warning("dispatcher %s: a snapshot of %d bytes took %.0f ms", self.name, len(state), took_ms)
        return state

    def _stand_down(self) -> None:
        """Lost the lease: the engine took steps nobody logged, so it is rebuilt from Redis."""
        log.warning("dispatcher %s lost its lease to another: standing down", self.name)
        self.token = None
        self._hand_back()
        self._reset()

    async def renew(self) -> None:
        if self.token is None or not await self._renew(keys=[self.keys.lease], args=[self.token, LEASE_MS]):
            if self.token is not None:
                self._stand_down()
            raise LostLease(f"dispatcher {self.name} lost its lease")
        self._renewed_s = time.monotonic()

    async def snapshot(self) -> None:
        """The engine as of the last step (logged with it), so that a new owner or replica replays
        only what came after it."""
        if self.token is not None and self.sched is not None:
            await self.commit(snapshot=True)

    async def check_gateways(self) -> None:
        """Gateways whose heartbeat expired: their requests go (a ``gone`` command, taken next step)."""
        gateways = sorted(set(self.routes.of.values()) - self._gone_sent - self._alive_here())
        if not gateways:
            return
        pipe = self.redis.pipeline(transaction=False)
        for gateway in gateways:
            pipe.exists(self.keys.gateway(gateway))
        alive = await pipe.execute()
        for gateway, up in zip(gateways, alive):
            if not up:
                log.warning("gateway %s stopped beating: its requests are ended", gateway)
                await self.redis.xadd(self.keys.cmds, {"m": pack([["gone", gateway]])})
                self._gone_sent.add(gateway)
        self._gone_sent &= set(self.routes.of.values())

    def _alive_here(self) -> set[str]:
        """The attached gateway runs in this very process: alive while this code runs, whatever its beat."""
        return {self._own.gateway} if self._own is not None else set()

    # --- the live loop (scheduling.shared.owner_loop) -----------------------------------------

    async def run(self, *, stop: asyncio.Event | None = None) -> None:
        """Follow the steps (a standby) and bid for the lease until it is won, then dispatch until
        stopped or the lease is lost (then follow and bid again). ``stop``: set to stop cleanly
        (the lease is given back)."""
        await run_owner(self, stop or asyncio.Event())

    def _next_wakeup_ms(self, now_ms: int) -> int | None:
        """When a step is due with no command: the engine's next wakeup, or a circuit's cool-down end."""
        if self.sched is None:
            return None
        times = [t for t in (self.sched.next_wakeup_ms(now_ms=now_ms), self.routes.circuits.next_change_ms()) if t]
        return min(times) if times else None

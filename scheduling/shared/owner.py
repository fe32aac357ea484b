"""The shared dispatcher: one owner at a time runs the engine for every gateway, through Redis.

Keys (under ``prefix``, ``fairgate:sched`` unless configured):

* ``cmds``: a stream of the gateways' commands (scheduling.shared.protocol), in arrival order;
* ``steps``: a stream of the owner's steps: the instant (``now``), the last command it took
  (``last``), the id of the step before it in the stream (``prev``: a replica knows it missed none),
  and a new configuration when one took effect (``cfg``);
* ``out:<gateway>``: a list per gateway of the answers for its requests (one element per commit);
* ``snap``: the engine (and the routes of its requests) as of one step, a versioned record
  (scheduling.shared.state), with that step's id and its last command's id;
* ``lease``: the owner's token (``<epoch>:<owner id>``, epoch from ``epoch``, an INCR), with a
  time to live the owner renews; ``gw:<gateway>``: each gateway's heartbeat, with one too.

A step is: take the commands after the cursor, apply them at ``now`` and pump the engine
(`protocol.Step`), then **commit**: one Lua script that checks the lease still holds the owner's
token, appends the step, pushes the answers and renews the lease — all or nothing. A stale owner
(its lease expired while it was stopped, and another took over) fails its next commit and
stands down without having told anyone anything: the token is the fence. A *quiet* step (one
that answers nobody: a completion with nothing waiting, say) is committed with the next step, or
`QUIET_COMMIT_MS` later, in one script with it: nothing anyone was told depends on a step not yet
logged, so an owner that dies first loses only steps nobody heard of — their commands are taken
again by the next owner (those of the stream; its own gateway's died with it), as if they had
arrived that much later.

A new owner rebuilds the engine exactly: the last snapshot, then every step after it replayed —
the same commands at the same instants, which the deterministic engine turns into the same state
(their answers were delivered already, by the commit that logged them). Commands after the last
step were never answered; the new owner takes them live. So nothing a gateway sent is lost or
answered twice, and a waiting request keeps its place (`tests/integration/scheduling/test_shared_differential.py`
runs the same random sequences through the embedded engine and through this path, with a
handover in the middle, and compares every answer).

The clock is the owner's ``clock()`` in ms (wall time by default, so that a new owner on another
machine continues it), never behind the last step's. Requests are stamped when the owner takes
them (``enqueued_ms``), and a client's timeout counts from then.
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
from scheduling.shared.protocol import Answer, Command, Step, entry_commands, pack
from scheduling.shared.replica import Keys, Replica, id_key, stream_read
from scheduling.shared.state import pack_config, pack_state

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from scheduling.shared.client import Client

log = logging.getLogger(__name__)
Taken = list[tuple[bytes, list[Command | None]]]  # stream entries read: each one's id and commands

LEASE_MS = 1000  # a standby takes over this long after the owner stopped renewing, at most
STANDBY_POLL_MS = 100
RETRY_S = 1.0  # after a failure (Redis out of reach), before bidding again
IDLE_PUMP_MS = 500  # while requests wait, a step at least this often (the embedded dispatcher's config-poll pump)
MAX_ENTRIES = 32  # stream entries per step (each `protocol.BATCH_MAX` commands at most)
SNAPSHOT_EVERY_S = 5.0
GATEWAY_TTL_MS = 10_000  # a gateway silent this long is gone (its event loop beats every second)
GATEWAY_CHECK_S = 0.5
OUT_TTL_MS = 60_000  # an answer list nobody reads (its gateway died) goes after this
QUIET_COMMIT_MS = 50  # a step that answered nobody is logged with the next one, or after this long
SNAPSHOT_MS_PER_REQUEST = 0.1  # what recording the engine is assumed to cost per live request, until measured
SNAPSHOT_REQUESTS_FLOOR = 1000  # the cost measured with fewer live requests is spread over this many
SNAPSHOT_STRETCH_MAX_MS = 30_000  # the longest a snapshot may stretch the lease (see `Owner.commit`)

# Renewals (the commit's, `_RENEW`) never shorten the lease: a snapshot may have stretched it (`_STRETCH`).
_COMMIT = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return false end
if redis.call('pttl', KEYS[1]) < tonumber(ARGV[2]) then redis.call('pexpire', KEYS[1], ARGV[2]) end
local a = 5
local tail = redis.call('xrevrange', KEYS[2], '+', '-', 'COUNT', 1)
local id = '0-0'
if tail[1] then id = tail[1][1] end
for _ = 1, tonumber(ARGV[4]) do
  local fields = {'now', ARGV[a], 'last', ARGV[a + 1], 'prev', id}
  if ARGV[a + 2] ~= '' then table.insert(fields, 'cfg'); table.insert(fields, ARGV[a + 2]) end
  if ARGV[a + 3] ~= '' then table.insert(fields, 'o'); table.insert(fields, ARGV[a + 3]) end
  id = redis.call('xadd', KEYS[2], '*', unpack(fields))
  a = a + 4
end
for i = 3, #KEYS do
  redis.call('rpush', KEYS[i], ARGV[a])
  redis.call('pexpire', KEYS[i], ARGV[3])
  a = a + 1
end
return id
"""

_RENEW = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('pttl', KEYS[1]) < tonumber(ARGV[2]) then redis.call('pexpire', KEYS[1], ARGV[2]) end
return 1
"""

_STRETCH = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('pexpire', KEYS[1], ARGV[2])
"""

_SNAPSHOT = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('pexpire', KEYS[1], ARGV[6])
redis.call('hset', KEYS[2], 'state', ARGV[2], 'step', ARGV[3], 'cmd', ARGV[4], 'now', ARGV[5])
redis.call('xtrim', KEYS[3], 'MINID', ARGV[3])
redis.call('xtrim', KEYS[4], 'MINID', ARGV[4])
return 1
"""

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


def wall_ms() -> int:
    return int(time.time() * 1000)


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class LostLease(Exception):
    """Another owner holds the lease: this one stands down."""


class _Applied(NamedTuple):
    """A step applied to the engine and not yet committed."""

    now_ms: int
    last: bytes  # the last command of the stream it took
    cfg: bytes  # the configuration it logs, or b""
    own: bytes  # the attached gateway's commands it took, packed, or b""
    out: dict[str, list[Answer]]  # its answers per gateway
    local: list[Command]  # those commands (handed to the stream if the lease is lost first)


class _Bell:
    """What a loop sleeps on (`sleep`) and others wake it with (`ring`): no task per sleep."""

    def __init__(self) -> None:
        self._rung = False
        self._sleeping: asyncio.Future[None] | None = None

    def ring(self) -> None:
        self._rung = True
        if self._sleeping is not None and not self._sleeping.done():
            self._sleeping.set_result(None)

    async def sleep(self, timeout_s: float | None) -> None:
        """Returns when rung (at once if rung since the last sleep) or after ``timeout_s``."""
        if not self._rung:
            loop = asyncio.get_running_loop()
            self._sleeping = sleeping = loop.create_future()
            timer = None if timeout_s is None else loop.call_later(timeout_s, _settle, sleeping)
            try:
                await sleeping
            finally:
                self._sleeping = None
                if timer is not None:
                    timer.cancel()
        self._rung = False


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


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
        self._commit = redis.register_script(_COMMIT)
        self._renew = redis.register_script(_RENEW)
        self._snapshot = redis.register_script(_SNAPSHOT)
        self._stretch = redis.register_script(_STRETCH)
        self.snapshot_ms_per_request = SNAPSHOT_MS_PER_REQUEST  # measured at each snapshot (`_pack_state`)
        self.snapshot_bytes = 0  # the last snapshot's size
        self._release = redis.register_script(_RELEASE)
        # The gateway of this process, when a serve process holds the role (`attach`): while this
        # owner holds the lease, its commands are taken in process and its answers handed back in
        # process once their step is committed — no stream entry, no answer list, for them.
        self._own: Client | None = None
        self._local: list[Command] = []  # its commands for the next step
        self._local_ok = False  # its stream entries have all been taken: in process from now on
        self._local_due = False  # a step for them is scheduled (`_step_local`)
        # Steps are applied as soon as their commands come and committed by a task of their own
        # (`_commit_forever`), several per script: applying never waits for Redis.
        self._unlogged: list[_Applied] = []
        self._inflight: list[_Applied] = []  # the steps of the commit on its way
        self._loud = False  # an unlogged step answers someone: commit at once
        self._unlogged_since_s = 0.0
        self._renewed_s = 0.0
        self._serving = False
        self._closing = False
        self._stepper = _Bell()
        self._committer = _Bell()
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
        owner took over. (The live loop applies and commits in tasks of their own: `_serve`.)"""
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

    # --- the live loop -------------------------------------------------------------------------

    async def run(self, *, stop: asyncio.Event | None = None) -> None:
        """Follow the steps (a standby) and bid for the lease until it is won, then dispatch until
        stopped or the lease is lost (then follow and bid again). ``stop``: set to stop cleanly
        (the lease is given back)."""
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                try:
                    if not self.owns:
                        await self.follow(block_ms=STANDBY_POLL_MS)
                        if not await self.acquire():
                            continue
                    await self._serve(stop)
                except LostLease:
                    continue
                except Exception:  # Redis out of reach, most likely: stand down, then bid again
                    log.exception("dispatcher %s failed; it stands down and bids again", self.name)
                    self.token = None  # a lease it cannot renew expires: a standby may take over
                    self._hand_back()
                    self._reset()
                    await sleep_or(stop, RETRY_S)
        finally:
            try:
                await self.resign()
            except Exception:  # Redis gone: the lease expires by itself
                log.warning("dispatcher %s could not give its lease back", self.name)

    async def _serve(self, stop: asyncio.Event) -> None:
        """Holds the role until stopped (then logs what is applied) or the lease is lost: one task
        applies steps (`_step_forever`, and `_step_local` for this process's gateway), one commits
        them (`_commit_forever`)."""
        self._serving, self._closing = True, False
        stepper = asyncio.ensure_future(self._step_forever(stop))
        committer = asyncio.ensure_future(self._commit_forever())
        if self._local:
            self._local_due = True
            asyncio.get_running_loop().call_soon(self._step_local)
        try:
            done, _ = await asyncio.wait((stepper, committer), return_when=asyncio.FIRST_COMPLETED)
            if stepper in done:
                stepper.result()  # a failure is raised here
                self._closing = True  # stopped: the committer logs what was applied, then ends
                self._committer.ring()
            await committer
        finally:
            self._serving = False
            for task in (stepper, committer):
                task.cancel()
            await asyncio.gather(stepper, committer, return_exceptions=True)

    async def _step_forever(self, stop: asyncio.Event) -> None:
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
                    reading = asyncio.ensure_future(self.commands(block_ms=limit_ms))
                    reading.add_done_callback(lambda _: self._stepper.ring())
                now_ms = self.now_ms()
                wakeup = self._next_wakeup_ms(now_ms)
                due = self._config_due or self.sched is None
                if not (due or reading.done()):
                    wait_ms = limit_ms if wakeup is None else max(1, min(limit_ms, wakeup - now_ms))
                    await self._stepper.sleep(wait_ms / 1000)
                taken: Taken = []
                if reading.done():
                    taken, reading = reading.result(), None
                now_ms = self.now_ms()
                waiting = self.sched is not None and self.sched.waiting_count > 0
                if (
                    taken
                    or self._local
                    or due
                    or (wakeup is not None and now_ms >= wakeup)
                    or (waiting and now_ms - self.step_ms >= IDLE_PUMP_MS)
                ):
                    self._apply(taken)
                    self._committer.ring()  # a quiet step starts its wait there
                if time.monotonic() - self._renewed_s >= limit_ms / 1000:
                    await self.renew()
                if time.monotonic() - self._checked_at_s >= GATEWAY_CHECK_S:
                    self._checked_at_s = time.monotonic()
                    await self.check_gateways()
        finally:
            if reading is not None:  # what it read (if anything) stays in the stream for the next owner
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)

    def _next_wakeup_ms(self, now_ms: int) -> int | None:
        """When a step is due with no command: the engine's next wakeup, or a circuit's cool-down end."""
        if self.sched is None:
            return None
        times = [t for t in (self.sched.next_wakeup_ms(now_ms=now_ms), self.routes.circuits.next_change_ms()) if t]
        return min(times) if times else None

    async def _commit_forever(self) -> None:
        """Commits the applied steps: at once when one answers someone, quiet ones after
        `QUIET_COMMIT_MS`, with a snapshot every ``snapshot_every_s``; ends once stopped and all
        is logged. The steps applied while a commit is on its way go with the next one."""
        while True:
            snapshot_in_s = self.snapshot_every_s - (time.monotonic() - self._snapshot_at_s)
            if self.sched is None:  # nothing to store yet
                snapshot_in_s = self.snapshot_every_s
            snap = snapshot_in_s <= 0
            if self._loud or snap or self._quiet_too_long or (self._closing and self._unlogged):
                await self.commit(snapshot=snap)
                continue
            if self._closing:
                return
            wait_s = snapshot_in_s
            if self._unlogged:
                wait_s = min(wait_s, QUIET_COMMIT_MS / 1000 - (time.monotonic() - self._unlogged_since_s))
            await self._committer.sleep(max(0.0, wait_s))


async def sleep_or(stop: asyncio.Event, seconds: float) -> None:
    """Sleeps ``seconds``, or less if ``stop`` is set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass

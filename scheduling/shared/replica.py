"""A copy of the shared dispatcher's engine, kept exact by replaying its steps.

Every process of the shared scheduler keeps one: gateways read positions, ETAs, depths and
counters from it (the same answer in every process: the console and the queue API show one
queue), and a standby dispatcher is one already caught up when it takes over. The owner's
steps (scheduling.shared.owner) are logged with their instant and their last command; the engine
is deterministic, so replaying them on the last snapshot gives the owner's state step for step.
A replica never decides anything: only replayed steps change it.

Keys: see scheduling.shared.owner (``cmds``, ``steps``, ``snap``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from scheduling.engine import Scheduler, apply_policy
from scheduling.engine.eta import carry_promises
from scheduling.engine.model import SchedulerConfig
from scheduling.shared.protocol import Command, Routes, Step, decode_json_list, entry_commands, unpack
from scheduling.shared.state import unpack_config, unpack_state

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger(__name__)
STEPS_PER_READ = 1000
COMMANDS_PER_READ = 5000
START = b"0-0"

Entry = tuple[bytes, dict[bytes, bytes]]  # a stream entry: its id and its fields


def entries(raw: object) -> list[Entry]:
    """Stream entries as redis-py returns them to a client made with ``decode_responses=False``:
    bytes throughout (its annotations allow str too, for clients that decode)."""
    return cast("list[Entry]", raw or [])


def stream_read(raw: object) -> list[Entry]:
    """XREAD's answer for one stream (RESP2's shape: ``[[name, entries]]``)."""
    if not raw:
        return []
    (_name, found), *_ = cast("list[tuple[bytes, list[Entry]]]", raw)
    return found


def id_key(entry_id: bytes) -> tuple[int, int]:
    """A stream id's order (``<ms>-<seq>``)."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


def _own_commands(fields: dict[bytes, bytes]) -> list[Command | None]:
    """The owner's own gateway's commands logged with a step: packed (``o``), or a JSON list (``own``,
    the format before the batches)."""
    packed = fields.get(b"o")
    if packed:
        return unpack(packed)
    legacy = fields.get(b"own")
    return decode_json_list(legacy) if legacy else []


@dataclass(frozen=True)
class Keys:
    prefix: str = "fairgate:sched"

    @property
    def cmds(self) -> str:
        return f"{self.prefix}:cmds"

    @property
    def steps(self) -> str:
        return f"{self.prefix}:steps"

    @property
    def snap(self) -> str:
        return f"{self.prefix}:snap"

    @property
    def lease(self) -> str:
        return f"{self.prefix}:lease"

    @property
    def epoch(self) -> str:
        return f"{self.prefix}:epoch"

    def out(self, gateway: str) -> str:
        return f"{self.prefix}:out:{gateway}"

    @property
    def ended(self) -> str:
        """Finished requests' records, for every gateway process (gateway.ended_shared)."""
        return f"{self.prefix}:ended"

    def gateway(self, gateway: str) -> str:
        return f"{self.prefix}:gw:{gateway}"


def engine_of(config: SchedulerConfig) -> Scheduler:
    return Scheduler(apply_policy(config, config.policy), tenants=config.tenants or (), backends=config.backends or ())


class Replica:
    """The engine as of the last step replayed (``sched`` is None before the first step with a
    configuration: nothing was ever dispatched)."""

    def __init__(self, redis: Redis, *, keys: Keys | None = None) -> None:
        self.redis = redis
        self.keys = keys or Keys()
        self.sched: Scheduler | None = None
        self.routes = Routes()
        self.logged: SchedulerConfig | None = None  # the configuration of the last step that logged one
        self.logged_version = 0  # counts the changes of ``logged``
        self.cursor = START  # the last command taken by a step
        self.last_step = START
        self.step_ms = 0  # the last step's instant
        self.loaded = False

    def _reset(self) -> None:
        self.sched, self.routes, self.logged = None, Routes(), None
        self.logged_version += 1
        self.cursor = self.last_step = START
        self.loaded = False

    async def load(self) -> None:
        """From the snapshot (if any), then every step after it."""
        snap = cast("dict[bytes, bytes]", await self.redis.hgetall(self.keys.snap) or {})
        before = self.sched
        if snap:
            self.sched, self.routes, self.logged = unpack_state(snap[b"state"])
            self.logged_version += 1
            self.last_step, self.cursor = snap[b"step"], snap[b"cmd"]
            self.step_ms = int(snap.get(b"now", b"0"))
        else:
            self._reset()
        self.loaded = True
        await self.catch_up()
        if self.sched is not None:
            carry_promises(before, self.sched)  # the ETAs this process gave (the snapshot has none)

    async def catch_up(self) -> int:
        """Replays the steps logged since the last one replayed; how many."""
        if not self.loaded:
            await self.load()
            return 0
        done = 0
        while True:
            found = entries(await self.redis.xrange(self.keys.steps, min=b"(" + self.last_step, count=STEPS_PER_READ))
            if not found:
                return done
            if not await self._continues(found):
                log.warning("replica fell behind the trimmed step log: reloading from the snapshot")
                await self.load()
                return done
            await self._replay_all(found)
            done += len(found)
            await self.replayed_some()

    async def replayed_some(self) -> None:
        """Called between the batches of a long catch-up (the owner renews its lease there)."""

    def _follows(self, found: list[Entry]) -> bool | None:
        """Whether ``found`` (steps read after ours) starts right after our last step: each step
        names the one before it (``prev``); None for a step logged before steps did."""
        prev = found[0][1].get(b"prev")
        return None if prev is None else prev == self.last_step

    async def _continues(self, found: list[Entry]) -> bool:
        """Whether the steps after ours were all still in the log when read. Without ``prev``: a
        snapshot newer than our last step trimmed those before it (read after the steps: the
        snapshot and its trim are one script, so a trim that cut what was read shows here)."""
        follows = self._follows(found)
        if follows is not None:
            return follows
        snap_step = await self.redis.hget(self.keys.snap, "step")
        return snap_step is None or id_key(cast("bytes", snap_step)) <= id_key(self.last_step)

    async def follow(self, *, block_ms: int) -> int:
        """Waits up to ``block_ms`` for a new step, then replays what has come: the steps the read
        brought, with one more round trip for their commands and the continuity check together
        (a standby follows every step of the owner)."""
        if not self.loaded:
            await self.load()
        found = stream_read(
            await self.redis.xread({self.keys.steps: self.last_step}, count=STEPS_PER_READ, block=block_ms)
        )
        if not found:
            return 0
        if len(found) == STEPS_PER_READ:  # far behind: the long way, page by page
            return await self.catch_up()
        follows = self._follows(found)
        pipe = self.redis.pipeline(transaction=False)
        if follows is None:
            pipe.hget(self.keys.snap, "step")
        last = found[-1][1][b"last"]
        if last != self.cursor:
            pipe.xrange(self.keys.cmds, min=b"(" + self.cursor, max=last, count=COMMANDS_PER_READ)
        read = await pipe.execute() if len(pipe) else []
        if follows is None:
            snap_step = read.pop(0)
            follows = snap_step is None or id_key(cast("bytes", snap_step)) <= id_key(self.last_step)
        if not follows:
            log.warning("replica fell behind the trimmed step log: reloading from the snapshot")
            await self.load()
            return 0
        await self._replay_all(found, first=entries(read[0]) if read else None)
        return len(found)

    async def _replay_all(self, steps: list[Entry], *, first: list[Entry] | None = None) -> None:
        """Replays ``steps``, reading their commands from the stream (``first``: the first page, read already)."""
        last = steps[-1][1][b"last"]
        commands: list[tuple[tuple[int, int], Command | None]] = []
        if last != self.cursor:
            start = b"(" + self.cursor
            while True:
                if first is not None:
                    found, first = first, None
                else:
                    found = entries(
                        await self.redis.xrange(self.keys.cmds, min=start, max=last, count=COMMANDS_PER_READ)
                    )
                for entry_id, fields in found:
                    at_key = id_key(entry_id)
                    commands.extend((at_key, command) for command in entry_commands(fields))
                if len(found) < COMMANDS_PER_READ:
                    break
                start = b"(" + found[-1][0]
        at = 0
        for step_id, fields in steps:
            upto = id_key(fields[b"last"])
            mine = []
            while at < len(commands) and commands[at][0] <= upto:
                mine.append(commands[at][1])
                at += 1
            mine.extend(_own_commands(fields))  # the owner's own gateway's, taken in process after the stream's
            self.replay(int(fields[b"now"]), mine, fields.get(b"cfg"))
            self.cursor, self.last_step = fields[b"last"], step_id

    def replay(self, now_ms: int, commands: list[Command | None], cfg: bytes | None) -> Step:
        """One step, as the owner made it: its configuration, its commands, the pump."""
        if cfg:
            self.logged = unpack_config(cfg)
            self.logged_version += 1
            self.configure_engine(self.logged, now_ms)
        step = Step(self.engine(), self.routes, now_ms, self.logged.backends or () if self.logged else ())
        step.apply(commands)
        step.pump()
        self.step_ms = now_ms
        return step

    def configure_engine(self, config: SchedulerConfig, now_ms: int) -> None:
        backends = self.routes.circuits.effective(config.backends or (), now_ms)  # open circuits stay open
        if self.sched is None:
            self.sched = engine_of(config)
            self.sched.reconfigure(now_ms=now_ms, backends=backends)
        else:
            self.sched.reconfigure(
                now_ms=now_ms,
                config=apply_policy(config, config.policy),
                tenants=config.tenants or (),
                backends=backends,
            )

    def engine(self) -> Scheduler:
        if self.sched is None:
            raise RuntimeError("no configuration logged before the first step")
        return self.sched

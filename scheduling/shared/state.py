"""The shared dispatcher's snapshot and configuration message, as versioned msgpack records.

A snapshot holds the engine (`scheduling.engine.snapshot`), the routes of its requests and the
configuration of the last step that logged one; a configuration message (a step's ``cfg``) holds a
`SchedulerConfig`. Both are plain data with a ``version``: this version reads only its own and
refuses any other (an older dispatcher's pickle included) with `SnapshotVersionError`, whose
message says the way up: drain, then start (docs/operating.md).
"""

from __future__ import annotations

from typing import Any

import msgpack

from scheduling.engine import Scheduler, SchedulerConfig
from scheduling.engine.config_record import config_from_record, config_to_record
from scheduling.engine.snapshot import SNAPSHOT_VERSION, SnapshotVersionError, check_version, from_record, to_record
from scheduling.shared.protocol import Routes

State = tuple[Scheduler | None, Routes, SchedulerConfig | None]


def _unpack(raw: bytes, what: str) -> dict[str, Any]:
    try:
        record = msgpack.unpackb(raw)
    except (ValueError, TypeError, msgpack.UnpackException) as bad:  # ExtraData and FormatError are ValueErrors
        raise SnapshotVersionError(
            f"{what} is not a versioned record (one written before version {SNAPSHOT_VERSION}?): "
            "drain the shared scheduler, then start (docs/operating.md)"
        ) from bad
    return check_version(record, what)


def pack_state(sched: Scheduler | None, routes: Routes, logged: SchedulerConfig | None) -> bytes:
    record = {
        "version": SNAPSHOT_VERSION,
        "engine": None if sched is None else to_record(sched),
        "routes": routes.as_record(),
        "config": None if logged is None else config_to_record(logged),
    }
    return msgpack.packb(record)  # type: ignore[no-any-return]


def unpack_state(raw: bytes) -> State:
    record = _unpack(raw, "shared scheduler snapshot")
    engine, config = record["engine"], record["config"]
    return (
        None if engine is None else from_record(engine),
        Routes.from_record(record["routes"]),
        None if config is None else config_from_record(config),
    )


def pack_config(config: SchedulerConfig) -> bytes:
    return msgpack.packb({"version": SNAPSHOT_VERSION, "config": config_to_record(config)})  # type: ignore[no-any-return]


def unpack_config(raw: bytes) -> SchedulerConfig:
    return config_from_record(_unpack(raw, "configuration message")["config"])

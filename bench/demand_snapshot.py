"""The demand profile's cost (issue 48): in the shared dispatcher's snapshot and in its database row.

    python -m bench.demand_snapshot [--rounds 7] [--waiting 0,2000] [--days 1]

An engine with 20 tenants x 4 classes (bench.shared_dispatcher's, predicted admission as shipped)
learns ``--days`` days and a bucket of arrivals (every (class, tenant) 1-5 per 5-minute bucket, a
pattern that shifts from day to day, fed to the profile directly), then ``--waiting`` requests are
queued. Measured per size, the median of ``--rounds``: the snapshot packed
(scheduling.shared.state.pack_state, as the owner packs it) with the profile and with it left out,
its bytes and time, and the profile's record packed alone; the database row
(gateway.demand_store): the copy on the event loop (``turned`` and ``as_record``) and its JSON
encoding (in the store's thread).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from decimal import Decimal
from statistics import median

import msgpack

from bench.shared_dispatcher import CLASSES, TENANTS
from scheduling.engine import Scheduler
from scheduling.engine.forecast import DAY_MS
from scheduling.engine.model import BackendSpec, ClassSpec, Request, SchedulerConfig
from scheduling.shared.protocol import Routes
from scheduling.shared.state import pack_state

HOUR_MS = 3_600_000
SLA_MS = {"INTERACTIVE": 30_000, "NEAR_RT": 300_000, "BATCH": 1_800_000, "RETRY": 3_600_000}


def demand_config() -> SchedulerConfig:
    return SchedulerConfig(
        classes=tuple(ClassSpec(name, level, SLA_MS[name], Decimal("1")) for level, name in enumerate(CLASSES)),
        tenants=TENANTS,
        backends=(BackendSpec(name="gpu", models=("m",), slots=48),),
    )


def learned_engine(waiting: int, days: int) -> tuple[Scheduler, SchedulerConfig]:
    config = demand_config()
    sched = Scheduler(config, tenants=TENANTS, backends=config.backends or ())
    demand = sched.demand
    assert demand is not None
    bucket_ms = demand.bucket_ms
    buckets = days * (DAY_MS // bucket_ms) + 2
    for bucket in range(buckets):
        for k, cls in enumerate(CLASSES):
            for j, tenant in enumerate(TENANTS):
                for i in range(1 + (bucket * 7 // 3 + j + k) % 5):
                    demand.observe(cls, tenant.slug, bucket * bucket_ms + i)
    now_ms = buckets * bucket_ms
    for n in range(waiting):
        tenant, cls = TENANTS[n % len(TENANTS)].slug, CLASSES[2 + n % 2]
        sched.submit(Request(f"{tenant}/r{n}", tenant, cls, "m", 100, 100, now_ms), now_ms=now_ms)
    return sched, config


def _timed(fn, rounds: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    """The median ms of ``rounds`` calls, the collector paused as the owner pauses it to pack."""
    times, result = [], None
    for _ in range(rounds):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            result = fn()
            times.append(1000 * (time.perf_counter() - started))
        finally:
            gc.enable()
    return median(times), result


def measure(waiting: int, rounds: int, days: int) -> dict[str, float]:
    sched, config = learned_engine(waiting, days)
    demand = sched.demand
    assert demand is not None
    with_ms, packed = _timed(lambda: pack_state(sched, Routes(), config), rounds)
    sched.demand = None
    without_ms, bare = _timed(lambda: pack_state(sched, Routes(), config), rounds)
    sched.demand = demand
    alone_ms, alone = _timed(lambda: msgpack.packb(demand.as_record()), rounds)
    copy_ms, record = _timed(lambda: demand.turned(0).as_record(), rounds)
    encode_ms, encoded = _timed(lambda: json.dumps(record), rounds)
    return {
        "keys": len(demand.profiles),
        "waiting": waiting,
        "with_bytes": len(packed),  # type: ignore[arg-type]
        "without_bytes": len(bare),  # type: ignore[arg-type]
        "with_ms": with_ms,
        "without_ms": without_ms,
        "alone_bytes": len(alone),  # type: ignore[arg-type]
        "alone_ms": alone_ms,
        "copy_ms": copy_ms,
        "json_bytes": len(encoded),  # type: ignore[arg-type]
        "json_ms": encode_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--waiting", default="0,2000")
    parser.add_argument("--days", type=int, default=1)
    args = parser.parse_args()
    for waiting in (int(n) for n in args.waiting.split(",")):
        r = measure(waiting, args.rounds, args.days)
        print(
            f"{r['keys']} keys, {r['waiting']} waiting: snapshot {r['with_bytes']:,} bytes with the profile, "
            f"{r['without_bytes']:,} without (+{r['with_bytes'] - r['without_bytes']:,}); packed in "
            f"{r['with_ms']:.2f} ms against {r['without_ms']:.2f} ms; the profile alone {r['alone_bytes']:,} bytes "
            f"packed in {r['alone_ms']:.2f} ms; "
            f"the row: copy {r['copy_ms']:.2f} ms on the loop, JSON {r['json_bytes']:,} bytes in {r['json_ms']:.2f} ms"
        )


if __name__ == "__main__":
    main()

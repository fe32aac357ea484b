"""What the billing worker and its PostgreSQL backend spend per request, booking as at saturation.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fairgate python bench/billing_worker_cost.py [--asks 60]

Batches of ``--asks`` holds plus the settlements of the previous batch's holds (their holds in
the worker's memo, as in a gateway's billing worker), each pickled both ways and booked by
billing.worker_loop.book_batch, on a throwaway test database (created and dropped here), after a
warm-up and an ANALYZE. Prints, per request (a hold and its settlement), this process's CPU (the
worker's side), the CPU of its database backend (/proc/<pid>/stat, so the server must run on this
machine) and the wall time; CPU times hold up better than wall times on a shared machine. One JSON
line: the medians over ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run(asks_per_batch: int, batches: int, tag: str) -> tuple[float, float, float]:
    from django.db import connection

    from billing.booking_asks import HoldAsk, SettleAsk
    from billing.worker_loop import book_batch

    def hold(rid: str) -> HoldAsk:
        return HoldAsk(
            request_id=rid,
            tenant_slug="bench",
            class_name="INTERACTIVE",
            model="m",
            prompt_tokens=120,
            max_output_tokens=16,
            at=datetime.now(UTC),
            owner="bench:1:worker",
            key_prefix="fg_bench",
            key_creator="bench",
        )

    def settle(rid: str) -> SettleAsk:
        return SettleAsk(
            request_id=rid,
            backend_name="gpu-b",
            prompt_tokens=12,
            completion_tokens=16,
            at=datetime.now(UTC),
            base_cost=Decimal("0.000044"),
        )

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    previous: list[str] = []
    cpu_s, backend_s, wall_s = time.process_time(), _backend_cpu_s(pid), time.perf_counter()
    for batch in range(batches):
        ids = [f"bench/{tag}-{batch}-{i}" for i in range(asks_per_batch)]
        asks = [hold(rid) for rid in ids] + [settle(rid) for rid in previous]
        sent = pickle.loads(pickle.dumps(asks, pickle.HIGHEST_PROTOCOL))
        pickle.loads(pickle.dumps(book_batch(sent), pickle.HIGHEST_PROTOCOL))
        previous = ids
    requests = batches * asks_per_batch
    return (
        (time.process_time() - cpu_s) / requests * 1e6,
        (_backend_cpu_s(pid) - backend_s) / requests * 1e6,
        (time.perf_counter() - wall_s) / requests * 1e6,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asks", type=int, default=60, help="holds per batch (and as many settlements)")
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.db import connection

    import events
    from bench.billing_cost import _world
    from console.live.hooks import SUBSCRIBER

    if connection.vendor != "postgresql":
        raise SystemExit("DATABASE_URL must point at PostgreSQL")
    connection.settings_dict["TEST"]["NAME"] = "test_fairgate_bench_billing_worker"
    connection.settings_dict["CONN_MAX_AGE"] = None  # one backend throughout: its CPU is read by pid
    test_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    events.unsubscribe(SUBSCRIBER)
    events.relay()  # as in the worker: committed events ride on its answers
    try:
        _world()
        _run(args.asks, 30, "warm")
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        runs = [_run(args.asks, args.batches, f"r{n}") for n in range(args.rounds)]
    finally:
        connection.creation.destroy_test_db(test_name, verbosity=0)
    for worker_us, backend_us, wall_us in runs:
        print(f"per request: worker {worker_us:.0f} us, its backend {backend_us:.0f} us, wall {wall_us:.0f} us")
    print(
        json.dumps(
            {
                "asks_per_batch": args.asks * 2,
                "worker_us": round(statistics.median(r[0] for r in runs)),
                "backend_us": round(statistics.median(r[1] for r in runs)),
                "wall_us": round(statistics.median(r[2] for r in runs)),
                "load_avg": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()

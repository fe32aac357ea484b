"""Booking throughput on a freshly migrated PostgreSQL database, round by round: billing.booking.book
as the billing worker calls it (batches of holds, then their settlements), with the booking's plans
as they are now ("custom") and as they were (plans cached by the server: "cached", the
``plan_cache_mode`` of the booking transaction set back to auto). Each mode books into its own
scratch database, in its own process; the two take turns round by round, so load on the machine
hits both alike. Autovacuum may or may not analyze the tables meanwhile: each round says.

    python -m bench.billing_fresh_db [--rounds 5] [--requests 4000] [--batch 16]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time

SERVER = "postgres://postgres@127.0.0.1:5432"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as conn:
        conn.execute(sql)


def _child(mode: str, args, go, done, results) -> None:
    name = f"fg_bench_fresh_{os.getpid()}_{mode}"
    _admin(f'CREATE DATABASE "{name}"')
    try:
        env = {"DATABASE_URL": f"{SERVER}/{name}", "SECRET_KEY": "bench-scratch-only", "REDIS_URL": ""}
        os.environ.update(env, DJANGO_SETTINGS_MODULE="config.settings")
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], check=True, cwd=ROOT, env=os.environ)
        sys.path.insert(0, ROOT)
        import django

        django.setup()
        from django.db import connection
        from django.utils import timezone

        from billing import statements
        from billing.booking import book
        from billing.booking_asks import HoldAsk, SettleAsk
        from tests.integration.billing.conftest import make_world

        if mode == "cached":
            statements.CUSTOM_PLANS_SQL = "SET LOCAL plan_cache_mode = auto"
        make_world()
        booked = 0
        for _ in range(args.rounds):
            go.wait()
            go.clear()
            started = time.perf_counter()
            for _ in range(args.requests // args.batch):
                now = timezone.now()
                ids = [f"q{i}" for i in range(booked, booked + args.batch)]
                booked += args.batch
                tenants = ("alpha", "beta", "gamma")
                holds = [
                    HoldAsk(
                        request_id=rid,
                        tenant_slug=tenants[i % 3],
                        class_name="BATCH",
                        model="m",
                        prompt_tokens=10,
                        max_output_tokens=10,
                        at=now,
                    )
                    for i, rid in enumerate(ids)
                ]
                book(holds)
                book([SettleAsk(rid, "gpu-b", 10, 5, now) for rid in ids])
            rate = args.requests / (time.perf_counter() - started)
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT last_autoanalyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = %s",
                    [statements.LEDGER],
                )
                analyzed = cursor.fetchone()[0]
            results.put((mode, rate, analyzed))
            done.set()
        connection.close()
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=4000, help="requests booked per round")
    parser.add_argument("--batch", type=int, default=16, help="asks per booking")
    args = parser.parse_args()
    results: mp.Queue = mp.Queue()
    modes = ("cached", "custom")
    gates = {m: (mp.Event(), mp.Event()) for m in modes}
    children = [mp.Process(target=_child, args=(m, args, *gates[m], results)) for m in modes]
    for child in children:
        child.start()
    print("| round | requests booked before | cached plans (before) req/s | custom plans (now) req/s | now / before |")
    print("|---|---|---|---|---|")
    for index in range(args.rounds):
        row = {}
        for mode in modes if index % 2 == 0 else modes[::-1]:
            go, done = gates[mode]
            go.set()
            done.wait()
            done.clear()
            got, rate, analyzed = results.get()
            row[got] = (rate, analyzed)
        (before, a1), (after, a2) = row["cached"], row["custom"]
        note = " (autovacuum analyzed: " + ", ".join(f"{m} {'yes' if a else 'no'}" for m, (_, a) in row.items()) + ")"
        print(
            f"| {index + 1} | {index * args.requests} | {before:.0f} | {after:.0f} | {after / before:.2f}x |"
            + (note if a1 or a2 else "")
        )
    for child in children:
        child.join()


if __name__ == "__main__":
    main()

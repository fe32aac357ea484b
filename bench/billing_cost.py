"""What billing costs per request: one budget_hold + one charge_settle, in microseconds, booked
alone (each its own transaction, as an idle gateway books them) and in batches (as a busy
gateway's group commit books them: `--batch` holds in one transaction, then their settlements).

    .venv/bin/python bench/billing_cost.py                 # the database of the environment
    .venv/bin/python bench/billing_cost.py --all           # SQLite file and PostgreSQL, side by side
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fairgate .venv/bin/python bench/billing_cost.py

Billing alone (the console's live feed is disconnected). Runs on a throwaway test database (created
and dropped here), single thread, sequential pairs, after a warm-up. Also counts the queries of each
call and times one trivial ORM read as a yardstick (these machines are noisy: compare
`pair_in_orm_reads` across runs). One JSON line per database.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_URL = "postgres://postgres@127.0.0.1:5432/fairgate"


def _setup_django() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def _world() -> None:
    from datetime import datetime

    from billing.price_versions import price_set
    from scheduling.models import Backend, PriorityClass
    from tenants.models import Tenant

    since = datetime(2020, 1, 1, tzinfo=UTC)
    for name, level, factor in (("INTERACTIVE", 0, "1.6"), ("BATCH", 2, "0.7")):
        row = PriorityClass.objects.create(name=name, level=level, sla_ms=3000)
        price_set(priority_class=row, price_factor=Decimal(factor), actor="bench", effective_at=since)
    for name, price in (("gpu-a", "0.002"), ("gpu-b", "0.001")):
        Backend.objects.create(
            name=name,
            model_names=["m"],
            slots=8,
            input_price_per_1k=Decimal(price),
            output_price_per_1k=Decimal(price) * 2,
        )
    Tenant.objects.create(slug="bench", name="Bench", quota_share=Decimal("0.5"), annual_budget=Decimal("1000000"))


def _pair(n: int) -> tuple[float, float]:
    from billing.services import budget_hold, charge_settle

    t0 = time.perf_counter()
    budget_hold(
        tenant_slug="bench",
        request_id=f"b{n}",
        class_name="INTERACTIVE",
        model="m",
        prompt_tokens=800,
        max_output_tokens=512,
    )
    t1 = time.perf_counter()
    charge_settle(request_id=f"b{n}", backend_name="gpu-b", prompt_tokens=800, completion_tokens=300)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e6, (t2 - t1) * 1e6


def _batched(rounds: int, size: int) -> float:
    """Microseconds per request (hold + settle) booked `size` at a time."""
    from django.utils import timezone

    from billing.booking import book
    from billing.booking_asks import HoldAsk, SettleAsk

    t0 = time.perf_counter()
    for r in range(rounds):
        now = timezone.now()
        ids = [f"batch{r}-{i}" for i in range(size)]
        book(
            [
                HoldAsk(
                    request_id=rid,
                    tenant_slug="bench",
                    class_name="INTERACTIVE",
                    model="m",
                    prompt_tokens=800,
                    max_output_tokens=512,
                    at=now,
                )
                for rid in ids
            ]
        )
        book(
            [
                SettleAsk(request_id=rid, backend_name="gpu-b", prompt_tokens=800, completion_tokens=300, at=now)
                for rid in ids
            ]
        )
    return (time.perf_counter() - t0) / (rounds * size) * 1e6


def _queries() -> dict[str, int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from billing.services import budget_hold, charge_settle

    with CaptureQueriesContext(connection) as hold_q:
        budget_hold(
            tenant_slug="bench",
            request_id="q",
            class_name="INTERACTIVE",
            model="m",
            prompt_tokens=800,
            max_output_tokens=512,
        )
    with CaptureQueriesContext(connection) as settle_q:
        charge_settle(request_id="q", backend_name="gpu-b", prompt_tokens=800, completion_tokens=300)
    return {"hold": len(hold_q.captured_queries), "settle": len(settle_q.captured_queries)}


def _reference_query_us(rounds: int) -> float:
    """One trivial ORM read on the same machine and database: the yardstick for the figures above."""
    from tenants.models import Tenant

    t0 = time.perf_counter()
    for _ in range(rounds):
        Tenant.objects.filter(slug="bench").first()
    return (time.perf_counter() - t0) / rounds * 1e6


def measure(pairs: int, warmup: int, batch: int) -> dict:
    _setup_django()
    from django.db import connection

    if connection.vendor == "sqlite":  # a file with the project's WAL settings, not an in-memory database
        connection.settings_dict["TEST"]["NAME"] = str(Path(tempfile.mkdtemp()) / "bench_billing.sqlite3")
    else:
        connection.settings_dict["TEST"]["NAME"] = "test_fairgate_bench_billing"
    test_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    import events
    from console.live.hooks import SUBSCRIBER

    # Billing's own cost: without a running console publisher, the live feed would send every
    # charge to the channel layer from here, which the serving process never does.
    events.unsubscribe(SUBSCRIBER)
    try:
        _world()
        for n in range(warmup):
            _pair(-1 - n)
        samples = [_pair(n) for n in range(pairs)]
        queries = _queries()
        batched_us = _batched(max(1, pairs // batch), batch)
        reference_us = _reference_query_us(pairs)
    finally:
        connection.creation.destroy_test_db(test_name, verbosity=0)
    holds, settles = [s[0] for s in samples], [s[1] for s in samples]
    pair_us = [h + s for h, s in samples]
    return {
        "database": connection.vendor,
        "pairs": pairs,
        "pair_us_median": round(statistics.median(pair_us)),
        "pair_us_mean": round(statistics.fmean(pair_us)),
        "pair_us_p95": round(statistics.quantiles(pair_us, n=20)[18]),
        "hold_us_median": round(statistics.median(holds)),
        "settle_us_median": round(statistics.median(settles)),
        "queries": queries,
        "batch": batch,
        "batched_pair_us": round(batched_us),
        "one_orm_read_us": round(reference_us),
        "pair_in_orm_reads": round(statistics.median(pair_us) / reference_us, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32, help="asks per transaction in the batched run")
    parser.add_argument("--all", action="store_true", help="run on SQLite and on PostgreSQL (--postgres-url)")
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    args = parser.parse_args()
    if not args.all:
        print(json.dumps(measure(args.pairs, args.warmup, args.batch)))
        return
    for url in ("", args.postgres_url):
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        if url:
            env["DATABASE_URL"] = url
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--pairs",
                str(args.pairs),
                "--warmup",
                str(args.warmup),
                "--batch",
                str(args.batch),
            ],
            env=env,
            check=True,
        )


if __name__ == "__main__":
    main()

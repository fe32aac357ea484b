"""The live benchmarks: the surge replay (`manage.py surge`, bench.surge_compare) and the gateway
overhead benchmark, at tiny sizes. They check that the runs complete and report numbers, never
how fast anything was. Pure helpers (percentiles, parsing, report sections) are tested offline."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from bench import gateway_overhead, rawhttp
from bench import gateway_overhead_postgres as overhead_pg
from bench import gateway_overhead_postgres_report as overhead_pg_report
from bench.launch import REPO_ROOT, start_gateway, start_sim
from bench.report_gateway import section_write
from bench.surge import SurgePlan
from bench.surge.probe import parse
from bench.surge.report import COLUMNS, p95_of
from bench.surge.traffic import GAVE_UP, OK, Outcome
from bench.surge_compare import BATCH_TENANT, gateway_yaml, tenant_keys

# --- offline -------------------------------------------------------------------------------


def test_plan_scales_rates_slots_and_slas_together():
    plan = SurgePlan(batch_count=3_100, time_scale=60)
    assert plan.scale == pytest.approx(0.25)
    assert plan.backend_options()["slots"] == 12
    assert plan.sla_ms(3000) == 50 and plan.sla_ms(14_400_000) == 240_000
    assert plan.interactive_per_real_s == pytest.approx(2.82 * 0.25 * 60)
    assert plan.clock(0) == "08:55" and plan.clock(plan.since_start("10:00")) == "10:00"


def test_p95_marks_a_user_who_gave_up_as_a_lower_bound():
    answered = [Outcome("chat", 0, OK, ttft_sim_s=1.0) for _ in range(18)]
    gave_up = [Outcome("chat", 0, GAVE_UP, ttft_sim_s=30.0) for _ in range(2)]
    assert p95_of(answered).text() == "1.00s"
    assert p95_of(answered + gave_up).text() == ">30.00s"
    assert p95_of([Outcome("chat", 0, "error", code="queue_timeout")]).text() == "–"


def test_metrics_are_read_from_the_exposition():
    text = "\n".join(
        [
            "# TYPE fairgate_queue_depth gauge",
            'fairgate_queue_depth{cls="BATCH"} 7.0',
            'fairgate_queue_depth{cls="INTERACTIVE"} 2.0',
            "# TYPE fairgate_aging_preempts counter",
            'fairgate_aging_preempts_total{cls="INTERACTIVE"} 3.0',
            'fairgate_aging_preempts_total{cls="BATCH"} 1.0',
            "",
        ]
    )
    view = parse(text)
    assert (view.batch_waiting, view.waiting, view.aging_preempts) == (7, 9, 4)


def test_chunked_body_is_read_piece_by_piece():
    async def read() -> list[bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        reader.feed_eof()
        head = await rawhttp.read_head(reader)
        return [piece async for piece in rawhttp.iter_body(reader, head)]

    assert asyncio.run(read()) == [b"abc", b"de"]


def test_report_sections_are_replaced_not_duplicated(tmp_path: Path):
    path = tmp_path / "REPORT-gateway.md"
    section_write("surge", "## Surge\nfirst", path)
    section_write("overhead", "## Overhead\nnumbers", path)
    section_write("surge", "## Surge\nsecond", path)
    text = path.read_text()
    assert text.count("## Surge") == 1 and "second" in text and "first" not in text
    assert text.index("## Overhead") < text.index("## Surge")


def test_overhead_postgres_batch_quantiles_come_from_the_histogram_buckets():
    usage = overhead_pg.Usage(
        seconds=1.0,
        gateway_busy=0.5,
        worker_busy=0.2,
        database_busy=0.1,
        machine_busy=1.0,
        commits_per_s=10.0,
        batches_per_s=10.0,
        asks_per_batch=2.0,
        batch_ms=3.0,
        batch_ms_buckets={1.0: 5, 5.0: 4, 50.0: 1, float("inf"): 0},
    )
    assert usage.batch_quantile_ms(0.5) == 1.0 and usage.batch_quantile_ms(0.9) == 5.0
    assert usage.batch_quantile_ms(0.99) == 50.0
    assert overhead_pg_report._waits(usage, "settlement") == "0"
    waited = dataclasses.replace(usage, settlement_waits=4, settlement_wait_ms=2.5)
    assert (
        overhead_pg_report._waits(waited, "settlement") == "4 (2.5 ms)"
        and overhead_pg_report._waits(None, "hold") == "–"
    )
    waits = {"billing worker": {"idle": 3, "active, running": 1}, "gateway": {"idle": 4}}
    assert overhead_pg_report.wait_shares(waits) == {"idle": 0.75, "active, running": 0.25}


# --- live ----------------------------------------------------------------------------------


@pytest.mark.live
def test_surge_replay_replays_a_tiny_surge_and_prints_the_timeline(tmp_path: Path):
    plan = SurgePlan(batch_count=50, time_scale=120, load_scale=0.1, max_sim_s=3 * 3600)
    sim = start_sim(tmp_path, **plan.backend_options())
    gateway = start_gateway(
        tmp_path / "gw",
        gateway_yaml(plan, "fairgate", sim.url, plan.backend_options()["slots"]),
        tenant_keys(),
        FAIRGATE_BILLING="0",
    )
    try:
        keys = dict(gateway.keys)
        batch_key = keys.pop(BATCH_TENANT)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.surge",
                "--gateway",
                gateway.url,
                "--batch-key",
                batch_key,
                "--interactive-keys",
                ",".join(keys.values()),
                "--batch-count",
                "50",
                "--time-scale",
                "120",
                "--load-scale",
                "0.1",
                "--max-minutes",
                "180",
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        gateway.stop()
        sim.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    header = done.stdout.splitlines()[0]
    assert all(column in header for column in COLUMNS)
    assert "[surge 09:00]" in done.stderr  # progress on stderr
    answered = [line for line in done.stdout.splitlines() if line.startswith("batch completed:")]
    assert answered and "of 50 (100.0%)" in answered[0], done.stdout


@pytest.mark.live
def test_overhead_benchmark_produces_its_tables(tmp_path: Path):
    stack = gateway_overhead.stack_start(tmp_path)
    args = Namespace(phase_s=1.0, step_s=1.0, latency_rates=(20,), rates=(20,), rounds=1, connections=(4, 8))
    try:
        found = asyncio.run(gateway_overhead.measure(stack, args))
    finally:
        stack.stop()
    direct, billing_on, billing_off = found["latency"][0]
    for phase in (direct, billing_on, billing_off):
        assert phase.ok_share > 0 and phase.p50_ms is not None and phase.p99_ms is not None
    assert billing_on.gateway_cpu_ms_per_request is not None
    for runs in found["saturation"].values():
        assert [r.connections for r in runs] == [4, 8]
        assert all(r.ok_per_s > 0 and 0 < r.busy < 2 for r in runs)
    text = gateway_overhead.render(found)
    assert "### Added latency" in text and "### Billing on vs off" in text and "| 20/s |" in text
    assert "| 4 |" in text and "| 8 |" in text and "the peak over the concurrencies" in text


@pytest.mark.live
@pytest.mark.postgres
def test_overhead_benchmark_on_postgres_uses_scratch_databases_and_reports_the_billing_worker(tmp_path: Path):
    import os

    import psycopg
    from django.conf import settings

    server = os.environ["DATABASE_URL"].rsplit("/", 1)[0]
    stack = gateway_overhead.stack_start(tmp_path, "postgres", server)
    args = Namespace(phase_s=1.0, step_s=1.0, latency_rates=(20,), rates=(), rounds=1, connections=(4,))
    try:
        found = asyncio.run(gateway_overhead.measure(stack, args))
    finally:
        stack.stop()
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", [list(stack.dbnames.values())]
        ).fetchall()
    assert left == []  # created and dropped by the run
    direct, on, off = (found["pg_latency"][0][name] for name in ("direct", "billing on", "billing off"))
    assert direct.ok_share > 0 and on.ok_share > 0 and off.ok_share > 0
    run = found["saturation"]["billing on"][0]
    assert run.ok_per_s > 0 and run.usage.batches_per_s > 0 and run.usage.asks_per_batch >= 1
    assert run.usage.database_busy is not None and run.waits.get("samples")
    assert found["saturation"]["billing off"][0].usage.batches_per_s == 0
    text = gateway_overhead.render(found)
    assert "### Added latency at 20 requests/s" in text and "### Billing on vs off" in text
    assert "machine stalls direct / on / off" in text and stack.canary._process.poll() is not None  # stopped
    assert "the peak over the concurrencies" in text and "Where the billing worker's connection was" in text
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    nicer = min(mine + settings.FAIRGATE_BILLING_WORKER_NICE, 19) - mine  # as configured (the default, here)
    assert found["worker_nice"] == nicer  # read off the running worker
    assert f"The billing worker runs {nicer} nicer than its gateway" in text
    assert found["journal_wait"] == settings.FAIRGATE_JOURNAL_WAIT
    assert f"(`FAIRGATE_JOURNAL_WAIT={settings.FAIRGATE_JOURNAL_WAIT}`)" in text

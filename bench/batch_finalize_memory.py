"""What finalizing one large batch costs the finalizing process in memory: a batch of ``--lines``
ended lines, each with an answer of ``--answer-bytes`` (one in 100 failed), is finalized by
``batches.tasks.finalize`` (its output and error files written) in a fresh child process; the
child reports its peak RSS growth over the finalize (Linux: VmHWM reset through clear_refs).

    .venv/bin/python -m bench.batch_finalize_memory                     # 50,000 lines, 4 KB answers
    .venv/bin/python -m bench.batch_finalize_memory --lines 2000 --answer-bytes 1024

Runs on PostgreSQL (``--postgres-url``) in a throwaway test database (created and dropped here),
with the files written to a temporary directory. One JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_URL = "postgres://postgres@127.0.0.1:5432/fairgate"
TEST_DB = f"test_fairgate_bench_finalize_{os.getpid()}"
FILL_ROWS = 1000


def _setup_django() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def ended_batch(*, tenant, lines: int, text: str, failed_every: int):
    """A batch of ``lines`` ended lines answering ``text`` (every ``failed_every``-th failed), in
    progress: ready to finalize. Also the finalizing tests' batch."""
    from datetime import timedelta

    from django.utils import timezone

    from batches.models import Batch, BatchLine
    from batches.service import batch_id_new

    now = timezone.now()
    batch = Batch.objects.create(
        id=batch_id_new(),
        tenant=tenant,
        key_prefix="k",
        endpoint="/v1/chat/completions",
        priority_class="BATCH",
        created_at=now,
        expires_at=now + timedelta(hours=24),
    )
    answer = {"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
    failed = {"code": "upstream_error", "message": "The backend answered 500."}
    for start in range(1, lines + 1, FILL_ROWS):
        BatchLine.objects.bulk_create(
            BatchLine(
                batch=batch,
                number=n,
                custom_id=f"c{n}",
                state=BatchLine.State.FAILED if n % failed_every == 0 else BatchLine.State.COMPLETED,
                status_code=500 if n % failed_every == 0 else 200,
                response=answer,
                error=failed if n % failed_every == 0 else None,
                ended_at=now,
            )
            for n in range(start, min(start + FILL_ROWS, lines + 1))
        )
    return batch


def _fill(lines: int, answer_bytes: int) -> str:
    from tenants.models import Tenant

    tenant = Tenant.objects.create(slug="bench", name="Bench", quota_share=0.5)
    text = ("lorem ipsum " * (answer_bytes // 12 + 1))[:answer_bytes]
    return ended_batch(tenant=tenant, lines=lines, text=text, failed_every=100).id


def _status_kb(field: str) -> int:
    for row in Path("/proc/self/status").read_text().splitlines():
        if row.startswith(field + ":"):
            return int(row.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(batch_id: str, db_name: str) -> dict:
    """Finalizes the batch here and says this process's peak RSS growth over it."""
    _setup_django()
    from django.db import connection

    from batches import tasks
    from batches.files import files_storage
    from batches.models import Batch

    connection.settings_dict["NAME"] = db_name
    Batch.objects.filter(pk=batch_id).exists()  # connected, models loaded
    files_storage()
    rss_kb = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    started = time.perf_counter()
    done = tasks.finalize(batch_id)
    seconds = time.perf_counter() - started
    peak_kb = _status_kb("VmHWM")
    batch = Batch.objects.select_related("output_file", "error_file").get(pk=batch_id)
    return {
        "finalized": done,
        "status": batch.status,
        "output_lines": batch.output_file.lines if batch.output_file else 0,
        "error_lines": batch.error_file.lines if batch.error_file else 0,
        "output_mb": round((batch.output_file.bytes if batch.output_file else 0) / 2**20, 1),
        "rss_before_mb": round(rss_kb / 1024, 1),
        "peak_rss_growth_mb": round((peak_kb - rss_kb) / 1024, 1),
        "finalize_s": round(seconds, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--answer-bytes", type=int, default=4096)
    parser.add_argument("--postgres-url", default=POSTGRES_URL)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.db)))
        return
    var_dir = tempfile.mkdtemp(prefix="bench-finalize-")
    os.environ.update(DATABASE_URL=args.postgres_url, FAIRGATE_VAR_DIR=var_dir)
    os.environ.setdefault("SECRET_KEY", "bench-finalize-scratch-only")
    _setup_django()
    from django.db import connection

    connection.settings_dict["TEST"]["NAME"] = TEST_DB
    db_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        batch_id = _fill(args.lines, args.answer_bytes)
        connection.close()
        command = [sys.executable, "-m", "bench.batch_finalize_memory", "--child", batch_id, "--db", db_name]
        ran = subprocess.run(command, cwd=ROOT, env=os.environ, capture_output=True, text=True, check=False)
        if ran.returncode:
            sys.exit(ran.stderr)
        result = json.loads(ran.stdout.strip().splitlines()[-1])
    finally:
        connection.creation.destroy_test_db(db_name, verbosity=0)
    print(json.dumps({"lines": args.lines, "answer_bytes": args.answer_bytes, **result}))


if __name__ == "__main__":
    main()

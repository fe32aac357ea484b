"""/metrics under ``serve --workers N`` (prometheus client's multiprocess mode): a scrape in any
process sums every process's counters, those that exited included; a live gauge counts only the
processes still running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
COUNT = """
import sys
from gateway import metrics
metrics.REQUESTS.labels("acme", "BATCH", "completed").inc(int(sys.argv[1]))
metrics.INTAKE_WAITING.labels("BATCH").inc(int(sys.argv[1]))
print("counted", flush=True)
if sys.argv[2] == "stay":
    sys.stdin.read()  # until the test closes it
"""
SCRAPE = "import sys; from gateway import metrics; sys.stdout.buffer.write(metrics.exposition())"


def _python(code: str, *args: str, env: dict, **options) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, env=env, text=True, **options)


def _scrape(env: dict) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", SCRAPE], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    samples = {}
    for line in done.stdout.splitlines():
        if line.startswith(("fairgate_requests_total{", "fairgate_intake_waiting{")):
            series, _, value = line.rpartition(" ")
            samples[series.partition("{")[0]] = float(value)
    return samples


def test_a_scrape_sums_every_process(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    gone = _python(COUNT, "3", "exit", env=env, stdout=subprocess.PIPE)
    assert gone.communicate(timeout=60)[0].strip() == "counted"
    staying = _python(COUNT, "4", "stay", env=env, stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    try:
        assert staying.stdout is not None and staying.stdout.readline().strip() == "counted"
        seen = _scrape(env)
        assert seen == {"fairgate_requests_total": 7.0, "fairgate_intake_waiting": 4.0}
    finally:
        staying.communicate(timeout=60)
    assert _scrape(env) == {"fairgate_requests_total": 7.0}  # no live process waits any more

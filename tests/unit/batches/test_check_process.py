"""The checking process (batches.check_process) is spawned: it imports the module that holds its
entry points before Django is set up, so that module must import no models at its top."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from batches import check_process

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_the_checking_processs_entry_points_import_before_django_is_set_up():
    code = "import batches.check_process as c; print(c._child_start.__name__, c._child_check.__name__)"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["_child_start", "_child_check"]


def test_the_checking_process_ends_when_its_serving_process_stops():
    child_pid = check_process._checker().submit(os.getpid).result(timeout=60)
    assert Path(f"/proc/{child_pid}").exists()
    asyncio.run(check_process.checker_stop())
    assert not Path(f"/proc/{child_pid}").exists()  # joined: ended and reaped
    assert check_process._pool is None

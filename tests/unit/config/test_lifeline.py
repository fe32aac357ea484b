"""config.lifeline: a child ends once its parent is gone, however the parent ended, and not while
its parent is there."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
LIMIT_S = 30.0  # a safety net, never what decides the outcome

CHILD = """
import sys, time
from config.lifeline import exit_with_parent
exit_with_parent(int(sys.argv[1]))
time.sleep(600)
"""
PARENT = """
import subprocess, sys, os, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())])
print(child.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pid: int) -> None:
    deadline_s = time.monotonic() + LIMIT_S
    while alive(pid):
        assert time.monotonic() < deadline_s, f"process {pid} outlived its parent"
        time.sleep(0.05)


def test_a_child_whose_parent_is_not_the_one_it_was_given_ends_at_once_with_status_0():
    child = subprocess.run([sys.executable, "-c", CHILD, "0"], cwd=REPO_ROOT, timeout=LIMIT_S, capture_output=True)
    assert child.returncode == 0, child.stderr


def test_a_child_ends_when_its_parent_is_killed_and_lives_while_it_runs():
    for signum in (signal.SIGKILL, signal.SIGTERM):
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT, CHILD], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
        )
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        time.sleep(1.0)  # two of its looks at its parent
        assert alive(child_pid)
        parent.send_signal(signum)
        parent.wait(timeout=LIMIT_S)
        wait_gone(child_pid)

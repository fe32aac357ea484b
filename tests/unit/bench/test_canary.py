"""bench.canary: a stop of the machine is a late wake-up of an idle process; a stopped canary
is the same thing, on demand."""

from __future__ import annotations

import os
import signal
import time

from bench.canary import STALL_MS, Canary


def test_a_stopped_canary_reports_the_stall_it_woke_up_late_from():
    canary = Canary()
    try:
        deadline = time.monotonic() + 60
        while not canary.stalls and time.monotonic() < deadline:  # (the first stops may come before its loop)
            os.kill(canary._process.pid, signal.SIGSTOP)
            time.sleep(0.3)
            os.kill(canary._process.pid, signal.SIGCONT)
            for _ in range(100):
                if canary.stalls:
                    break
                time.sleep(0.01)
        assert canary.stalls, "no stall reported"
        at, late_ms = canary.stalls[0]
        assert late_ms >= 200 >= STALL_MS  # stopped for 300 ms
        assert late_ms in canary.between(at - 1, at + 1) and canary.between(at + 3600, at + 7200) == []
    finally:
        canary.stop()
    assert canary._process.poll() is not None

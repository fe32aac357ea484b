"""bench.canary: a stop of the machine is a late wake-up of an idle process; a stopped canary
is the same thing, on demand."""

from __future__ import annotations

import os
import signal
import time

from bench.canary import STALL_MS, Canary

STOPPED_S = 0.3


def test_a_stopped_canary_reports_the_stall_it_woke_up_late_from():
    canary = Canary()

    def stopped() -> tuple[float, float] | None:  # (a busy machine may add short stalls of its own)
        return next(((at, late_ms) for at, late_ms in list(canary.stalls) if late_ms >= 200), None)

    try:
        deadline = time.monotonic() + 60
        while stopped() is None and time.monotonic() < deadline:  # (the first stops may come before its loop)
            os.kill(canary._process.pid, signal.SIGSTOP)
            time.sleep(STOPPED_S)
            os.kill(canary._process.pid, signal.SIGCONT)
            for _ in range(100):
                if stopped() is not None:
                    break
                time.sleep(0.01)
        found = stopped()
        assert found is not None, f"no stall of 200 ms or more reported: {canary.stalls}"
        at, late_ms = found
        assert 200 >= STALL_MS  # what a stop of 300 ms is reported as, at least
        assert late_ms in canary.between(at - 1, at + 1) and canary.between(at + 3600, at + 7200) == []
    finally:
        canary.stop()
    assert canary._process.poll() is not None

"""A canary for the machine's own stalls, beside a benchmark: a process of its own that only sleeps
5 ms at a time and notes every wake-up that came ``STALL_MS`` or more late (when, how late).

A shared VM can stop as a whole, every process at once. A latency round that holds such a stop
measures the machine, not the system under test; the reports print each round's stalls beside
its percentiles, so a miss can be told from a stall of the machine (the rounds are not dropped
or redone: the figures stay as measured). Why it is there: while investigating billing's p99 on
PostgreSQL, both gateways' event loops, the idle billing-off one's too, woke up 290-300 ms late
at the same instant, twice, 120 s apart; a stall of the machine, or work both do at once, which
this process tells apart (it shares nothing with them).

    python -m bench.canary        # prints "<unix time> <ms late>" per stall until stopped
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

STALL_MS = 20.0
NAP_S = 0.005


class Canary:
    """The canary's process, and the stalls it has reported so far (read by a thread of this one)."""

    def __init__(self) -> None:
        self.stalls: list[tuple[float, float]] = []  # (unix time of the late wake-up, ms late)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.canary"], stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self._reader = threading.Thread(target=self._read, daemon=True, name="canary")
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            at, late_ms = line.split()
            self.stalls.append((float(at), float(late_ms)))

    def between(self, start: float, end: float) -> list[float]:
        """How late (ms) each stall between the unix times ``start`` and ``end`` was."""
        return [late_ms for at, late_ms in list(self.stalls) if start <= at <= end]

    def stop(self) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()


def main() -> None:
    while True:
        before = time.perf_counter()
        time.sleep(NAP_S)
        late_ms = (time.perf_counter() - before - NAP_S) * 1000.0
        if late_ms >= STALL_MS:
            print(f"{time.time():.3f} {late_ms:.1f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass

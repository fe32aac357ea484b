"""The gateway's side of the settlement journal's syncer process (billing/journal_sync.py):
asked from the event loop, one request out at a time."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


class JournalSyncer:
    """The journal's syncer process (billing/journal_sync.py), asked from the event loop: one
    request out at a time, its answer read by the loop itself (no thread: a thread of the gateway
    would take the GIL back from the event loop for every sync, and the sync's system time would
    be the gateway's). None of this is needed for durability: a syncer that cannot be started or
    that ends hands its work back to the journal's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, answered: Callable[[int], None], ended: Callable[[], None]):
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).with_name("journal_sync.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self._loop, self._answered, self._ended = loop, answered, ended
        self._out = self.process.stdout.fileno()  # type: ignore[union-attr]
        self._in = self.process.stdin.fileno()  # type: ignore[union-attr]
        self._read = b""
        os.set_blocking(self._out, False)
        loop.add_reader(self._out, self._readable)
        self.dead = False

    def ask(self, seq: int, paths: list[str]) -> None:
        """Asks for a sync; answered through ``answered``, or ``ended`` if the syncer is gone."""
        try:  # one short request out at a time: the pipe always takes it whole
            os.write(self._in, json.dumps([seq, paths]).encode() + b"\n")
        except OSError:
            self._die()

    def _readable(self) -> None:
        try:
            data = os.read(self._out, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._die()
            return
        self._read += data
        *lines, self._read = self._read.split(b"\n")
        for line in lines:
            _seq, error = json.loads(line)
            self._answered(error)

    def _die(self) -> None:
        if not self.dead:
            self.dead = True
            self.close()
            self._ended()

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.remove_reader(self._out)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()

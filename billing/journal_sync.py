"""The settlement journal's syncer: a small process of each gateway's own that ``fdatasync``s the
journal's files (billing.journal), so the gateway's event loop pays neither the sync nor the GIL.

Standard library only; started as ``python -I billing/journal_sync.py``. Reads ``[seq, [path, ...]]``
(JSON, one a line) on stdin, syncs each file (and a new file's directory) and answers ``[seq, errno]``
(0: on disk). A file that is gone counts as synced. Ends at the end of its input, never before its
gateway.
"""

from __future__ import annotations

import json
import os
import signal
import sys

KEEP_OPEN = 8  # files kept open between requests (a journal writes to one segment at a time)


def _sync(path: str, open_fds: dict[str, int]) -> None:
    fd = open_fds.get(path)
    opened = fd is None
    if fd is None:
        try:
            fd = os.open(path, os.O_RDONLY)  # fdatasync syncs the file, whichever descriptor asks
        except FileNotFoundError:
            return
        open_fds[path] = fd
    os.fdatasync(fd)
    if opened:  # a new segment (or one not synced lately): its name on disk too, which fdatasync does not promise
        sync_dir(os.path.dirname(path) or ".")


def sync_dir(directory: str | os.PathLike[str]) -> None:
    """A directory's entries on disk (a new file's name: what fdatasync of the file does not promise)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def serve(requests, answers) -> None:
    open_fds: dict[str, int] = {}
    for raw in requests:
        seq, paths = json.loads(raw)
        error = 0
        for path in paths:
            try:
                _sync(path, open_fds)
            except OSError as failed:
                error = failed.errno or -1
        for stale in [p for p in open_fds if p not in paths][: max(len(open_fds) - KEEP_OPEN, 0)]:
            os.close(open_fds.pop(stale))
        answers.write(json.dumps([seq, error]).encode() + b"\n")
        answers.flush()


if __name__ == "__main__":
    for stop in (signal.SIGINT, signal.SIGTERM):  # its gateway's stop or death ends its input: it ends then
        signal.signal(stop, signal.SIG_IGN)
    serve(sys.stdin.buffer, sys.stdout.buffer)

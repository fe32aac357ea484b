"""A child process's tie to the process that started it: `exit_with_parent` ends the child once
that parent is gone, however it ended (a clean stop, SIGTERM, SIGKILL). Standard library only, so
a spawned child may call it before Django is set up. The gateway's children and how each ends:
docs/operating.md ("The gateway's child processes").
"""

from __future__ import annotations

import os
import threading
import time

POLL_S = 0.5  # how often the child looks at its parent process id


def parent_gone(parent_pid: int) -> bool:
    """True once this process's parent is no longer ``parent_pid`` (it ended: this process was
    handed to init or a subreaper)."""
    return os.getppid() != parent_pid


def exit_with_parent(parent_pid: int, *, grace_s: float = 0.0, poll_s: float = POLL_S) -> threading.Thread:
    """Ends this process (exit status 0) ``grace_s`` after ``parent_pid`` stops being its parent,
    from a daemon thread of its own, whatever the rest of the process is blocked in."""
    thread = threading.Thread(target=_watch, args=(parent_pid, grace_s, poll_s), daemon=True, name="exit-with-parent")
    thread.start()
    return thread


def _watch(parent_pid: int, grace_s: float, poll_s: float) -> None:
    while not parent_gone(parent_pid):
        time.sleep(poll_s)
    time.sleep(grace_s)
    os._exit(0)

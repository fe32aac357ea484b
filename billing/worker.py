"""The billing worker process's entry (the target the gateway's billing client spawns:
billing.client.pipe). The spawned process imports this module before Django is set up; the
protocol is billing.worker_protocol, the loop billing.worker_loop.
"""

from __future__ import annotations

import signal

import django  # the package only: `serve` sets it up


def serve(conn, gateway_pid: int, owner: str = "") -> None:
    """Django set up, then billing.worker_loop.run."""
    # A stop signal sent to the whole process group (honcho, systemd) is the gateway's to handle: it
    # ends this worker with `STOP`, after its last bookings and with its clean stop recorded.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    django.setup()
    from billing.worker_loop import run  # noqa: PLC0415 -- needs the app registry django.setup() just filled

    run(conn, gateway_pid, owner)

"""A gateway's children end when it ends, however it ends: the billing worker, the journal syncer
a served request starts, the file checker an upload starts, and multiprocessing's resource tracker
are all gone within a bound after the gateway is stopped (SIGTERM) or killed (SIGKILL). Each child
is known by its pid and start time, wherever it was reparented."""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path

import pytest

from simbackend import SimConfig, start_in_thread
from tests.support.livestack import start_gateway, wait_until
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live

LIMIT_S = 90.0  # a safety net: a killed gateway's billing worker books its journal first, then ends
LINE = {"custom_id": "r0", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}


@pytest.fixture
def gateway(tmp_path):
    sim = start_in_thread(SimConfig(port=0, slots=2, ttft_ms=1, tokens_per_s=1000, seed=5))
    yaml = scheduler_yaml(
        classes=["INTERACTIVE", "BATCH"], tenants=[tenant("fin")], backends=[backend("b", f"{sim.url}/v1")]
    )
    running = start_gateway(tmp_path / "gw", yaml, {"fin": ("fin", "BATCH")})
    yield running
    running.stop()
    sim.stop()


def started_at(pid: int) -> str | None:
    """A process's start time (clock ticks since boot); None once it has ended (a zombie too)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def descendants(pid: int) -> dict[int, tuple[str | None, bytes]]:
    """pid -> (start time, command line) of every process below ``pid``."""
    found: dict[int, tuple[str | None, bytes]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in map(int, (task / "children").read_text().split()):
            found[child] = (started_at(child), Path(f"/proc/{child}/cmdline").read_bytes())
            found.update(descendants(child))
    return found


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_no_child_outlives_its_gateway(gateway, signum):
    sdk = gateway.sdk("fin")
    sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    upload = io.BytesIO(json.dumps(LINE).encode() + b"\n")
    assert sdk.files.create(file=("a.jsonl", upload), purpose="batch").status == "processed"
    children = descendants(gateway.process.pid)
    commands = [command for _, command in children.values()]
    assert sum(b"spawn_main" in command for command in commands) == 2, commands  # billing worker, file checker
    assert any(b"resource_tracker" in command for command in commands), commands
    assert any(b"journal_sync.py" in command for command in commands), commands

    os.kill(gateway.process.pid, signum)
    gateway.process.wait(timeout=30)

    def left() -> list[bytes]:
        return [command for pid, (start, command) in children.items() if start and started_at(pid) == start]

    try:
        wait_until(lambda: not left(), limit_s=LIMIT_S, step_s=0.2, what="every child gone")
    except AssertionError:
        pytest.fail(f"children outlived their gateway ({signal.Signals(signum).name}): {left()}")
    assert gateway.group() == []  # nor anything started later in its process group

"""What the gateway itself says during the replay: its /metrics, read every step."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from bench import rawhttp


@dataclass(frozen=True)
class GatewayView:
    batch_waiting: int  # fairgate_queue_depth{cls="BATCH"}
    waiting: int  # all classes
    aging_preempts: int  # fairgate_aging_preempts, all classes
    aging_boosts: int
    slots_in_use: int
    batch_lines: dict[str, int] = field(default_factory=dict)  # fairgate_batch_lines{state}: Batch API lines


def parse(text: str) -> GatewayView:
    depth: dict[str, float] = {}
    lines: dict[str, int] = {}
    totals = {"preempts": 0.0, "boosts": 0.0, "in_use": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name == "fairgate_queue_depth":
                depth[sample.labels.get("cls", "")] = sample.value
            elif name.startswith("fairgate_aging_preempts") and not name.endswith("_created"):
                totals["preempts"] += sample.value
            elif name.startswith("fairgate_aging_boosts") and not name.endswith("_created"):
                totals["boosts"] += sample.value
            elif name == "fairgate_backend_slots_in_use":
                totals["in_use"] += sample.value
            elif name == "fairgate_batch_lines":
                lines[sample.labels.get("state", "")] = int(sample.value)
    return GatewayView(
        batch_waiting=int(depth.get("BATCH", 0)),
        waiting=int(sum(depth.values())),
        aging_preempts=int(totals["preempts"]),
        aging_boosts=int(totals["boosts"]),
        slots_in_use=int(totals["in_use"]),
        batch_lines=lines,
    )


async def read(base_url: str, timeout_s: float = 30.0) -> GatewayView | None:
    """GET /metrics; None when it did not answer (the table then shows '?')."""
    host, port = rawhttp.split_url(base_url)
    writer = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
            head = await rawhttp.read_head(reader)
            body = await rawhttp.read_body(reader, head)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
        return None
    finally:
        if writer is not None:
            writer.close()
    return parse(body.decode()) if head.status == 200 else None

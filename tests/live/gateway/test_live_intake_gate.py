"""Live: a batch flood waits at the intake gate with its bodies unread, and an interactive request
is answered meanwhile.

One intake turn (FAIRGATE_INTAKE_CONCURRENCY=1); BATCH requests of 1 MB each are sent at once
from sockets with a small send buffer, so a body the gateway does not read stays in its client's
buffer (TCP back-pressure). The test waits for states only: the requests parked (the gateway's
fairgate_intake_waiting) with their bodies still unsent, then an interactive request through
the ``openai`` SDK answered while batch requests are still parked so, then every batch request
answered. Before the gate (the lanes in the view), each body was read before its request waited.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import pytest

from bench import rawhttp
from simbackend import SimConfig, start_in_thread
from tests.support.livestack import Gateway, start_gateway
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

FLOOD = 12
BODY_CHARS = 1_000_000
SEND_BUFFER_BYTES = 128 * 1024
WAIT_LIMIT_S = 60.0


@pytest.fixture(scope="module")
def gated(tmp_path_factory) -> Iterator[Gateway]:
    sim = start_in_thread(SimConfig(port=0, slots=16, ttft_ms=2, tokens_per_s=5000))
    yaml_text = scheduler_yaml(
        tenants=[tenant("acme", share=0.5)],
        backends=[backend("sim", f"{sim.url}/v1", slots=16)],
        sla_ms={"INTERACTIVE": 30000, "BATCH": 600000},
    )
    gateway = start_gateway(
        tmp_path_factory.mktemp("gw-gate"),
        yaml_text,
        {"chat": ("acme", "INTERACTIVE"), "fin": ("acme", "BATCH")},
        FAIRGATE_INTAKE_CONCURRENCY="1",
        FAIRGATE_BILLING="0",
    )
    yield gateway
    gateway.stop()
    sim.stop()


def _batch_body() -> bytes:
    words = ("ledger invoice audit margin " * (BODY_CHARS // 28 + 1))[:BODY_CHARS]
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": words}], "max_tokens": 3}).encode()


class _Sent:
    """A request written at once to a socket whose send buffer is small: what the server does not
    read stays in the client's transport (``unsent``)."""

    def __init__(self, writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> None:
        self.writer, self.reader = writer, reader

    @property
    def unsent(self) -> int:
        return self.writer.transport.get_write_buffer_size()

    async def status(self) -> int:
        head = await rawhttp.read_head(self.reader)
        await rawhttp.read_body(self.reader, head)
        self.writer.close()
        return head.status


async def _send(url: str, key: str, body: bytes) -> _Sent:
    host, port = rawhttp.split_url(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=2**20)
    headers = {"Authorization": f"Bearer {key}", "X-Priority-Class": "BATCH"}
    writer.write(rawhttp.request_bytes(host, port, "/v1/chat/completions", body, headers))  # not drained
    return _Sent(writer, reader)


async def _until(predicate, what: str) -> None:
    deadline_s = asyncio.get_running_loop().time() + WAIT_LIMIT_S
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline_s, f"{what} never held"
        await asyncio.sleep(0.02)


def test_an_interactive_request_is_answered_while_a_batch_flood_waits_unread_at_the_gate(gated):
    def waiting() -> float:
        return gated.metric("fairgate_intake_waiting", cls="BATCH")

    def admitted() -> int:
        with gated.http("fin") as client:
            return len(client.get("/v1/queue").json()["data"])

    def chat() -> str:
        answer = gated.sdk("chat").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
        return answer.choices[0].message.content or ""

    async def scenario() -> None:
        body = _batch_body()
        flood = [await _send(gated.url, gated.keys["fin"], body) for _ in range(FLOOD)]
        answers = [asyncio.create_task(sent.status()) for sent in flood]

        async def parked() -> bool:
            """A batch request is past intake (its turn came and went), and half of the flood still
            waits for a turn with its body unsent."""
            if sum(1 for sent in flood if sent.unsent > 0) < FLOOD // 2:
                return False
            return await asyncio.to_thread(admitted) >= 1 and await asyncio.to_thread(waiting) >= FLOOD // 2

        await _until(parked, f"{FLOOD // 2} batch requests parked at the gate with their bodies unread")
        assert await asyncio.to_thread(chat)  # through the openai SDK, past the parked flood
        still = await asyncio.to_thread(waiting)
        assert still >= 1 and any(sent.unsent > 0 for sent in flood), "the flood drained before the chat was answered"
        statuses = await asyncio.wait_for(asyncio.gather(*answers), WAIT_LIMIT_S)
        assert statuses == [200] * FLOOD
        assert await asyncio.to_thread(waiting) == 0

    asyncio.run(scenario())

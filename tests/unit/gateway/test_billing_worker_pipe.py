"""The billing worker's pipe under load (gateway.billing_worker): answers and batches far bigger
than the socket buffer, answers that arrive in pieces, and many back to back cross whole on uvloop
(the gateway's loop, whose add_reader makes the fd non-blocking) and on asyncio's; a worker really
killed is still detected, logged and counted, and the Booker replaces it.

The worker here is a fake (`fake_serve`), spawned like the real one (it replaces
`billing_worker.serve`); it speaks the real one's side of the pipe, ``send_bytes``/``recv_bytes``,
so only the gateway's side is under test. The fakes are in tests/support/fake_billing_worker.py,
which the spawned fake imports before Django is set up."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable, Coroutine

import pytest
import uvloop

from billing.client import pipe as billing_worker
from gateway import metrics
from tests.support.fake_billing_worker import Probe, answer_for, fake_serve, fake_serve_in_pieces, fake_serve_none

MB = 1024 * 1024
SAFETY_S = 120.0  # only so that a regression fails instead of hanging; nothing waits for it
LOOPS = pytest.mark.parametrize("new_loop", [uvloop.new_event_loop, asyncio.new_event_loop], ids=["uvloop", "asyncio"])


# --- helpers in the test process -------------------------------------------------------------------


def run(new_loop: Callable[[], asyncio.AbstractEventLoop], scenario: Coroutine) -> None:
    loop = new_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(scenario, SAFETY_S))
    finally:
        loop.close()


def replacements() -> float:
    return metrics.REGISTRY.get_sample_value("fairgate_billing_worker_replacements_total") or 0.0


async def ask_probes(worker: billing_worker.Worker, probes: list[Probe]) -> None:
    results, events = await worker.call(probes)
    assert events == []
    assert len(results) == len(probes)
    for probe, result in zip(probes, results):
        assert result == answer_for(probe), f"answer to {probe[:2]} is not whole"


async def back_to_back(worker: billing_worker.Worker, count: int) -> None:
    """``count`` batches out at once, each answered in order; sizes around the 16 KiB at which
    ``send_bytes`` writes header and payload apart, and above the socket buffer."""
    sizes = (1, 17_000, 300_000)
    await asyncio.gather(*(ask_probes(worker, [(sizes[i % 3], i, b"")]) for i in range(count)))


# --- tests -----------------------------------------------------------------------------------------


@LOOPS
def test_answers_and_batches_far_bigger_than_the_socket_buffer_arrive_whole(new_loop, monkeypatch):
    monkeypatch.setattr(billing_worker, "serve", fake_serve)
    before = replacements()

    async def scenario() -> None:
        worker = billing_worker.Worker()
        try:
            await worker.started()
            await ask_probes(worker, [(8 * MB, 1, b"")])  # an answer some 40 socket buffers long
            await ask_probes(worker, [(10, 2, os.urandom(8 * MB))])  # and a batch as long
            await back_to_back(worker, 120)
            await ask_probes(worker, [(6 * MB, 3, os.urandom(6 * MB)), (5, 4, b"")])
            assert not worker.dead
        finally:
            await worker.stop()

    run(new_loop, scenario())
    assert replacements() == before


@LOOPS
def test_answers_that_arrive_in_pieces_are_read_whole(new_loop, monkeypatch):
    monkeypatch.setattr(billing_worker, "serve", fake_serve_in_pieces)

    async def scenario() -> None:
        worker = billing_worker.Worker()
        try:
            await worker.started()  # READY too comes in two pieces
            await ask_probes(worker, [(20_000, 5, b"")])
            await ask_probes(worker, [(3 * MB, 6, b"")])
            await back_to_back(worker, 12)
            assert not worker.dead
        finally:
            await worker.stop()

    run(new_loop, scenario())


@LOOPS
def test_a_killed_worker_is_detected_logged_and_counted(new_loop, monkeypatch, caplog):
    monkeypatch.setattr(billing_worker, "serve", fake_serve)
    before = replacements()

    async def scenario() -> None:
        worker = billing_worker.Worker()
        try:
            await worker.started()
            await ask_probes(worker, [(100, 7, b"")])
            os.kill(worker.process.pid, signal.SIGKILL)
            with pytest.raises(billing_worker.WorkerDied):
                await worker.call([(100, 8, b"")])
            assert worker.dead
            with pytest.raises(billing_worker.WorkerDied):  # and every later batch at once
                await worker.call([(100, 9, b"")])
        finally:
            await worker.stop()

    with caplog.at_level(logging.WARNING, logger="gateway.billing_worker"):
        run(new_loop, scenario())
    assert replacements() == before + 1
    ended = [r for r in caplog.records if r.name == "gateway.billing_worker" and r.levelno == logging.WARNING]
    assert len(ended) == 1 and "ended" in ended[0].getMessage()


def test_the_booker_replaces_a_killed_worker_and_counts_it(monkeypatch, caplog):
    from django.utils import timezone

    from billing.booking_asks import ReleaseAsk
    from billing.client import Booker

    monkeypatch.setattr(billing_worker, "serve", fake_serve_none)
    before = replacements()

    def release(request_id: str) -> ReleaseAsk:
        return ReleaseAsk(request_id=request_id, reason="test", at=timezone.now())

    async def scenario() -> None:
        booker = Booker()
        try:
            await booker.start()
            assert await booker.submit(release("pipe-1")) is None
            killed = booker._worker.process
            os.kill(killed.pid, signal.SIGKILL)
            assert await booker.submit(release("pipe-2")) is None  # booked by a new worker
            assert booker._worker.process.pid != killed.pid
        finally:
            await booker.stop()

    with caplog.at_level(logging.WARNING, logger="gateway.billing_worker"):
        run(uvloop.new_event_loop, scenario())
    assert replacements() == before + 1
    assert any(r.levelno == logging.WARNING and "ended" in r.getMessage() for r in caplog.records)


def test_a_failing_answer_callback_is_reported_and_the_answers_after_it_still_match(monkeypatch):
    monkeypatch.setattr(billing_worker, "serve", fake_serve)
    reported: list[BaseException] = []

    def fails(answer: bytes | BaseException) -> None:
        raise RuntimeError("a callback that fails")

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context["exception"]))
        worker = billing_worker.Worker()
        try:
            await worker.started()
            worker.send([(10, 1, b"")], fails)
            await asyncio.gather(*(ask_probes(worker, [(17_000, seed, b"")]) for seed in range(2, 6)))
            assert not worker.dead
        finally:
            await worker.stop()

    run(uvloop.new_event_loop, scenario())
    assert [str(exc) for exc in reported] == ["a callback that fails"]


def test_asks_no_one_waits_for_linger_until_one_someone_waits_for_takes_them_along(monkeypatch, settings):
    from django.utils import timezone

    from billing.booking_asks import ReleaseAsk
    from billing.client import Booker

    monkeypatch.setattr(billing_worker, "serve", fake_serve_none)
    settings.FAIRGATE_BILLING_LINGER_MS = 3_600_000  # never by time in this test: only by urgency
    sent: list[int] = []

    def release(request_id: str) -> ReleaseAsk:
        return ReleaseAsk(request_id=request_id, reason="test", at=timezone.now())

    async def scenario() -> None:
        booker = Booker()
        try:
            await booker.start()
            real_send = booker._worker.send
            monkeypatch.setattr(
                booker._worker, "send", lambda asks, done: (sent.append(len(asks)), real_send(asks, done))
            )
            lingering = [booker.submit(release(f"linger-{i}"), urgent=False) for i in range(3)]
            for _ in range(20):
                await asyncio.sleep(0)
            assert sent == [] and not any(f.done() for f in lingering)  # waiting for company
            assert await booker.submit(release("linger-urgent")) is None  # someone waits: all go now
            assert sent == [4] and all(f.done() for f in lingering)
            later = booker.submit(release("linger-4"), urgent=False)
            booker.hurry()  # an early hold being confirmed, say
            assert await later is None and sent == [4, 1]
        finally:
            await booker.stop()

    run(uvloop.new_event_loop, scenario())

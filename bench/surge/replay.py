"""One live replay of the surge against a running gateway; bounded in time, never hangs.

Timeline: chat and near-RT traffic from 08:55; the batch at 09:00 (sent by a process of its own,
bench.surge.batch_sender, so that its connections do not delay the loop that times the chats); a
sample of the gateway's /metrics and the client's counts every step; the replay ends one step
after the last batch request was answered, or at ``max_sim_s``. In-flight chats then get their patience to finish.

With ``upload``, the batch is not sent as HTTP requests but uploaded at 09:00 as one file and
started through the Batch API (bench.surge.upload); its counts are then the batch's own, read
each step, and the replay ends one step after the batch has ended (its status).

With ``batch=False`` nothing is sent at 09:00: the same chat and near-RT traffic runs alone until
``max_sim_s`` (the comparison's no-batch baseline, which needs only a stretch after 09:00).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from bench.canary import Canary
from bench.surge import probe
from bench.surge.batch_sender import BatchSender
from bench.surge.plan import Prompts, SurgePlan
from bench.surge.report import BatchTally, Sample, SurgeResult, p95_of
from bench.surge.traffic import ERROR, OK, Clock, Ledger, Traffic
from bench.surge.upload import UploadedBatch, batch_jsonl

Progress = Callable[[str], None]
POLL_LIMIT = 0.5  # of a step: how long an uploaded batch's poll and /metrics read may take (then '?')
LAG_MS = 5.0  # the replay's event loop woke up this late or more: noted (a chat's timing counts it)
LAG_NAP_S = 0.002


async def _watch_lag(clock: Clock, lags: list[tuple[float, float]]) -> None:
    """Notes (simulated s, real ms late) whenever this process's event loop woke up ``LAG_MS`` late."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(LAG_NAP_S)
        late_ms = (time.perf_counter() - before - LAG_NAP_S) * 1000.0
        if late_ms >= LAG_MS:
            lags.append((clock.now_sim_s(), late_ms))


def _sample(
    plan: SurgePlan,
    clock: Clock,
    ledger: Ledger,
    view,
    due_sim_s: float,
    uploaded: UploadedBatch | None,
    batch: bool = True,
) -> Sample:
    """Labelled with the step's due time (a late sample keeps its label; its counts are as read).
    An uploaded batch's counts are its own (``uploaded.counts``, polled just before)."""
    sim_s = clock.now_sim_s()
    if uploaded is not None:
        counts = uploaded.counts
        done, failed = (counts.completed, counts.failed) if counts else (0, 0)
        return Sample(sim_s, plan.clock(due_sim_s), view, batch_completed=done, batch_failed=failed, batch_not_sent=0)
    batch = ledger.of("batch")
    return Sample(
        sim_s=sim_s,
        clock=plan.clock(due_sim_s),
        view=view,
        batch_completed=sum(o.state == OK for o in batch),
        batch_failed=sum(o.state == ERROR for o in batch),
        batch_not_sent=plan.batch_count - ledger.batch_sent if batch and sim_s >= plan.warmup_sim_s else 0,
    )


def _progress_line(plan: SurgePlan, sample: Sample, ledger: Ledger, uploaded: UploadedBatch | None) -> str:
    recent = [o for o in ledger.of("chat") if o.sent_sim_s > sample.sim_s - plan.step_sim_s]
    view = sample.view
    waiting = "?" if view is None else f"{view.batch_waiting:,} batch waiting, {view.aging_preempts} preempts"
    if uploaded is None:
        where = f"not yet sent {sample.batch_not_sent:,}"
    else:
        pending = "?" if view is None else f"{view.batch_lines.get('pending', '?')}"
        status = uploaded.counts.status if uploaded.counts else uploaded.refused or "not created yet"
        where = f"batch {status}, pending {pending}"
    return (
        f"[surge {sample.clock}] {waiting}; batch done {sample.batch_completed:,}/{plan.batch_count:,} "
        f"(failed {sample.batch_failed:,}, {where}); chat p95 so far {p95_of(recent).text()}"
    )


def drained_at(plan: SurgePlan, ledger: Ledger) -> float | None:
    batch = ledger.of("batch")
    if len(batch) < plan.batch_count or any(o.done_sim_s is None or o.state == "pending" for o in batch):
        return None  # (a request cancelled when the replay stopped has its done time, and no answer)
    return max(o.done_sim_s for o in batch) - plan.warmup_sim_s


async def replay(
    plan: SurgePlan,
    base_url: str,
    *,
    batch_key: str,
    interactive_keys: list[str],
    progress: Progress = lambda line: None,
    upload: bool = False,
    batch: bool = True,
) -> SurgeResult:
    if not interactive_keys:
        raise ValueError("at least one interactive key is needed")
    if upload and not batch:
        raise ValueError("a run with no batch uploads none")
    content = batch_jsonl(plan, Prompts(plan.seed)) if upload else b""  # made before the clock starts
    batch_process = BatchSender(plan, base_url, batch_key) if batch and not upload else None  # a process of its own
    if batch_process is not None:
        await batch_process.start()  # it has built the batch's requests
    clock = Clock(plan)
    ledger = Ledger()
    traffic = Traffic(plan, base_url, clock, ledger)
    uploaded = UploadedBatch(plan, base_url, batch_key, clock, content) if upload else None
    stop = asyncio.Event()
    samples: list[Sample] = []
    loop = asyncio.get_running_loop()
    lags: list[tuple[float, float]] = []
    canary, started_unix, started_sim_s = Canary(), time.time(), clock.now_sim_s()
    watcher = loop.create_task(_watch_lag(clock, lags))
    if batch_process is not None:
        batch_process.go(clock, ledger)  # it sends the batch at 09:00 on this clock
    senders = [
        loop.create_task(traffic.arrivals("chat", plan.interactive_per_real_s, interactive_keys, stop, plan.seed)),
        loop.create_task(traffic.arrivals("near_rt", plan.near_rt_per_real_s, interactive_keys, stop, plan.seed + 1)),
    ]
    batch_task = None
    try:
        step = 0
        drained = None
        while True:
            step += 1
            await clock.sleep_until_sim(step * plan.step_sim_s)
            if uploaded is not None and batch_task is None and clock.now_sim_s() >= plan.warmup_sim_s - 1e-6:
                batch_task = loop.create_task(uploaded.submit())
            if uploaded is None:
                view = await probe.read(base_url)
            else:  # side by side, the poll bounded: a slow gateway must not hold the timeline back
                limit_s = POLL_LIMIT * plan.real_s(plan.step_sim_s)
                view, _ = await asyncio.gather(probe.read(base_url, timeout_s=limit_s), uploaded.poll(limit_s))
            sample = _sample(plan, clock, ledger, view, step * plan.step_sim_s, uploaded, batch)
            samples.append(sample)
            progress(_progress_line(plan, sample, ledger, uploaded))
            if drained is not None or clock.now_sim_s() >= plan.max_sim_s:
                break
            if batch:
                drained = drained_at(plan, ledger) if uploaded is None else _ended_at(plan, uploaded)
        stop.set()
        await _let_chats_finish(plan, traffic)
        if uploaded is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(uploaded.finish(), timeout=60)  # its error file is read
    finally:
        stop.set()
        canary.stop()
        watcher.cancel()
        for task in (*senders, *([batch_task] if batch_task else [])):
            task.cancel()
        await asyncio.gather(*senders, *([batch_task] if batch_task else []), return_exceptions=True)
        if batch_process is not None:
            await batch_process.stop()  # its last outcomes are in the ledger
        await traffic.close()
        if uploaded is not None:
            await uploaded.close()
    if uploaded is not None:
        result = _uploaded_result(plan, samples, ledger, clock, uploaded)
    elif not batch:
        result = SurgeResult(plan, samples, ledger, None, clock.now_sim_s(), no_batch=True)
    else:
        result = SurgeResult(plan, samples, ledger, drained_at(plan, ledger), clock.now_sim_s())
        if result.drained_sim_s is None:
            result.notes.append(f"stopped at {plan.clock(plan.max_sim_s)} before the batch drained")
    result.client_lags = lags
    result.stalls = [(started_sim_s + plan.sim_s(at - started_unix), ms) for at, ms in canary.stalls]  # on our clock
    return _missed(result)


def _missed(result: SurgeResult) -> SurgeResult:
    """Says how many samples the gateway's /metrics did not answer (their rows show '?')."""
    missed = sum(s.view is None for s in result.samples)
    if missed:
        result.notes.append(f"/metrics did not answer {missed} of {len(result.samples)} samples (their rows show '?')")
    return result


def _ended_at(plan: SurgePlan, uploaded: UploadedBatch) -> float | None:
    """When the uploaded batch's lines had all ended, since 09:00, once the batch itself has ended
    (or it was refused: then there is nothing to wait for)."""
    if uploaded.refused:
        return 0.0
    if uploaded.ended_sim_s is None or uploaded.drained_sim_s is None:
        return None
    return uploaded.drained_sim_s - plan.warmup_sim_s


def _uploaded_result(
    plan: SurgePlan, samples: list[Sample], ledger: Ledger, clock: Clock, uploaded: UploadedBatch
) -> SurgeResult:
    counts = uploaded.counts
    tally = None
    if counts is not None:
        tally = BatchTally(counts.status, counts.completed, counts.failed, dict(uploaded.failures))
    drained = _ended_at(plan, uploaded) if not uploaded.refused else None
    result = SurgeResult(plan, samples, ledger, drained, clock.now_sim_s(), batch=tally, uploaded=True)
    size_mb = len(uploaded.content) / 1e6
    if uploaded.refused:
        result.notes.append(f"the batch was not created: {uploaded.refused}")
    else:
        result.notes.append(
            f"the batch file ({size_mb:.0f} MB, {plan.batch_count:,} lines) was uploaded in "
            f"{uploaded.upload_real_s or 0:.1f} s real and the batch created in {uploaded.create_real_s or 0:.1f} s "
            f"real (= {plan.sim_s(uploaded.create_real_s or 0) / 60:.1f} simulated minutes; from 09:00); when the "
            f"replay ended it was {counts.status if counts else '?'} (the headline's batch counts are from then)"
        )
    if uploaded.poll_s:
        polls = sorted(uploaded.poll_s)
        result.notes.append(
            f"GET /v1/batches/{{id}} (one poll a step) took {polls[len(polls) // 2]:.2f} s real at the median and "
            f"{polls[-1]:.2f} s at most; {uploaded.polls_late} of {len(polls)} polls failed or took over "
            f"{POLL_LIMIT * plan.real_s(plan.step_sim_s):g} s (their row shows the counts seen before)"
        )
    if uploaded.forecast:
        said = uploaded.forecast
        result.notes.append(
            f"the gateway's forecast at create: done in {said.get('done_in_s')} s real at the earliest on "
            f"{said.get('slots')} slots, fits its window: {said.get('fits_window')}"
        )
    if drained is None and not uploaded.refused:
        result.notes.append(f"stopped at {plan.clock(plan.max_sim_s)} before the batch ended")
    return result


async def _let_chats_finish(plan: SurgePlan, traffic: Traffic) -> None:
    """Chats still waiting end by their patience; give them that long, no longer."""
    pending = [t for t in traffic.tasks]
    if pending:
        await asyncio.wait(pending, timeout=plan.real_s(plan.patience_sim_s[1]) + 5.0)

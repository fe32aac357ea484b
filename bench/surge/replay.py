"""One live replay of the surge against a running gateway; bounded in time, never hangs.

Timeline: chat and near-RT traffic from 08:55; the batch at 09:00; a sample of the gateway's
/metrics and the client's counts every step; the replay ends one step after the last batch
request was answered, or at ``max_sim_s``. In-flight chats then get their patience to finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bench.surge import probe
from bench.surge.plan import SurgePlan
from bench.surge.report import Sample, SurgeResult, p95_of
from bench.surge.traffic import ERROR, OK, Clock, Ledger, Traffic

Progress = Callable[[str], None]


def _sample(plan: SurgePlan, clock: Clock, ledger: Ledger, view, due_sim_s: float) -> Sample:
    """Labelled with the step's due time (a late sample keeps its label; its counts are as read)."""
    batch = ledger.of("batch")
    sim_s = clock.now_sim_s()
    return Sample(
        sim_s=sim_s,
        clock=plan.clock(due_sim_s),
        view=view,
        batch_completed=sum(o.state == OK for o in batch),
        batch_failed=sum(o.state == ERROR for o in batch),
        batch_not_sent=plan.batch_count - ledger.batch_sent if sim_s >= plan.warmup_sim_s else 0,
    )


def _progress_line(plan: SurgePlan, sample: Sample, ledger: Ledger) -> str:
    recent = [o for o in ledger.of("chat") if o.sent_sim_s > sample.sim_s - plan.step_sim_s]
    view = sample.view
    waiting = "?" if view is None else f"{view.batch_waiting:,} batch waiting, {view.aging_preempts} preempts"
    return (
        f"[surge {sample.clock}] {waiting}; batch done {sample.batch_completed:,}/{plan.batch_count:,} "
        f"(failed {sample.batch_failed:,}, not yet sent {sample.batch_not_sent:,}); chat p95 so far "
        f"{p95_of(recent).text()}"
    )


def _drained_at(plan: SurgePlan, ledger: Ledger) -> float | None:
    batch = ledger.of("batch")
    if len(batch) < plan.batch_count or any(o.done_sim_s is None for o in batch):
        return None
    return max(o.done_sim_s for o in batch) - plan.warmup_sim_s


async def replay(
    plan: SurgePlan,
    base_url: str,
    *,
    batch_key: str,
    interactive_keys: list[str],
    progress: Progress = lambda line: None,
) -> SurgeResult:
    if not interactive_keys:
        raise ValueError("at least one interactive key is needed")
    clock = Clock(plan)
    ledger = Ledger()
    traffic = Traffic(plan, base_url, clock, ledger)
    stop = asyncio.Event()
    samples: list[Sample] = []
    loop = asyncio.get_running_loop()
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
            if batch_task is None and clock.now_sim_s() >= plan.warmup_sim_s - 1e-6:
                batch_task = loop.create_task(traffic.batch(batch_key))
            view = await probe.read(base_url)
            sample = _sample(plan, clock, ledger, view, step * plan.step_sim_s)
            samples.append(sample)
            progress(_progress_line(plan, sample, ledger))
            if drained is not None or clock.now_sim_s() >= plan.max_sim_s:
                break
            drained = _drained_at(plan, ledger)
        stop.set()
        await _let_chats_finish(plan, traffic)
    finally:
        stop.set()
        for task in (*senders, *([batch_task] if batch_task else [])):
            task.cancel()
        await asyncio.gather(*senders, *([batch_task] if batch_task else []), return_exceptions=True)
        await traffic.close()
    result = SurgeResult(plan, samples, ledger, _drained_at(plan, ledger), clock.now_sim_s())
    if result.drained_sim_s is None:
        result.notes.append(f"stopped at {plan.clock(plan.max_sim_s)} before the batch drained")
    return result


async def _let_chats_finish(plan: SurgePlan, traffic: Traffic) -> None:
    """Chats still waiting end by their patience; give them that long, no longer."""
    pending = [t for t in traffic.tasks]
    if pending:
        await asyncio.wait(pending, timeout=plan.real_s(plan.patience_sim_s[1]) + 5.0)


def run_sync(coro):
    """Run ``coro`` on uvloop when installed (a cheaper client), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)

"""Issue 15 item 4's live pool in the simulator: the worst 5-minute window of chat waits.

    python -m bench.sim_surge_pool [--slots 24,48] [--seeds 1-5] [--set key=value ...] [--jobs N] [--json OUT]

``bench.surge_compare`` replays the surge at a load scale (``--batch-count 6200``: half the field
event, 24 backend slots, chat and near-RT at half their rates, only finance's batch) on the
simulated GPU backend (``bench.surge.plan``: prefill 150 ms per 512 prompt tokens, 25 tokens/s of
decode, ``max_tokens`` generated). This builds the same pool and traffic as a simulator scenario at
time scale 1, from ``surge.json``'s configuration (its ``headroom`` section with ``--set`` applied)
and the replay's plan: chat holds a slot ~0.47 s + 40 ms per output token (50-140), near-RT and
batch ~0.66 s + 40 ms per token (100-220, 200-700); chat users give up after 20-60 s. ``--slots 48``
is the field event's size (12,400 batch requests, full rates).

Each seed runs ``strict`` and ``fairgate`` on one trace. Figures (fairgate unless named): the worst
5-minute window's interactive p95 wait over the chats *sent* in it (windows from 09:00 to the
batch's drain, aligned on 08:55 as the replay's samples; answered chats at their wait, given-up ones
at their patience, 504s left out: ``bench.surge.report``'s rule), the whole surge's interactive
p95/p99 wait, interactive 504s (``queue_timeout``) and give-ups, BATCH median wait against strict's,
the drain's end, BATCH requests dispatched after their SLA, and the free slots while BATCH waited.

``--model`` prints the arithmetic instead (``stock``): held slots as a stock that chat arrivals
(rate ``λ``) draw down and freed slots (rate ``f``, the pool's turnover) refill up to ``B``, chats
queueing (first come, first served) when it is empty. Its state ``s`` (holds minus waiting chats)
is a birth-death chain with ``P(s) ∝ a^s`` for ``s <= B``, ``a = f / λ``; so a chat waits with
probability ``a^-B`` and, if it does, a geometric number of turnovers, an exponential time of rate
``f - λ``: ``P(wait > W) = a^-B x exp(-(f - λ) W)``, and the holds leave
``B - (1 - a^-B) / (a - 1)`` slots idle on average. ``f`` counts every class's completions, BATCH's
on the slots left after chat, near-RT and the idle ones.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
from pathlib import Path
from typing import Any

from bench.generators import TraceRequest
from bench.metrics import percentile
from bench.scenario import scenario_from_dict
from bench.sim import Simulation
from bench.surge.plan import (
    BATCH,
    CHAT,
    DECODE_TOKENS_PER_S,
    FIELD_BATCH_COUNT,
    FIELD_SLOTS,
    INTERACTIVE_PER_S,
    NEAR_RT,
    NEAR_RT_PER_S,
    TTFT_MS_PER_512,
    Shape,
)

SCENARIO = Path(__file__).parent / "scenarios" / "surge.json"
STEP_MS = 300_000
WARMUP_MS = 300_000  # traffic from 08:55, the batch at 09:00
SPREAD_MS = 120_000
RUN_MS = 5 * 3_600_000  # the replay stops at 14:00 (08:55 + 5 h) at the latest
BATCH_TENANT = "finance"


def mean_prefill_ms(shape: Shape) -> int:
    """The backend's mean prefill over the shape's uniform prompts (150 ms per 512 tokens, at least one unit)."""
    low, high = shape.prompt_tokens
    units = sum(max(1.0, p / 512) for p in range(low, high + 1)) / (high - low + 1)
    return round(TTFT_MS_PER_512 * units)


def _generator(cls: str, shape: Shape, rate_per_s: float, tenants: list[str], **extra: Any) -> dict:
    return {
        "kind": "poisson",
        "tenant": tenants,
        "class": cls,
        "prompt_tokens": list(shape.prompt_tokens),
        "output_tokens": list(shape.max_tokens),
        "service_ms": {"base_ms": mean_prefill_ms(shape), "per_output_token_ms": 1000 / DECODE_TOKENS_PER_S},
        "rate_per_s": rate_per_s / len(tenants),
        "start_ms": 0,
        "end_ms": RUN_MS,
        **extra,
    }


def _mean_service_ms(shape: Shape) -> float:
    return mean_prefill_ms(shape) + 1000 / DECODE_TOKENS_PER_S * sum(shape.max_tokens) / 2


def stock(slots: int, holds: int, wait_ms: int) -> dict:
    """The stock model (module docstring) of ``holds`` held slots at ``slots`` backend slots."""
    scale = slots / FIELD_SLOTS
    chat_per_s, near_rt_per_s = INTERACTIVE_PER_S * scale, NEAR_RT_PER_S * scale
    busy = chat_per_s * _mean_service_ms(CHAT) / 1000 + near_rt_per_s * _mean_service_ms(NEAR_RT) / 1000
    idle = 0.0
    for _ in range(50):  # the idle slots lower BATCH's turnover, which lowers the idle slots: iterate
        free_per_s = chat_per_s + near_rt_per_s + (slots - busy - idle) / (_mean_service_ms(BATCH) / 1000)
        a = free_per_s / chat_per_s
        idle = holds - (1 - a**-holds) / (a - 1)
    return {
        "slots": slots,
        "holds": holds,
        "turnover": round(a, 3),
        "waits_longer": a**-holds * math.exp(-(free_per_s - chat_per_s) * wait_ms / 1000),
        "idle_slots": round(idle, 2),
        "batch_slots": round(slots - busy - idle, 2),
    }


def pool_raw(slots: int, headroom: dict[str, Any] | None = None) -> dict:
    """The replay's pool and traffic at ``slots`` backend slots (load scale ``slots / 48``)."""
    surge = json.loads(SCENARIO.read_text(encoding="utf-8"))
    scale = slots / FIELD_SLOTS
    config = dict(surge["config"])
    if headroom is not None:
        config["headroom"] = {**config.get("headroom", {}), **headroom}
    chatting = [t["slug"] for t in surge["tenants"] if t["slug"] != BATCH_TENANT]
    batch = {
        "kind": "burst",
        "tenant": BATCH_TENANT,
        "class": "BATCH",
        "id_prefix": "fin",
        "count": round(FIELD_BATCH_COUNT * scale),
        "at_ms": WARMUP_MS,
        "spread_ms": SPREAD_MS,
        "prompt_tokens": list(BATCH.prompt_tokens),
        "output_tokens": list(BATCH.max_tokens),
        "service_ms": {"base_ms": mean_prefill_ms(BATCH), "per_output_token_ms": 1000 / DECODE_TOKENS_PER_S},
    }
    return {
        **{k: surge[k] for k in ("name", "tenants", "jain_window_ms")},
        "clock_origin": "08:55",
        "timeline_step_ms": STEP_MS,
        "config": config,
        "backends": [{**surge["backends"][0], "slots": slots}],
        "generators": [
            _generator("INTERACTIVE", CHAT, INTERACTIVE_PER_S * scale, chatting, patience_ms=[20_000, 60_000]),
            _generator("NEAR_RT", NEAR_RT, NEAR_RT_PER_S * scale, chatting),
            batch,
        ],
    }


class ChatLog(Simulation):
    """The simulation, keeping each chat's send time and wait (or patience, when it gave up)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.chats: list[tuple[int, int]] = []  # (sent ms, wait ms), answered or given up
        self.batch_end_ms = 0
        self.slots = sum(b.slots for b in self.scenario.backends)
        self.busy = 0
        self.idle_slot_ms = 0  # free slot-time while a BATCH request waits (what the holds cost BATCH)
        self.last_ms = 0

    def _before(self, t_ms: int) -> None:
        if self.sched.depth(self.batch):
            self.idle_slot_ms += (self.slots - self.busy) * (t_ms - self.last_ms)
        self.last_ms = t_ms
        super()._before(t_ms)

    def _start(self, grant: Any, t_ms: int) -> None:
        r: TraceRequest = self.flights[grant.request.id].trace
        if self.flights[grant.request.id].cls == self.interactive:
            self.chats.append((r.at_ms, t_ms - r.at_ms))
        elif self.flights[grant.request.id].cls == self.batch:
            self.batch_end_ms = max(self.batch_end_ms, t_ms + r.service_ms)
        self.busy += 1
        super()._start(grant, t_ms)

    def on_complete(self, rid: str, t_ms: int) -> None:
        self.busy -= 1
        super().on_complete(rid, t_ms)

    def on_give_up(self, rid: str, t_ms: int) -> None:
        flight = self.flights.get(rid)
        before = self.classes[self.interactive].abandoned
        super().on_give_up(rid, t_ms)
        if flight is not None and self.classes[self.interactive].abandoned > before:
            self.chats.append((flight.trace.at_ms, t_ms - flight.trace.at_ms))


def nearest_rank(values: list[int], pct: float) -> int:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, -(-int(pct * len(ordered)) // 100) - 1))] if ordered else 0


def window_p95s(chats: list[tuple[int, int]], end_ms: int) -> dict[str, int]:
    """The p95 wait of the chats sent in each 5-minute window from 09:00 to ``end_ms`` (of those with
    5 chats or more), by the clock that ends it."""
    windows: dict[int, list[int]] = {}
    for at, wait in chats:
        if WARMUP_MS < at <= end_ms:
            windows.setdefault((at - 1) // STEP_MS, []).append(wait)
    return {_clock(STEP_MS * (k + 1)): nearest_rank(v, 95) for k, v in sorted(windows.items()) if len(v) >= 5}


def measure(sim: ChatLog) -> dict:
    end_ms = sim.batch_end_ms
    windows = window_p95s(sim.chats, end_ms)
    worst_at = max(windows, key=lambda clock: windows[clock])
    waits = [wait for at, wait in sim.chats if WARMUP_MS < at <= end_ms]
    batch = sim.classes[sim.batch]
    inter = sim.classes[sim.interactive]
    return {
        "worst_ms": windows[worst_at],
        "worst_window_end": worst_at,
        "windows": windows,
        "p95_ms": nearest_rank(waits, 95),
        "p99_ms": nearest_rank(waits, 99),
        "timeouts": inter.queue_timeout,
        "gave_up": inter.abandoned,
        "batch_median_ms": percentile(sorted(batch.waits), 50),
        "batch_late": batch.admitted - batch.completed_within_sla,
        "batch_refused": batch.rejected_queue_full,
        "drain_end": _clock(end_ms),
        "drain_end_ms": end_ms,
        "idle_slots": round(sim.idle_slot_ms / max(1, end_ms - WARMUP_MS), 2),
    }


def _clock(t_ms: int) -> str:
    minutes = 8 * 60 + 55 + t_ms // 60_000
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def run(slots: int, seed: int, headroom: dict[str, Any]) -> dict:
    scenario = scenario_from_dict(pool_raw(slots, headroom), base=SCENARIO.parent, seed=seed)
    strict = ChatLog(scenario, policy="strict")
    strict.run()
    fairgate = ChatLog(scenario, policy="fairgate")
    fairgate.run()
    on, base = measure(fairgate), measure(strict)
    cost = on["batch_median_ms"] / base["batch_median_ms"] - 1 if base["batch_median_ms"] else 0.0
    return {"slots": slots, "seed": seed, "headroom": headroom, "strict": base, "on": on, "cost": cost}


def row_text(r: dict) -> str:
    on, strict = r["on"], r["strict"]
    return (
        f"slots {r['slots']} seed {r['seed']}: worst window {on['worst_ms']} ms (to {on['worst_window_end']}; "
        f"strict {strict['worst_ms']}), p95/p99 {on['p95_ms']}/{on['p99_ms']} ms, 504 {on['timeouts']}, "
        f"gave up {on['gave_up']}, BATCH median {on['batch_median_ms'] / 1000:.0f} s ({r['cost']:+.1%} vs strict), "
        f"drain {on['drain_end']} (strict {strict['drain_end']}), late {on['batch_late']}, "
        f"{on['idle_slots']} slots free while BATCH waited (strict {strict['idle_slots']})"
    )


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sim_surge_pool", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--slots", default="24,48")
    parser.add_argument("--seeds", default="1-5")
    parser.add_argument("--set", action="append", default=[], help="a headroom key=value over surge.json's")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", dest="json_out")
    parser.add_argument("--model", action="store_true", help="the stock model's arithmetic, no simulation")
    parser.add_argument("--wait-ms", type=int, default=600, help="with --model: the wait allowance")
    args = parser.parse_args(argv)
    if args.model:
        for slots in (int(s) for s in args.slots.split(",")):
            for holds in range(0, 9):
                m = stock(slots, holds, args.wait_ms)
                print(
                    f"slots {slots}, {holds} held: turnover/arrivals {m['turnover']}, P(wait > {args.wait_ms} ms) "
                    f"{m['waits_longer']:.3f}, {m['idle_slots']} slots idle of the "
                    f"{m['batch_slots'] + m['idle_slots']:.1f} BATCH would have"
                )
        return 0
    headroom = {k: _value(v) for k, v in (item.split("=", 1) for item in args.set)}
    jobs = [(int(s), seed, headroom) for s in args.slots.split(",") for seed in _seeds(args.seeds)]
    if args.jobs > 1:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            rows = pool.starmap(run, jobs)
    else:
        rows = [run(*job) for job in jobs]
    print(f"headroom {json.dumps(headroom)}")
    for r in rows:
        print(row_text(r))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

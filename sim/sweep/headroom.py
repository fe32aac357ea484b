"""The headroom part of the sweep: predictive headroom's cost against strict on ``morning-ramp``.

Every row runs one trace three ways: ``strict``, ``fairgate`` with headroom off, and ``fairgate`` as
configured (headroom on); ``spread_rows`` varies the scenario, ``curve_rows`` the headroom setting.
What each row varies and the targets: docs/simulator.md.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable
from pathlib import Path

from sim.metrics import percentile
from sim.scenario import scenario_from_dict
from sim.simulation import Simulation, simulate
from sim.sweep.admission import Change, Raw, equal_shares, service, slots, split_bursts

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "morning-ramp.json"
START, END = "<!-- sim.sweep.headroom: start -->", "<!-- sim.sweep.headroom: end -->"
MARKERS = (START, END)
P95_MS, P99_MS, BATCH_COST = 300, 1000, 0.10
THREE_WAYS = (
    "Every row runs the same trace three ways: ``strict`` (the baseline of the targets), ``fairgate`` "
    "with headroom off, and ``fairgate`` as configured (headroom on). Targets, on the headroom run: "
    "interactive p95 wait <= 300 ms, p99 <= 1 s, no interactive ``queue_timeout``; BATCH median wait at "
    "most 10 % above strict's on the same trace; every admitted BATCH request dispatched within its SLA."
)


def headroom(**values: object) -> Change:
    def change(raw: Raw) -> Raw:
        config = raw["config"]
        return {**raw, "config": {**config, "headroom": {**config.get("headroom", {}), **values}}}

    return change


def one_morning(raw: Raw) -> Raw:
    return {**raw, "generators": [{**g, "repeat": 1} for g in raw["generators"]]}


def late_burst(raw: Raw) -> Raw:
    """The finance burst at 08:20 (an hour later), onto a pool that chat (~1.2/s) uses and BATCH does not fill."""
    gens = [{**g, "at_ms": g["at_ms"] + 3_600_000} if g["kind"] == "burst" else g for g in raw["generators"]]
    return {**raw, "generators": gens}


CHANGES: tuple[tuple[str, Change | None], ...] = (
    ("slots x0.75", slots(0.75)),
    ("slots x1.5", slots(1.5)),
    ("service x0.8", service(0.8)),
    ("service x1.25", service(1.25)),
    ("batch over 3 tenants", split_bursts),
    ("equal shares", equal_shares),
    ("one morning (no profile)", one_morning),
    ("recent rate only", headroom(profile_weight=0.0)),
    ("profile only", headroom(profile_weight=1.0)),
    ("batch burst at 08:20", late_burst),
    ("batch burst at 08:20, hold_idle off", lambda raw: headroom(hold_idle=False)(late_burst(raw))),
    ("batch burst at 08:20, miss_share off", lambda raw: headroom(miss_share=0.0)(late_burst(raw))),
    ("rescue off", headroom(rescue_ms=0)),
    ("rescue off, miss_share 0.01", headroom(rescue_ms=0, miss_share=0.01)),
    ("batch burst at 08:20, rescue off", lambda raw: headroom(rescue_ms=0)(late_burst(raw))),
    (
        "batch burst at 08:20, rescue off, miss_share 0.01",
        lambda raw: headroom(rescue_ms=0, miss_share=0.01)(late_burst(raw)),
    ),
)
CURVE: tuple[dict[str, object], ...] = (
    {"max_slots": 1, "hold_ms": 2000},
    {"max_slots": 2, "hold_ms": 4000},
    {"max_slots": 4, "hold_ms": 4000},
    {"max_slots": 4, "hold_ms": 8000},
    {"max_slots": 6, "hold_ms": 8000},
    {"max_slots": 6, "hold_ms": 8000, "horizon_ms": 2000},
    {"max_slots": 8, "hold_ms": 16000},
    {"max_slots": 10, "hold_ms": 16000, "horizon_ms": 6000},
    {"max_slots": 12, "hold_ms": 16000, "horizon_ms": 8000},
    {"miss_share": 0.0},
    {"miss_share": 0.005},
    {"miss_share": 0.01},
    {"miss_share": 0.02},
    {"miss_share": 0.05},
    {"rescue_ms": 0},
    {"rescue_ms": 500},
    {"rescue_ms": 1000},
)


# --- running ---------------------------------------------------------------------------------


def measure(sim: Simulation) -> dict:
    inter, batch = sim.classes[sim.interactive], sim.classes[sim.batch]
    waits, batch_waits = sorted(inter.waits), sorted(batch.waits)
    return {
        "p95_ms": percentile(waits, 95),
        "p99_ms": percentile(waits, 99),
        "timeouts": inter.queue_timeout,
        "interactive": inter.arrived,
        "batch_median_ms": percentile(batch_waits, 50),
        "batch_mean_ms": sum(batch_waits) / max(1, len(batch_waits)),
        "batch_admitted": batch.admitted,
        "batch_within": batch.completed_within_sla,
        "batch_requests": len(batch_waits),
        "held_slot_s": round(sim.sched.held_slot_ms / 1000, 1),
    }


class Traced(Simulation):
    """The simulation, noting the engine's headroom state at every interactive ``queue_timeout``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.timeout_states: list[dict] = []

    def on_expire(self, t_ms: int) -> None:
        before = self.classes[self.interactive].queue_timeout
        super().on_expire(t_ms)
        if self.classes[self.interactive].queue_timeout > before:
            sched = self.sched
            chat = sum(1 for r in sched.waiting() if r.cls == self.interactive)
            self.timeout_states.append(
                {
                    "t_ms": t_ms,
                    "need": sched.headroom_need(now_ms=t_ms),
                    "holds": len(sched.headroom_holds()),
                    "chat_waiting": chat,
                }
            )


def run(raw: Raw, *, policy: str, seed: int) -> dict:
    scenario = scenario_from_dict(raw, base=SCENARIO.parent, seed=seed)
    if policy != "fairgate":
        return measure(simulate(scenario, policy=policy))
    sim = Traced(scenario, policy=policy)
    sim.run()
    return {**measure(sim), "timeout_states": sim.timeout_states}


def triple(raw: Raw, seed: int) -> dict:
    """strict, fairgate without headroom, fairgate as configured, on one trace."""
    return {
        "strict": run(raw, policy="strict", seed=seed),
        "off": run(headroom(enabled=False)(raw), policy="fairgate", seed=seed),
        "on": run(raw, policy="fairgate", seed=seed),
    }


def ramp_checks(on: dict, strict: dict) -> tuple[float, dict[str, bool]]:
    """The ramp's targets on a headroom run against strict's of the same trace: (BATCH median cost, checks)."""
    cost = on["batch_median_ms"] / strict["batch_median_ms"] - 1 if strict["batch_median_ms"] else 0.0
    return cost, {
        "p95": on["p95_ms"] <= P95_MS,
        "p99": on["p99_ms"] <= P99_MS,
        "timeouts": on["timeouts"] == 0,
        "batch cost": cost <= BATCH_COST,
    }


def verdict(row: dict) -> dict:
    on = row["on"]
    cost, checks = ramp_checks(on, row["strict"])
    checks["batch SLA"] = on["batch_within"] == on["batch_admitted"]
    return {"cost": cost, "checks": checks, "met": all(checks.values())}


def _spread_row(label: str, seed: int) -> dict:
    change = dict(CHANGES).get(label)
    base = json.loads(SCENARIO.read_text(encoding="utf-8"))
    raw = base if change is None else change(base)
    return {"label": label, "seed": seed, **triple(raw, seed)}


def _curve_row(index: int, seed: int) -> dict:
    setting = CURVE[index]
    raw = headroom(**setting)(json.loads(SCENARIO.read_text(encoding="utf-8")))
    return {
        "setting": setting,
        "seed": seed,
        "strict": run(raw, policy="strict", seed=seed),
        "on": run(raw, policy="fairgate", seed=seed),
    }


def _rows(work: Callable[..., dict], jobs: list[tuple], processes: int, log: Callable[[str], None]) -> list[dict]:
    """``work(*job)`` for each job, in the jobs' order; in ``processes`` worker processes when more
    than one (each run is a deterministic simulation, so the rows are the same either way)."""
    for job in jobs:
        log(f"{work.__name__.strip('_')} {job}")
    if processes <= 1:
        return [work(*job) for job in jobs]
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        return pool.starmap(work, jobs)


def spread_rows(seeds: tuple[int, ...], log: Callable[[str], None], processes: int = 1) -> list[dict]:
    jobs = [
        (label, seed)
        for label, change in (("as shipped", None), *CHANGES)
        for seed in (seeds if change is None else seeds[:3])
    ]
    return _rows(_spread_row, jobs, processes, log)


def curve_rows(seeds: tuple[int, ...], log: Callable[[str], None], processes: int = 1) -> list[dict]:
    jobs = [(index, seed) for index in range(len(CURVE)) for seed in seeds]
    return _rows(_curve_row, jobs, processes, log)


# --- rendering -------------------------------------------------------------------------------


def _ms(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:,.0f}" if low == high else f"{low:,.0f}-{high:,.0f}"


def _pct(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:+.1%}" if low == high else f"{low:+.1%} to {high:+.1%}"


def spread_table(rows: list[dict]) -> str:
    lines = [
        "| run | seeds | interactive p95 ms: strict / off / **on** | p99 ms: strict / **on** | "
        "timeouts: strict / off / **on** | BATCH median vs strict | BATCH mean vs strict | BATCH within SLA | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label in dict.fromkeys(r["label"] for r in rows):
        group = [r for r in rows if r["label"] == label]
        verdicts = [verdict(r) for r in group]

        def pick(way: str, key: str, group: list[dict] = group) -> list[float]:
            return [r[way][key] for r in group]

        within = sum(pick("on", "batch_within")) / max(1, sum(pick("on", "batch_admitted")))
        met = sum(v["met"] for v in verdicts)
        missed = sorted({k for v in verdicts for k, ok in v["checks"].items() if not ok})
        lines.append(
            f"| {label} | {','.join(str(r['seed']) for r in group)} | {_ms(pick('strict', 'p95_ms'))} / "
            f"{_ms(pick('off', 'p95_ms'))} / **{_ms(pick('on', 'p95_ms'))}** | {_ms(pick('strict', 'p99_ms'))} / "
            f"**{_ms(pick('on', 'p99_ms'))}** | {_ms(pick('strict', 'timeouts'))} / {_ms(pick('off', 'timeouts'))} / "
            f"**{_ms(pick('on', 'timeouts'))}** | {_pct([v['cost'] for v in verdicts])} | "
            f"{_pct([r['on']['batch_mean_ms'] / r['strict']['batch_mean_ms'] - 1 for r in group])} | {within:.2%} | "
            f"{met}/{len(group)}{' (missed: ' + ', '.join(missed) + ')' if missed else ''} |"
        )
    return "\n".join(lines)


def curve_table(rows: list[dict]) -> str:
    lines = [
        "| headroom setting | interactive p95 ms | p99 ms | timeouts | BATCH median vs strict | BATCH mean vs strict "
        "| held idle, slot-s per BATCH request |",
        "|---|---|---|---|---|---|---|",
    ]
    for setting in CURVE:
        group = [r for r in rows if r["setting"] == setting]
        if not group:
            continue
        on = [r["on"] for r in group]
        cost = [r["on"]["batch_median_ms"] / r["strict"]["batch_median_ms"] - 1 for r in group]
        mean_cost = [r["on"]["batch_mean_ms"] / r["strict"]["batch_mean_ms"] - 1 for r in group]
        idle = [o["held_slot_s"] / max(1, o["batch_requests"]) for o in on]
        text = ", ".join(f"{k} {v}" for k, v in setting.items())
        lines.append(
            f"| {text} | {_ms([o['p95_ms'] for o in on])} | {_ms([o['p99_ms'] for o in on])} | "
            f"{_ms([o['timeouts'] for o in on])} | {_pct(cost)} | {_pct(mean_cost)} | {min(idle):.3f}-{max(idle):.3f} |"
        )
    return "\n".join(lines)


def timeout_notes(rows: list[dict]) -> list[str]:
    """Where each interactive timeout of a headroom run came from: the engine's need, holds and queue."""
    lines = []
    for r in rows:
        states = r["on"].get("timeout_states") or []
        if not states:
            continue
        where = "; ".join(
            f"{s['t_ms'] % 86_400_000 / 3_600_000:.2f} h: need {s['need']}, holds {s['holds']}, "
            f"{s['chat_waiting']} chat waiting"
            for s in states
        )
        lines.append(f"- {r['label']} / seed {r['seed']}: {where}")
    if not lines:
        return []
    return [
        "Interactive timeouts with headroom on (hours into their morning, and the engine's state as each expired):",
        "",
        *lines,
        "",
    ]


WHY = (
    "Why (the engine's holds traced on `batch burst at 08:20`, seed 1, before the rescue): BATCH pays for the "
    "size of the stock of held slots at the peak, not for how long a hold lasts nor for holds while chat is "
    "far. With horizon_ms 6000, max_slots 10 and no turnover bound the need sat at 10 through the peak and "
    "8.3-8.8 slots stood held on average (17-18% of the 48), each until a chat took it; 10,582 holds were "
    "used, 97 ended unused and 49 were released (so `hold_ms` is not the cost): +14.6% to +14.7% BATCH median "
    "there. `miss_share` bounds the stock by the pool's turnover (a pool that frees slots fast refills a few "
    "holds before the next chats come). With `miss_share` 0.01 and no rescue, one timeout was left in each of "
    "three runs (recent rate only seed 2, profile only seed 1, 08:20 seed 2; the row *08:20, rescue off, "
    "miss_share 0.01* shows the last), at the peak with the holds used up and 3-7 chats waiting: a run of "
    "arrivals beyond the stock, served behind other tenants' newer requests by the fair order inside "
    "INTERACTIVE. The deadline rescue (`rescue_ms` 1500, half the chat SLA, where aging starts to lift) "
    "serves a chat within 1.5 s of its deadline before that order, earliest deadline first: those timeouts "
    "go, and *off* (headroom off, rescue on) falls from 74-99 timeouts to about strict's. A run that no "
    "longer loses its oldest chat to the fair order needs a smaller stock for the same misses, so `miss_share` "
    "went from 0.01 to 0.015: the 08:20 BATCH median cost falls under the target (+10.2% to +10.4% before). "
    "Tried on the worst rows before it was kept: with the rescue at 1000 ms, `miss_share` 0.02 let 1-2 "
    "timeouts back at slots x0.75 seed 2 and service x1.25 seed 1, and 0.015 one at profile only seed 1 "
    "(none at 1500). The rescue is what lets the bound loosen: the *rescue off* rows keep 0 timeouts with "
    "0.015 on the shipped and 08:20 traces, but without the rescue 0.015 let 2 through at profile only seed 1 "
    "(a single run, rescue_ms 0) and one at slots x0.75 seeds 1 and 3 (the previous report). With "
    "`hold_idle` off, the 08:20 burst's first second has its timeouts again (need 6, no hold yet, "
    "every slot just taken by BATCH: the rescue cannot help while nothing frees)."
)


def render(data: dict) -> str:
    return "\n".join(
        [
            START,
            "## Predictive headroom on `morning-ramp` (`python -m sim.sweep --headroom`)",
            "",
            THREE_WAYS,
            "",
            "### Spread (strict / fairgate with headroom off / **on**)",
            "",
            "How to read it: *off* is fairgate with headroom off but the deadline rescue on (`rescue_ms` works "
            "without `enabled`); without the rescue it had several times strict's interactive 504s, fair sharing "
            "inside INTERACTIVE serving other tenants' newer requests before a busy tenant's oldest (by design, "
            "see `scheduling/engine/dispatching.py`; the *rescue off* rows' off column); holds remove the wait "
            "that causes them. The BATCH median is "
            "reached before the ramp's peak, where most slot-time is held, so it moves little; the mean counts "
            "the BATCH requests dispatched during the peak and shows the cost in full (compare the held idle "
            "slot-seconds in the trade-off table). A miss is named in the last column.",
            "",
            spread_table(data["spread"]),
            "",
            *timeout_notes(data["spread"]),
            WHY,
            "",
            "### Trade-off: headroom setting vs interactive wait vs batch cost (fairgate, seeds "
            + ",".join(str(s) for s in sorted({r["seed"] for r in data["curve"]}))
            + ")",
            "",
            curve_table(data["curve"]),
            "",
            END,
        ]
    )

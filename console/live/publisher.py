"""The console's publisher: one task beside the dispatcher, on its event loop.

Every ``tick_ms`` it sends each watched tenant whose queue changed ONE message (a snapshot and the
committed database events of that tick), batch cards once a second where they changed, operations
figures to admins every ``ops_ms`` and a timeline point every ``sample_ms``. Database events come
from console.live.hooks after their commit. A tenant nobody watches costs nothing per tick. It
ends once its dispatcher has stopped. Why polling here: docs/architecture.md, "Live events".
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

import events
from console.live import db
from console.live.groups import ADMIN_GROUP, FINANCE_GROUP, tenant_group
from console.live.jobs import JobMoney, batch_forecasts, job_cards, job_tallies
from console.live.snapshot import OpsView, queue_signature, shown_ids, tenant_queue, timeline_sample
from console.live.timeline import Timeline
from gateway.api import current, log_failure

log = logging.getLogger(__name__)
HOLD_CACHE_MAX = 200_000
BUDGET_EVERY_MS = 2_000
BATCHES_EVERY_MS = 1_000
EVENT_KINDS = ("charges", "downgrades", "alerts")
MONEY_EVENTS = ("charge", "alert")  # live event kinds finance hears of
# Rare events sent to their tenant's group whether or not a socket of this process watches it: a
# viewer served by another gateway process hears of them too (charges go only where watched).
WIDE_EVENTS = frozenset({"alert", "downgrade"})
WIDE_ROWS = frozenset({"alerts", "downgrades"})


def wall_ms() -> int:
    return int(time.time() * 1000)


def dumps(payload: dict | list) -> str:
    return json.dumps(payload, separators=(",", ":"), default=str)


class Publisher:
    def __init__(self, *, layer=None, tick_ms: int = 300, ops_ms: int = 2_000, sample_ms: int = 5_000) -> None:
        self.layer = layer or get_channel_layer()
        self.tick_ms, self.ops_ms, self.sample_ms = tick_ms, ops_ms, sample_ms
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pending: dict[int, dict[str, list]] = {}  # tenant id -> kind -> rows
        self.finance_pending: set[int] = set()
        self.signatures: dict[str, tuple] = {}
        self.tenant_ids: dict[str, int] = {}
        self.slugs: dict[int, str] = {}
        self.holds: dict[str, str | None] = {}  # "<slug>/<id>" -> held amount
        self.watched: Counter[int] = Counter()  # tenant id -> sockets of this process on its group
        self.budget_due: set[int] = set()
        self.budget_at_ms: dict[int, int] = {}
        self.batch_signatures: dict[int, str] = {}  # tenant id -> its batch cards as last sent
        self.job_signatures: dict[int, str] = {}  # tenant id -> its job cards as last sent
        self.job_money = JobMoney()
        self._next_batches_ms = 0
        self.timeline = Timeline(step_ms=sample_ms)
        self.ops = OpsView()
        self.ops_text: str | None = None
        self._hist: list[int] | None = None
        self._next_ops_ms = self._next_sample_ms = 0
        self.sent = 0
        self.tick_cost_ms = 0.0  # the last tick's duration (shown to admins; a tick awaits the database)

    # --- input ---------------------------------------------------------------------------

    def watch(self, tenant_id: int) -> None:
        """A socket joined ``tenant_id``'s group: its table is published from the next tick."""
        self.watched[tenant_id] += 1
        self.budget_due.add(tenant_id)
        self.batch_signatures.pop(tenant_id, None)  # its batch cards go out again, to the new socket too
        self.job_signatures.pop(tenant_id, None)

    def unwatch(self, tenant_id: int) -> None:
        self.watched[tenant_id] -= 1
        if self.watched[tenant_id] <= 0:
            del self.watched[tenant_id]
            self.signatures.pop(self.slugs.get(tenant_id, ""), None)
            self.batch_signatures.pop(tenant_id, None)
            self.job_signatures.pop(tenant_id, None)

    def notify_threadsafe(self, rows: list[dict]) -> None:
        """From any thread (after a commit): ``[{"kind": "charges"|"alerts"|"downgrades", "tenant_id", "row"}]``."""
        if rows and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.add_events, rows)

    def add_committed(self, committed: events.Committed, as_console_event) -> None:
        """On the publisher's own loop (a gateway sending what its billing worker committed): the
        events are unpacked and ``as_console_event(event)`` made only for the tenants watched here;
        finance hears of every tenant whose money moved."""
        for tenant_id, kind in committed.keys():
            if kind in MONEY_EVENTS:
                self.finance_pending.add(tenant_id)
            if tenant_id in self.watched or kind in WIDE_EVENTS:
                for event in committed.of((tenant_id, kind)):
                    console_event = as_console_event(event)
                    if console_event is not None:
                        self.add_event(console_event)

    def on_its_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def add_events(self, rows: list[dict]) -> None:
        for row in rows:
            self.add_event(row)

    def add_event(self, event: dict) -> None:
        tenant_id, money_moved = event["tenant_id"], event["kind"] in ("charges", "alerts")
        if money_moved:
            self.finance_pending.add(tenant_id)
        watched = tenant_id in self.watched
        if not watched and event["kind"] not in WIDE_ROWS:
            return
        self.pending.setdefault(tenant_id, {}).setdefault(event["kind"], []).append(event["row"])
        if money_moved and watched:
            self.budget_due.add(tenant_id)

    # --- the loop ------------------------------------------------------------------------

    async def run(self, current) -> None:
        """``current()`` returns the running dispatcher or None (``gateway.runtime.current``)."""
        self.loop = asyncio.get_running_loop()
        served = False
        while True:
            await asyncio.sleep(self.tick_ms / 1000)
            dispatcher = current()
            if dispatcher is None and served:
                return
            served = served or dispatcher is not None
            started_s = time.perf_counter()
            try:
                await self.tick(dispatcher, wall_ms())
                self.tick_cost_ms = round((time.perf_counter() - started_s) * 1000, 1)
            except Exception:  # a failed tick must not end live updates
                log_failure(log, "console publisher tick failed")

    async def tick(self, d, now_wall_ms: int) -> None:
        slugs = set(self.signatures) | (set(d.live) if d is not None else set())
        await self._learn(slugs)
        slugs = {s for s in slugs if self.tenant_ids.get(s) in self.watched}
        if d is not None and settings.FAIRGATE_BILLING:
            await self._fetch_holds(d, slugs)
        messages = self._tenant_messages(d, slugs) if d is not None else {}
        for tenant_id in list(self.pending):
            messages.setdefault(tenant_id, {"type": "update"})
        await self._add_budgets(messages, now_wall_ms)
        await self._add_batches(messages, now_wall_ms, d)
        for tenant_id, payload in messages.items():
            payload.update(self._take_events(tenant_id))
            await self._send(tenant_group(tenant_id), "tenant.update", payload)
        if self.finance_pending:
            tenants = sorted(self.slugs.get(t, str(t)) for t in self.finance_pending)
            self.finance_pending.clear()
            await self._send(FINANCE_GROUP, "finance.update", {"type": "finance", "tenants": tenants})
        if d is not None:
            await self._ops(d, now_wall_ms)

    # --- tenants -------------------------------------------------------------------------

    async def _learn(self, slugs: set[str]) -> None:
        unknown = [s for s in slugs if s not in self.tenant_ids]
        if unknown:
            found = await sync_to_async(db.tenant_ids)(unknown)
            self.tenant_ids.update(found)
            self.slugs.update({v: k for k, v in found.items()})

    async def _fetch_holds(self, d, slugs: set[str]) -> None:
        wanted: dict[str, tuple[int, list[str]]] = {}
        for slug in slugs:
            missing = [i for i in shown_ids(d, slug) if f"{slug}/{i}" not in self.holds]
            if missing and slug in self.tenant_ids:
                wanted[slug] = (self.tenant_ids[slug], missing)
        if not wanted:
            return
        if len(self.holds) > HOLD_CACHE_MAX:
            self.holds.clear()
        found = await sync_to_async(db.holds_for)(wanted)
        for slug, (_, ids) in wanted.items():
            amounts = found.get(slug, {})
            for rid in ids:  # one not found is an early hold not booked yet (billing.client): asked again
                if rid in amounts:
                    self.holds[f"{slug}/{rid}"] = amounts[rid]

    def _tenant_messages(self, d, slugs: set[str]) -> dict[int, dict]:
        """Snapshots of the tenants whose table changed (built without awaiting: one engine state)."""
        now_ms = d.now_ms()
        out = {}
        for slug in slugs:
            tenant_id = self.tenant_ids.get(slug)
            if tenant_id is None:
                continue
            queue = self.queue_of(d, slug, now_ms)
            signature = queue_signature(queue)
            if self.signatures.get(slug) == signature:
                continue
            if queue["total"]:
                self.signatures[slug] = signature
            else:
                self.signatures.pop(slug, None)  # sent empty once; quiet until it has requests again
            out[tenant_id] = {"type": "update", "queue": queue}
        return out

    def queue_of(self, d, slug: str, now_ms: int) -> dict:
        queue = tenant_queue(d, slug, now_ms, _TenantHolds(self.holds, slug))
        queue["published_at_ms"] = wall_ms()
        return queue

    def _take_events(self, tenant_id: int) -> dict:
        events = self.pending.pop(tenant_id, {})
        slug = self.slugs.get(tenant_id, "")
        for row in events.get("charges", ()):
            row["request_id"] = row["request_id"].removeprefix(f"{slug}/")
        return {k: v for k, v in events.items() if v}

    async def _add_budgets(self, messages: dict[int, dict], now_wall_ms: int) -> None:
        self.budget_due &= self.watched.keys()
        due = [t for t in self.budget_due if now_wall_ms - self.budget_at_ms.get(t, 0) >= BUDGET_EVERY_MS]
        if not due:
            return
        budgets = await sync_to_async(db.budgets_for)(due)
        for tenant_id in due:
            self.budget_due.discard(tenant_id)
            self.budget_at_ms[tenant_id] = now_wall_ms
            if tenant_id in budgets:
                messages.setdefault(tenant_id, {"type": "update"})["budget"] = budgets[tenant_id]

    async def _add_batches(self, messages: dict[int, dict], now_wall_ms: int, d=None) -> None:
        """Every ``BATCHES_EVERY_MS``, the watched tenants' batch and job cards, sent where they changed."""
        if now_wall_ms < self._next_batches_ms or not self.watched:
            return
        self._next_batches_ms = now_wall_ms + BATCHES_EVERY_MS
        if d is not None:
            await self._add_jobs(messages, d)
        cards = await sync_to_async(db.batches_for)(list(self.watched))
        forecasts = {}
        if d is not None:
            now_ms = d.now_ms()
            forecasts = {t: batch_forecasts(d, self.slugs[t], now_ms) for t in self.watched if t in self.slugs}
        for tenant_id in list(self.watched):
            tenant_cards = cards.get(tenant_id, [])
            for card in tenant_cards:  # the engine's word on its waiting lines (console.live.jobs)
                card["engine_eta"] = forecasts.get(tenant_id, {}).get(card["id"])
            signature = dumps(tenant_cards)
            if self.batch_signatures.get(tenant_id, "[]") != signature:  # none and never any: nothing to send
                self.batch_signatures[tenant_id] = signature
                messages.setdefault(tenant_id, {"type": "update"})["batches"] = tenant_cards

    async def _add_jobs(self, messages: dict[int, dict], d) -> None:
        """The watched tenants' job cards (console.live.jobs), sent where they changed."""
        unknown = [t for t in self.watched if t not in self.slugs]
        if unknown:
            found = await sync_to_async(db.tenant_slugs)(unknown)
            self.slugs.update(found)
            self.tenant_ids.update({v: k for k, v in found.items()})
        for tenant_id in [t for t in self.watched if t in self.slugs]:
            cards = await self.jobs_now(d, tenant_id, self.slugs[tenant_id])
            signature = dumps(cards)
            if self.job_signatures.get(tenant_id, "[]") != signature:
                self.job_signatures[tenant_id] = signature
                messages.setdefault(tenant_id, {"type": "update"})["jobs"] = cards

    async def jobs_now(self, d, tenant_id: int, slug: str) -> list[dict]:
        """The tenant's job cards as they are now (also a new viewer's first update)."""
        tallies = job_tallies(d, slug, d.now_ms())
        return await sync_to_async(job_cards)(tallies, tenant_id=tenant_id, slug=slug, memo=self.job_money)

    # --- operations ----------------------------------------------------------------------

    async def _ops(self, d, now_wall_ms: int) -> None:
        if now_wall_ms >= self._next_sample_ms:
            self._next_sample_ms = now_wall_ms + self.sample_ms
            sample, self._hist = timeline_sample(d, wall_ms=now_wall_ms, previous_hist=self._hist)
            self.timeline.add(sample)
        if now_wall_ms >= self._next_ops_ms:
            self._next_ops_ms = now_wall_ms + self.ops_ms
            payload = {
                "type": "ops",
                **self.ops.build(d, wall_ms=now_wall_ms),
                "publisher_tick_ms": self.tick_cost_ms,
                "timeline": self.timeline.as_rows()[-3:],
                "at_ms": now_wall_ms,
            }
            self.ops_text = dumps({**payload, "timeline": self.timeline.as_rows()})
            await self._send(ADMIN_GROUP, "ops.update", payload)

    async def _send(self, group: str, kind: str, payload: dict) -> None:
        message: dict[str, object] = {"type": kind, "text": dumps(payload)}
        if "queue" in payload:
            message["ids"] = [r["id"] for r in payload["queue"]["rows"]]
        await self.layer.group_send(group, message)
        self.sent += 1


class _TenantHolds:
    """The hold cache seen as one tenant's ``public id -> amount`` mapping."""

    def __init__(self, holds: dict[str, str | None], slug: str) -> None:
        self.holds, self.prefix = holds, f"{slug}/"

    def get(self, public_id: str) -> str | None:
        return self.holds.get(self.prefix + public_id)


_publisher: Publisher | None = None


def publisher_current() -> Publisher | None:
    """The publisher of this process, if one runs on the current event loop."""
    publisher = _publisher
    if publisher is None or publisher.loop is None:
        return None
    try:
        return publisher if asyncio.get_running_loop() is publisher.loop else None
    except RuntimeError:
        return None


def publisher_running() -> Publisher | None:
    """The publisher of this process from any thread (for hooks that hand it events)."""
    publisher = _publisher
    if publisher is None or publisher.loop is None or publisher.loop.is_closed():
        return None
    return publisher


def console_live_start(**options) -> Publisher:
    """Start the publisher on the running loop (called once from the ASGI lifespan startup)."""
    global _publisher
    publisher = Publisher(**options)
    publisher.loop = asyncio.get_running_loop()
    _publisher = publisher
    task = publisher.loop.create_task(publisher.run(current), name="fairgate-console-publisher")
    task.add_done_callback(lambda _: _forget(publisher))
    return publisher


def _forget(publisher: Publisher) -> None:
    global _publisher
    if _publisher is publisher:
        _publisher = None

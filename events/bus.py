"""`publish_on_commit(kind, tenant_id, payload)`: the event is sent to the subscribers once the
transaction in progress commits (never if it rolls back), at once outside a transaction.
Payloads are plain data (msgpack: dicts, lists, strings, numbers, None).

In the gateway's billing worker (`relay`) committed events are kept instead of sent; each answer
carries them (`relayed`: msgpack, per tenant and kind) and the gateway sends them (`send`), where
its console watches. Why one path and where polling stays: docs/architecture.md, "Live events".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, KeysView
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgpack
from django.db import transaction

log = logging.getLogger(__name__)

Group = tuple[int, str]  # (tenant id, kind)


@dataclass(frozen=True)
class Event:
    kind: str
    tenant_id: int
    payload: dict[str, Any]


class Committed:
    """Committed events grouped by tenant and kind. Those relayed by a billing worker arrive packed
    and are unpacked only for the groups a subscriber asks for (`of`)."""

    def __init__(self, groups: dict[Group, list[Event] | bytes]) -> None:
        self.groups = groups

    @classmethod
    def of_events(cls, events: Iterable[Event]) -> Committed:
        groups: dict[Group, list[Event] | bytes] = {}
        for event in events:
            found = groups.setdefault((event.tenant_id, event.kind), [])
            assert isinstance(found, list)
            found.append(event)
        return cls(groups)

    def keys(self) -> KeysView[Group]:
        return self.groups.keys()

    def of(self, group: Group) -> list[Event]:
        events = self.groups[group]
        if isinstance(events, bytes):
            tenant_id, kind = group
            return [Event(kind, tenant_id, payload) for payload in msgpack.unpackb(events)]
        return events

    def packed(self) -> dict[Group, bytes]:
        return {
            group: events if isinstance(events, bytes) else msgpack.packb([e.payload for e in events])
            for group, events in self.groups.items()
        }

    def __iter__(self) -> Iterator[Event]:
        for group in self.groups:
            yield from self.of(group)

    def __bool__(self) -> bool:
        return bool(self.groups)


Subscriber = Callable[[Committed], None]
_subscribers: dict[str, Subscriber] = {}
_relayed: list[Event] | None = None  # in a billing worker: the committed events its next answer carries


def subscribe(uid: str, subscriber: Subscriber) -> None:
    """``subscriber(committed)`` for every committed batch of events in this process (once per uid)."""
    _subscribers[uid] = subscriber


def unsubscribe(uid: str) -> None:
    _subscribers.pop(uid, None)


def publish_on_commit(kind: str, tenant_id: int, payload: dict[str, Any]) -> None:
    """Send the event once the transaction in progress commits; outside one, now."""
    transaction.on_commit(partial(_committed, Event(kind, tenant_id, payload)))


def publish_all_on_commit(events: list[Event]) -> None:
    """`publish_on_commit` of each of ``events``, with one callback for all (a billing batch's charges)."""
    if events:
        transaction.on_commit(partial(_all_committed, events))


def _committed(event: Event) -> None:
    _all_committed([event])


def _all_committed(events: list[Event]) -> None:
    if _relayed is not None:
        _relayed.extend(events)
    else:
        send(Committed.of_events(events))


def send(committed: Committed | dict[Group, bytes]) -> None:
    """Committed events (or a billing worker's `relayed`) to the subscribers; a failing one is
    logged, never raised: the write has committed."""
    if not isinstance(committed, Committed):
        committed = Committed(dict(committed))
    if not committed:
        return
    for uid, subscriber in list(_subscribers.items()):
        try:
            subscriber(committed)
        except Exception:
            log.exception("live event subscriber %s failed", uid)


def relay() -> None:
    """In the gateway's billing worker: keep committed events for the answers (`relayed`)."""
    global _relayed
    _relayed = []


def relayed() -> dict[Group, bytes]:
    """The events kept since the last call, packed (empty outside a billing worker)."""
    if not _relayed:
        return {}
    packed = Committed.of_events(_relayed).packed()
    _relayed.clear()
    return packed

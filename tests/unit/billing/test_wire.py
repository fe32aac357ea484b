"""What crosses the billing worker's pipe pickles as tuples (billing.wire) and comes back equal,
with every field, the hold's room (not part of equality) too."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime
from decimal import Decimal

from billing.booking_asks import Charged, HoldAsk, ReleaseAsk, SettleAsk
from billing.inflight import HeldEntry

AT = datetime(2026, 12, 7, 14, 0, 0, 123456, tzinfo=UTC)
HELD = HeldEntry(
    "r-1", 3, 10, 11, "INTERACTIVE", 7, "m", Decimal("1.6"), Decimal("0.000210"), "gw:1", "fg_ab", "job-9", "ann",
    room=Decimal("12.500000"),
)  # fmt: skip


def _crossed(value):
    return pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))


def test_asks_and_results_cross_the_pipe_unchanged():
    asks = [
        HoldAsk(
            "r-1", "acme", "INTERACTIVE", "m", 120, 16, AT, True, "gw:1", AT, Decimal("0.5"), "fg_ab", "job-9", "ann"
        ),
        SettleAsk("r-1", "gpu-b", 12, 16, AT, Decimal("0.000044"), HELD),
        SettleAsk("r-2", "gpu-b", 1, 2, AT),
        ReleaseAsk("r-3", "cancelled", AT, HELD),
        Charged(Decimal("0.000070"), Decimal("0.000001")),
        HELD,
    ]
    back = _crossed(asks)
    assert back == asks
    assert [type(a) for a in back] == [type(a) for a in asks]
    assert [a._asdict() for a in back] == [a._asdict() for a in asks]  # every field, in order
    assert back[-1].room == Decimal("12.500000") and back[1].held.room == Decimal("12.500000")
    assert len(pickle.dumps(asks[0], pickle.HIGHEST_PROTOCOL)) < len(pickle.dumps(asks[0]._asdict()))


def test_a_hold_booked_under_another_key_keeps_its_fields():
    again = HELD.booked_as("r-1#2", Decimal("3"))
    assert again._asdict() == {**HELD._asdict(), "request_id": "r-1#2", "room": Decimal("3")}
    assert list(again._asdict()) == list(HELD._asdict())  # field order: what the wire sends
    assert _crossed(again) == again and _crossed(again).room == Decimal("3")


def test_the_room_is_not_part_of_a_held_entry():
    same = HELD.booked_as(HELD.request_id, None)
    assert same == HELD and hash(same) == hash(HELD) and not same != HELD
    assert HELD.booked_as("r-2") != HELD
    assert HELD != tuple(HELD)  # a held entry equals held entries only

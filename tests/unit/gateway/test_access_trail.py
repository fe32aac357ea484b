"""A request's trail (gateway.access): its traceparent, one log line and its series by tenant and
class, written once and only when the answer has ended and its charge is known."""

from __future__ import annotations

import asyncio
import json
import logging
from decimal import Decimal

import pytest

from billing.booking_asks import Charged
from gateway import metrics
from gateway.access import ACCESS_LOG, Trail, traceparent_of
from gateway.errors import ErrorCode

GIVEN = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "given",
    [None, "", "junk", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", f"00-{'0' * 32}-00f067aa0ba902b7-01"],
)
def test_a_traceparent_is_made_when_none_valid_came(given):
    made = traceparent_of(given)
    assert made != given and len(made) == 55 and made.startswith("00-") and made.endswith("-01")
    assert traceparent_of(None) != made  # a new trace each time


def test_a_valid_traceparent_is_passed_on():
    assert traceparent_of(GIVEN) == GIVEN


def _sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def lines(settings, caplog):
    settings.FAIRGATE_ACCESS_LOG = True
    caplog.set_level(logging.INFO, logger=ACCESS_LOG.name)
    ACCESS_LOG.propagate = True  # caplog listens at the root
    yield lambda: [json.loads(r.message) for r in caplog.records if r.name == ACCESS_LOG.name]
    ACCESS_LOG.propagate = False


def test_a_served_request_is_written_once_its_charge_is_booked(lines):
    async def scenario() -> None:
        settlement = asyncio.get_running_loop().create_future()
        trail = Trail(started_s=0.0, traceparent=GIVEN)
        trail.asked(request_id="r1", tenant="t-acct", cls="C-unit", model="m")
        trail.first_token()
        trail.finished(
            cls="C-unit", backend="b", outcome="completed", waited_ms=12, usage=(7, 5), settlement=settlement
        )
        trail.close(200)
        assert (
            lines() == []
            and _sample("fairgate_requests_total", tenant="t-acct", cls="C-unit", outcome="completed") == 0
        )
        settlement.set_result(Charged(Decimal("0.25")))
        await asyncio.sleep(0)
        trail.close(500)  # once only

    asyncio.run(scenario())
    [line] = lines()
    assert line["request_id"] == "r1" and line["tenant"] == "t-acct" and line["class"] == "C-unit"
    assert line["status"] == 200 and line["outcome"] == "completed" and line["charge"] == "0.25"
    assert line["queue_wait_ms"] == 12 and line["prompt_tokens"] == 7 and line["completion_tokens"] == 5
    assert line["trace_id"] == GIVEN[3:35] and line["ttft_ms"] is not None and line["total_ms"] is not None
    labels = {"tenant": "t-acct", "cls": "C-unit"}
    assert _sample("fairgate_requests_total", outcome="completed", **labels) == 1
    assert _sample("fairgate_tokens_total", kind="prompt", **labels) == 7
    assert _sample("fairgate_tokens_total", kind="completion", **labels) == 5
    assert _sample("fairgate_spend_total", **labels) == 0.25
    assert _sample("fairgate_time_to_first_token_seconds_count", **labels) == 1


def test_a_request_refused_before_its_tenant_is_known_makes_no_series(lines):
    before = len(list(metrics.REQUESTS.collect())[0].samples)
    trail = Trail(started_s=0.0, traceparent=GIVEN)
    trail.close(401, ErrorCode.INVALID_API_KEY)
    [line] = lines()
    assert line["status"] == 401 and line["outcome"] == "invalid_api_key" and line["tenant"] is None
    assert len(list(metrics.REQUESTS.collect())[0].samples) == before


def test_no_line_when_switched_off(lines, settings):
    settings.FAIRGATE_ACCESS_LOG = False
    Trail(started_s=0.0, traceparent=GIVEN).close(400, ErrorCode.INVALID_REQUEST)
    assert lines() == []

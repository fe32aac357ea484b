"""Money on the live path: a hold bounds its charge whatever the backend counts, absurd limits are
refused before anything is held, an id whose request ended unserved may be sent again, and every
answer names its request. Real `serve`, simulated backends, the official openai SDK."""

from __future__ import annotations

import json
from decimal import Decimal

import httpx
import openai
import pytest

from bench.launch import free_port
from simbackend import SimConfig, start_in_thread
from tests.support.livestack import start_gateway, wait_for
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live


KEYS = {"edge": ("edge", "BATCH"), "ample": ("ample", "INTERACTIVE")}
BUDGETS = """
import json
from billing.models import Budget
print(json.dumps([[str(b.spent), str(b.held), str(b.limit)] for b in Budget.objects.filter(tenant__slug={slug!r})]))
"""
LEDGER = """
import json
from billing.models import LedgerEntry
rows = LedgerEntry.objects.filter(request_id__startswith={rid!r}).order_by("pk")
print(json.dumps([[e.request_id, e.kind, str(e.amount), str(e.unbilled)] for e in rows]))
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # another tokenizer (counts 3x its own estimate) and a backend that ignores max_tokens (+300)
    greedy = start_in_thread(
        SimConfig(
            port=0,
            slots=2,
            ttft_ms=1,
            tokens_per_s=100_000,
            seed=5,
            prompt_token_factor=3.0,
            extra_completion_tokens=300,
        )
    )
    honest = start_in_thread(SimConfig(port=0, slots=2, ttft_ms=1, tokens_per_s=100_000, seed=6))
    later_port = free_port()  # nothing listens there until a test starts a backend on it
    yaml = scheduler_yaml(
        tenants=[tenant("edge", budget=0.5), tenant("ample")],
        backends=[
            backend("greedy", f"{greedy.url}/v1", input_per_1k=0.001, output_per_1k=0.002),
            backend("honest", f"{honest.url}/v1", models=["clean"]),
            backend("later", f"http://127.0.0.1:{later_port}/v1", models=["later"]),
        ],
    )
    gateway = start_gateway(
        tmp_path_factory.mktemp("gw-money"),
        yaml,
        KEYS,
        FAIRGATE_MODEL_OUTPUT_LIMITS="m=40/1000,clean=40/1000,later=40/1000",
        FAIRGATE_MAX_N="4",
        FAIRGATE_CIRCUIT_FAILURES="100",
    )
    gateway.extra["later_port"] = later_port
    yield gateway
    gateway.stop()
    greedy.stop()
    honest.stop()


def budgets(gateway, slug: str) -> list[tuple[Decimal, Decimal, Decimal]]:
    rows = json.loads(gateway.shell(BUDGETS.format(slug=slug)).strip())
    return [(Decimal(spent), Decimal(held), Decimal(limit)) for spent, held, limit in rows]


def ledger(gateway, request_id: str) -> list[list[str]]:
    return json.loads(gateway.shell(LEDGER.format(rid=request_id)).strip())


def test_no_budget_is_overspent_by_a_tokenizer_that_counts_more_than_the_estimate(stack):
    client = stack.sdk("edge")
    statuses = []
    for index in range(6):  # each holds about 0.14 of the 0.5 budget: some fit, then 402
        try:
            client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "a" * 200_000}],
                max_tokens=20,
                extra_headers={"X-Request-Id": f"long-{index}"},
            )
            statuses.append(200)
        except openai.APIStatusError as err:
            statuses.append(err.status_code)
        for spent, held, limit in budgets(stack, "edge"):
            assert spent + held <= limit, (statuses, spent, held, limit)
    assert 200 in statuses and statuses[-1] == 402
    stack.manage("ledger", "verify")  # recomputes every balance; exits non-zero on a mismatch


def test_output_beyond_the_limit_is_not_charged_but_recorded_as_unbilled(stack):
    raw = stack.sdk("ample").chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=10,
        extra_headers={"X-Request-Id": "greedy-1"},
    )
    assert raw.parse().usage.completion_tokens == 310  # the backend ignored the limit
    rows = wait_for(  # booked just after the answer
        lambda: ledger(stack, "ample/greedy-1"),
        lambda rows: any(kind == "charge" for _, kind, _, _ in rows),
        what="greedy-1 settled",
    )
    entries = {kind: (Decimal(amount), Decimal(unbilled)) for _, kind, amount, unbilled in rows}
    assert entries["charge"][0] == entries["hold"][0] == Decimal(raw.headers["X-Charge"])  # capped at the hold
    assert entries["charge"][1] > 0
    assert stack.metric("fairgate_billing_unbilled_total") > 0


def test_absurd_output_limits_and_choices_are_refused_before_anything_is_held(stack):
    client = stack.sdk("ample")
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(
            model="clean",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=1_000_000_000,
            extra_headers={"X-Request-Id": "absurd-1"},
        )
    assert "at most 1000" in too_long.value.message and "max_tokens" in too_long.value.message
    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(
            model="clean",
            messages=[{"role": "user", "content": "hi"}],
            n=1_000_000,
            extra_headers={"X-Request-Id": "absurd-2"},
        )
    assert "'n' is at most 4" in too_many.value.message
    assert ledger(stack, "ample/absurd-") == []


def test_a_request_without_an_output_limit_goes_upstream_with_the_models_default(stack):
    plain = stack.sdk("ample").chat.completions.create(model="clean", messages=[{"role": "user", "content": "hi"}])
    assert plain.usage.completion_tokens == 40  # the model's default here; the simulator's own is 64
    asked = stack.sdk("ample").chat.completions.create(
        model="clean", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=7, max_tokens=9
    )
    assert asked.usage.completion_tokens == 7  # the smaller of the two the client named


def test_an_id_whose_request_ended_unserved_may_be_sent_again_and_a_served_one_may_not(stack):
    client = stack.sdk("ample")

    def ask():
        return client.chat.completions.with_raw_response.create(
            model="later",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            extra_headers={"X-Request-Id": "again-1"},
        )

    with pytest.raises(openai.APIStatusError) as failed:  # its backend is not up yet: 502, nothing served
        ask()
    assert failed.value.status_code == 502
    later = start_in_thread(SimConfig(port=stack.extra["later_port"], slots=2, ttft_ms=1, tokens_per_s=100_000))
    try:
        served = ask()
        assert served.headers["X-Request-Id"] == "again-1" and Decimal(served.headers["X-Charge"]) > 0
        with pytest.raises(openai.BadRequestError) as reused:
            ask()
        assert "served" in reused.value.message and reused.value.response.headers["X-Request-Id"] == "again-1"
    finally:
        later.stop()
    kinds = wait_for(  # the billing worker books the served one's charge in its own time
        lambda: [(rid, kind) for rid, kind, _, _ in ledger(stack, "ample/again-1")],
        lambda found: len(found) >= 5,
        what="both requests' ledger entries booked",
        limit_s=30,
    )
    assert sorted(kinds) == sorted(
        [
            ("ample/again-1", "hold"),
            ("ample/again-1", "release"),
            ("ample/again-1#2", "hold"),
            ("ample/again-1#2", "release"),
            ("ample/again-1#2", "charge"),
        ]
    )


@pytest.mark.parametrize(
    "key, body, status",
    [
        ("not-a-key", {"model": "clean", "messages": [{"role": "user", "content": "hi"}]}, 401),
        ("ample", {"model": "clean", "messages": []}, 400),
        ("edge", {"model": "clean", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000}, 402),
    ],
)
def test_every_refusal_names_its_request(stack, key, body, status):
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        response = http.post(
            "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {stack.keys.get(key, key)}", "X-Request-Id": "named-1"},
        )
    assert response.status_code == status
    assert response.headers["X-Request-Id"] == "named-1"


def test_a_refusal_before_intake_names_its_request_too(stack):
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        response = http.get("/v1/chat/completions", headers={"X-Request-Id": "named-2"})  # wrong method
    assert response.status_code == 405 and response.headers["X-Request-Id"] == "named-2"

"""POST /v1/embeddings through the real gateway: the official openai SDK's
``client.embeddings.create`` unchanged, scheduled in the caller's class, held and charged for its
input alone at the class's price, and refused like any request (wrong endpoint for the model, a
malformed input, a budget that cannot hold it) before anything is held."""

from __future__ import annotations

import json
from decimal import Decimal

import openai
import pytest

from simbackend import SimConfig, start_in_thread
from tests.support.livestack import start_gateway, wait_for
from tests.support.scheduler_yaml import CLASSES, backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live

KEYS = {"docs": ("docs", "INTERACTIVE"), "poor": ("poor", "INTERACTIVE")}
INPUT_PER_1K = 1
LEDGER = """
import json
from billing.models import LedgerEntry
rows = LedgerEntry.objects.filter(request_id={rid!r}).order_by("pk")
print(json.dumps([[e.kind, str(e.amount), e.prompt_tokens, e.completion_tokens] for e in rows]))
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    sim = start_in_thread(SimConfig(port=0, slots=2, ttft_ms=2, tokens_per_s=5000, seed=5))
    spec = backend("embedder", f"{sim.url}/v1", models=("chat-m", "embed-m"), input_per_1k=INPUT_PER_1K)
    spec["embedding_models"] = ["embed-m"]
    yaml = scheduler_yaml(
        classes=["INTERACTIVE", "NEAR_RT", "BATCH", "RETRY"],
        tenants=[tenant("docs", share=0.5), tenant("poor", budget=0.000001, share=0.1)],
        backends=[spec],
    )
    running = start_gateway(tmp_path_factory.mktemp("gw-embeddings"), yaml, KEYS)
    yield running
    running.stop()
    sim.stop()


def ledger(gateway, tenant: str, public_id: str) -> list[list]:
    return json.loads(gateway.shell(LEDGER.format(rid=f"{tenant}/{public_id}")).strip())


def charge_of(prompt_tokens: int, cls: str) -> Decimal:
    factor = Decimal(str(CLASSES[cls][2]))
    return (Decimal(prompt_tokens) * INPUT_PER_1K / 1000 * factor).quantize(Decimal("0.000001"))


def test_the_sdk_gets_its_vectors_and_is_charged_for_the_input_alone(gateway):
    raw = gateway.sdk("docs").embeddings.with_raw_response.create(
        model="embed-m", input=["quarterly report, page one", "page two"], extra_headers={"X-Request-Id": "emb-1"}
    )
    result = raw.parse()  # the SDK asks for base64 and decodes it to floats
    assert [item.index for item in result.data] == [0, 1]
    assert all(len(item.embedding) == 16 for item in result.data)
    assert result.data[0].embedding != result.data[1].embedding
    assert raw.headers["X-Priority-Class"] == "INTERACTIVE"
    assert Decimal(raw.headers["X-Charge"]) == charge_of(result.usage.prompt_tokens, "INTERACTIVE")
    rows = wait_for(
        lambda: ledger(gateway, "docs", "emb-1"),
        lambda found: any(kind == "charge" for kind, *_ in found),
        what="the embedding's charge booked",
    )
    charges = [row for row in rows if row[0] == "charge"]
    assert charges == [["charge", raw.headers["X-Charge"], result.usage.prompt_tokens, 0]]


def test_token_arrays_and_dimensions_pass_through_and_a_lower_class_pays_its_price(gateway):
    raw = gateway.sdk("docs").embeddings.with_raw_response.create(
        model="embed-m",
        input=[[101, 2023, 2003], [101, 102]],
        dimensions=4,
        encoding_format="float",
        extra_headers={"X-Priority-Class": "BATCH"},
    )
    result = raw.parse()
    assert [len(item.embedding) for item in result.data] == [4, 4]
    assert result.usage.prompt_tokens == 5  # the backend counts the token ids it got
    assert raw.headers["X-Priority-Class"] == "BATCH"
    assert Decimal(raw.headers["X-Charge"]) == charge_of(5, "BATCH")


def test_each_model_is_served_at_its_own_endpoint_only(gateway):
    sdk = gateway.sdk("docs")
    with pytest.raises(openai.BadRequestError) as chat_with_embedder:
        sdk.chat.completions.create(model="embed-m", messages=[{"role": "user", "content": "hi"}])
    assert "/v1/embeddings" in chat_with_embedder.value.message
    with pytest.raises(openai.BadRequestError) as embed_with_chat:
        sdk.embeddings.create(model="chat-m", input="hi", extra_headers={"X-Request-Id": "emb-wrong-model"})
    assert "embed-m" in embed_with_chat.value.message
    assert ledger(gateway, "docs", "emb-wrong-model") == []


@pytest.mark.parametrize(
    "body",
    [
        {"model": "embed-m", "input": []},
        {"model": "embed-m", "input": ""},
        {"model": "embed-m", "input": ["ok", ""]},
        {"model": "embed-m", "input": [1, "two"]},
        {"model": "embed-m", "input": "hi", "stream": True},
        {"model": "embed-m"},
    ],
)
def test_a_malformed_input_is_refused_before_anything_is_held(gateway, body):
    with gateway.http("docs") as http:
        response = http.post("/v1/embeddings", json=body, headers={"X-Request-Id": "emb-bad"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.headers["X-Request-Id"] == "emb-bad"
    assert ledger(gateway, "docs", "emb-bad") == []


def test_a_budget_that_cannot_hold_the_input_is_a_402(gateway):
    with pytest.raises(openai.APIStatusError) as refused:
        gateway.sdk("poor").embeddings.create(model="embed-m", input="a" * 2000)
    assert refused.value.status_code == 402
    assert refused.value.code == "budget_exhausted"

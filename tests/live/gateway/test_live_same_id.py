"""One X-Request-Id sent twice at once, as a hostile client would: one hold, one charge, and a
refusal that never touches the winner's hold. Pairs go to one gateway process and, split, to two
processes on one database. Real `serve`, a simulated backend, concurrent raw HTTP clients."""

from __future__ import annotations

import json
import threading
from decimal import Decimal

import httpx
import pytest

from simbackend import SimConfig, start_in_thread
from tests.support.livestack import another_process, start_gateway, wait_for
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live

PAIRS = 12
PROMPT = "word " * 14_600  # about 73 KB: tokenized in a thread, an await between the id's check and admission
LEDGER = """
import json
from billing.models import LedgerEntry
rows = LedgerEntry.objects.filter(request_id__startswith={prefix!r}).order_by("pk")
print(json.dumps([[e.request_id, e.kind, str(e.amount)] for e in rows]))
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    sim = start_in_thread(SimConfig(port=0, slots=8, ttft_ms=5, tokens_per_s=5_000, seed=11))
    yaml = scheduler_yaml(tenants=[tenant("acme")], backends=[backend("gpu", f"{sim.url}/v1", slots=8)])
    gateway = start_gateway(tmp_path_factory.mktemp("gw-same-id"), yaml, {"acme": ("acme", "INTERACTIVE")})
    other = another_process(gateway)
    yield gateway, other
    other.stop()
    gateway.stop()
    sim.stop()


def _send_pair(urls: tuple[str, str], key: str, request_id: str) -> list[httpx.Response]:
    """Both requests released at one barrier, each on a connection of its own."""
    barrier = threading.Barrier(2)
    answers: list[httpx.Response | None] = [None, None]
    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}

    def send(index: int) -> None:
        with httpx.Client(base_url=urls[index], timeout=60) as client:
            headers = {"Authorization": f"Bearer {key}", "X-Request-Id": request_id}
            barrier.wait()
            answers[index] = client.post("/v1/chat/completions", json=body, headers=headers)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


def _ledger(gateway, prefix: str) -> list[list[str]]:
    return json.loads(gateway.shell(LEDGER.format(prefix=prefix)).strip())


def _check_pairs(gateway, pairs: dict[str, list[httpx.Response]], prefix: str) -> None:
    served = {rid: [a for a in answers if a.status_code == 200] for rid, answers in pairs.items()}
    for rid, answers in pairs.items():
        codes = sorted(a.status_code for a in answers)
        assert codes in ([200, 400], [400, 400]), (rid, codes, [a.text for a in answers])
        refused = [a for a in answers if a.status_code == 400]
        assert all(a.json()["error"]["code"] == "invalid_request" for a in refused)
    charges_told = {rid: Decimal(a[0].headers["X-Charge"]) for rid, a in served.items() if a}
    assert charges_told, "no pair was served"
    rows = wait_for(
        lambda: _ledger(gateway, f"acme/{prefix}"),
        lambda rows: sum(kind == "charge" for _, kind, _ in rows) >= len(charges_told),
        what="every served request's charge booked",
        limit_s=60,
    )
    charges: dict[str, list[Decimal]] = {}
    for key, kind, amount in rows:
        if kind == "charge":
            charges.setdefault(key.split("/", 1)[1].split("#", 1)[0], []).append(Decimal(amount))
    assert {rid: [told] for rid, told in charges_told.items()} == charges  # served: charged once, as told
    gateway.manage("ledger", "verify")


def test_the_same_id_twice_at_once_in_one_process_is_served_once_and_charged_once(stack):
    gateway, _ = stack
    key = gateway.keys["acme"]
    pairs = {f"twin-a{n}": _send_pair((gateway.url, gateway.url), key, f"twin-a{n}") for n in range(PAIRS)}
    _check_pairs(gateway, pairs, "twin-a")


def test_the_same_id_twice_at_once_through_two_processes_is_never_served_free(stack):
    gateway, other = stack
    key = gateway.keys["acme"]
    pairs = {f"twin-b{n}": _send_pair((gateway.url, other.url), key, f"twin-b{n}") for n in range(PAIRS)}
    _check_pairs(gateway, pairs, "twin-b")

"""In-process pieces of the gateway: SSE relay, client address, payload checks, circuits,
terminal log, and the dispatcher driving a real engine (no HTTP, no database)."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import httpx
import pytest

from gateway.clientip import client_ip
from gateway.dispatcher import Dispatcher
from gateway.errors import GatewayError
from gateway.payload import CHAT, EMBED, TEXT, payload_parse, upstream_body
from gateway.proxy import SseFilter, relayed_headers, retry_after_ms, usage_of
from gateway.terminal import TerminalLog
from scheduling.engine.circuits import Circuits
from scheduling.engine.model import BackendSpec, ClassSpec, QueuePolicy, Request, SchedulerConfig, TenantSpec


def _event(payload) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


CHUNK = _event({"choices": [{"index": 0, "delta": {"content": "hello world"}}], "usage": None})
USAGE = _event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize("forward", [False, True])
def test_sse_filter_records_usage_and_forwards_it_only_when_asked(forward):
    sse = SseFilter(forward_usage=forward)
    stream = CHUNK + USAGE + DONE
    out = b"".join(sse.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + sse.flush()
    assert sse.usage == (7, 3)
    assert out == (stream if forward else CHUNK + DONE)
    assert sse.text_sent() == "hello world"


def test_sse_filter_keeps_usage_carried_by_a_content_chunk():
    event = _event({"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"prompt_tokens": 1}})
    sse = SseFilter(forward_usage=False)
    assert sse.feed(event) == event and sse.usage == (1, 0)


def test_retry_after_and_usage_parsing():
    assert retry_after_ms(httpx.Headers({"retry-after-ms": "250", "retry-after": "9"})) == 250
    assert retry_after_ms(httpx.Headers({"retry-after": "2"})) == 2000
    assert retry_after_ms(httpx.Headers({"retry-after": "soon"})) == 1000
    assert usage_of(b'{"usage": {"prompt_tokens": 4, "completion_tokens": 2}}') == (4, 2)
    assert usage_of(b"not json") is None


def test_hop_by_hop_and_framing_headers_are_not_relayed():
    upstream = httpx.Headers(
        [
            ("Connection", "keep-alive"),
            ("Transfer-Encoding", "chunked"),
            ("Keep-Alive", "5"),
            ("Content-Length", "3"),
            ("X-Request-Id", "theirs"),
            ("openai-processing-ms", "12"),
            ("Content-Type", "application/json"),
        ]
    )
    assert relayed_headers(upstream) == [("openai-processing-ms", "12"), ("content-type", "application/json")]


def test_client_ip_trusts_forwarded_for_only_from_trusted_proxies(settings):
    settings.FAIRGATE_TRUSTED_PROXIES = ["127.0.0.1/32", "10.0.0.0/8"]
    assert client_ip("127.0.0.1", "10.20.0.5") == "10.20.0.5"
    assert client_ip("127.0.0.1", "6.6.6.6, 10.1.1.1") == "6.6.6.6"  # rightmost untrusted hop
    assert client_ip("192.0.2.1", "10.20.0.5") == "192.0.2.1"  # untrusted peer: its header is ignored
    assert client_ip("127.0.0.1", None) == "127.0.0.1"
    settings.FAIRGATE_TRUSTED_PROXIES = []
    assert client_ip("127.0.0.1", "10.20.0.5") == "127.0.0.1"


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"[]",
        b"null",
        b'{"model": ""}',
        b'{"model": "m", "messages": "hi"}',
        b'{"model": "m", "messages": [{"content": "x"}]}',
        b'{"model": "m", "messages": [{"role": "u"}], "stream": 1}',
        b'{"model": "m", "messages": [{"role": "u"}], "max_tokens": true}',
        b'{"model": "m", "messages": [{"role": "u"}], "n": 0}',
        b'{"model": "m", "messages": [{"role": "u"}], "temperature": NaN}',
    ],
)
def test_payload_rejects_bad_chat_bodies(body):
    with pytest.raises(GatewayError) as err:
        payload_parse(CHAT, body)
    assert err.value.status == 400 and err.value.code == "invalid_request"


def test_payload_stream_always_asks_upstream_for_usage():
    payload = payload_parse(TEXT, b'{"model": "m", "prompt": "hi", "stream": true, "max_tokens": 3}')
    assert payload.stream and not payload.include_usage and payload.max_tokens == 3
    assert json.loads(upstream_body(payload))["stream_options"] == {"include_usage": True}
    plain = payload_parse(TEXT, b'{"model": "m", "prompt": [1, 2, 3], "max_tokens": 5}')
    plain.output_limit = 5  # what the hold covers: the client's own limit
    assert upstream_body(plain) == plain.raw


def test_payload_goes_upstream_with_the_output_limit_its_hold_covers():
    unlimited = payload_parse(TEXT, b'{"model": "m", "prompt": "hi"}')
    assert unlimited.max_tokens is None
    unlimited.output_limit = 40  # the model's default
    assert json.loads(upstream_body(unlimited))["max_tokens"] == 40
    both = payload_parse(
        CHAT,
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "max_completion_tokens": 7}',
    )
    assert (both.max_tokens, both.max_tokens_field) == (7, "max_completion_tokens")
    both.output_limit = 7
    sent = json.loads(upstream_body(both))
    assert (sent["max_tokens"], sent["max_completion_tokens"]) == (7, 7)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "e"}',
        b'{"model": "e", "input": ""}',
        b'{"model": "e", "input": []}',
        b'{"model": "e", "input": ["a", ""]}',
        b'{"model": "e", "input": [[]]}',
        b'{"model": "e", "input": [true]}',
        b'{"model": "e", "input": ["a", 1]}',
        b'{"model": "e", "input": {"text": "a"}}',
        b'{"model": "e", "input": "a", "stream": true}',
        b'{"model": "e", "input": ["a", "b", "c"]}',  # over the cap of 2 set below
    ],
)
def test_payload_rejects_bad_embeddings_bodies(body, settings):
    settings.FAIRGATE_MAX_EMBEDDING_INPUTS = 2
    with pytest.raises(GatewayError) as err:
        payload_parse(EMBED, body)
    assert err.value.status == 400 and err.value.code == "invalid_request"


def test_embeddings_have_no_output_and_go_upstream_as_sent():
    from gateway.limits import output_limit
    from gateway.payload import estimate

    for raw, tokens in (
        (b'{"model": "e", "input": "hello world", "dimensions": 8}', 2),
        (b'{"model": "e", "input": ["hello", "world"]}', 2),
        (b'{"model": "e", "input": [1, 2, 3]}', 3),
        (b'{"model": "e", "input": [[1, 2, 3], [4, 5]], "encoding_format": "base64"}', 5),
    ):
        payload = payload_parse(EMBED, raw)
        assert (payload.stream, payload.n, payload.max_tokens) == (False, 1, None)
        assert output_limit(payload) == 0
        assert upstream_body(payload) == raw
        assert payload.upstream_path == "/embeddings"
        assert estimate(payload) == tokens


def test_output_limits_and_the_prompt_bound(settings):
    from gateway.limits import output_limit, prompt_bound

    settings.FAIRGATE_MODEL_OUTPUT_LIMITS = {"m": (40, 1000)}
    settings.FAIRGATE_MAX_N = 4
    assert output_limit(payload_parse(TEXT, b'{"model": "m", "prompt": "hi"}')) == 40
    assert output_limit(payload_parse(TEXT, b'{"model": "m", "prompt": "hi", "max_tokens": 1000}')) == 1000
    for body in (b'{"model": "m", "prompt": "hi", "max_tokens": 1001}', b'{"model": "m", "prompt": "hi", "n": 5}'):
        with pytest.raises(GatewayError) as refused:
            output_limit(payload_parse(TEXT, body))
        assert refused.value.status == 400
    chinese = payload_parse(
        CHAT,
        json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "预算" * 1000}]}, ensure_ascii=False
        ).encode(),
    )
    assert prompt_bound(chinese) >= len("预算".encode()) * 1000  # every UTF-8 byte could be a token


def test_circuit_opens_after_threshold_and_half_open_reopens_on_one_failure():
    circuits = Circuits(threshold=2, cooldown_ms=100)
    assert not circuits.failure("b", 0)
    assert circuits.failure("b", 1) and circuits.is_open("b", 50)
    assert circuits.reopen_due(101) == ["b"] and not circuits.is_open("b", 101)
    assert circuits.failure("b", 102)  # half-open: one failure is enough
    assert circuits.reopen_due(202) == ["b"]
    circuits.success("b")
    assert not circuits.failure("b", 203)  # closed again after the success: threshold counts anew


def test_terminal_log_is_bounded_by_age_and_count():
    log = TerminalLog(keep_ms=1000, max_entries=2)
    log.add("t", "a", {"state": "completed"}, now_ms=0)
    log.add("t", "b", {"state": "cancelled"}, now_ms=10)
    log.add("t", "c", {"state": "completed"}, now_ms=20)
    assert log.get("t", "a", now_ms=20) is None and log.get("t", "b", now_ms=20)["state"] == "cancelled"
    assert log.get("u", "b", now_ms=20) is None  # another tenant's id
    assert log.get("t", "c", now_ms=1020) is None  # older than an hour (here: 1 s)


def test_terminal_log_keeps_each_tenants_jobs_and_forgets_them_with_their_records():
    log = TerminalLog(keep_ms=1000, max_entries=3)
    log.add("t", "a", {"state": "completed", "job": "j1"}, now_ms=0)
    log.add("t", "b", {"state": "failed", "job": "j1"}, now_ms=10)
    log.add("u", "a", {"state": "completed", "job": "j1"}, now_ms=20)  # another tenant's job of that name
    assert [r["state"] for r in log.jobs_of("t", now_ms=20)["j1"]] == ["completed", "failed"]
    log.add("t", "a", {"state": "cancelled", "job": "j2"}, now_ms=30)  # re-added: moves to its new job
    assert {job: len(rs) for job, rs in log.jobs_of("t", now_ms=30).items()} == {"j1": 1, "j2": 1}
    assert log.jobs_of("t", now_ms=1015) == {"j2": [{"state": "cancelled", "job": "j2"}]}  # b aged out
    assert log.jobs_of("u", now_ms=1025) == {}


def test_a_job_is_the_clients_tag_or_its_key_and_class():
    from gateway.lifecycle import job_of

    assert job_of(tagged="nightly-report", key_prefix="abcd", cls="BATCH") == "nightly-report"
    assert job_of(tagged=None, key_prefix="abcd", cls="BATCH") == "key/abcd/BATCH"


def test_the_shared_submit_command_carries_the_job_and_old_commands_still_apply():
    from scheduling.engine import Scheduler
    from scheduling.shared.protocol import Routes, Step, submit

    config = _config()
    sched = Scheduler(config, tenants=config.tenants, backends=config.backends)
    step = Step(sched, Routes(), 0, config.backends)
    step.apply(
        [submit("gw", "t/x", tenant="t", cls="BATCH", model="m", prompt_tokens=1, expected_output_tokens=1, job="j")]
    )
    step.apply([["submit", "gw", "t/y", "t", "BATCH", "m", 1, 1, None, False]])  # from a gateway before jobs
    jobs = {live.request.id: live.request.job for live in sched.requests_of("t")}
    assert jobs == {"t/x": "j", "t/y": None}


def test_terminal_log_re_adding_an_id_makes_it_newest():
    log = TerminalLog(keep_ms=1000, max_entries=2)
    log.add("t", "a", {"state": "completed"}, now_ms=0)
    log.add("t", "b", {"state": "completed"}, now_ms=10)
    log.add("t", "a", {"state": "cancelled"}, now_ms=20)
    log.add("t", "c", {"state": "completed"}, now_ms=30)  # over the count: the oldest, b, goes
    assert log.get("t", "b", now_ms=30) is None and log.get("t", "a", now_ms=30)["state"] == "cancelled"
    assert len(log) == 2


def test_terminal_log_records_are_invisible_to_the_garbage_collector():
    """100,000 kept records must not lengthen every full collection: nothing per record is tracked."""
    import gc

    log = TerminalLog(keep_ms=10**9, max_entries=10**6)
    gc.collect()
    before = len(gc.get_objects())
    for n in range(5000):
        log.add("t", f"r{n}", {"id": f"r{n}", "state": "completed", "position": None, "waited_ms": n}, now_ms=n)
    gc.collect()
    added = len(gc.get_objects()) - before
    assert added < 50, f"{added} objects tracked by the collector for 5,000 records"


# --- the dispatcher on a real engine ---------------------------------------------------------


def _config(slots: int = 1, admission: str = "predicted") -> SchedulerConfig:
    classes = (ClassSpec("INTERACTIVE", 0, 3000, Decimal("1.6")), ClassSpec("BATCH", 2, 60000, Decimal("0.7")))
    return SchedulerConfig(
        classes=classes,
        queue=QueuePolicy(service_ms_prior=100, admission=admission),
        tenants=(TenantSpec("t", 0.5),),
        backends=(BackendSpec("b", ("m",), slots, url="http://x"),),
    )


def _request(d: Dispatcher, rid: str, *, deadline_in_ms: int | None = None) -> Request:
    now_ms = d.now_ms()
    return Request(
        id=f"t/{rid}",
        tenant="t",
        cls="INTERACTIVE",
        model="m",
        prompt_tokens=10,
        expected_output_tokens=10,
        enqueued_ms=now_ms,
        deadline_ms=None if deadline_in_ms is None else now_ms + deadline_in_ms,
    )


def _admit(d: Dispatcher, rid: str, **kwargs):
    return d.admit_now(_request(d, rid, **kwargs), public_id=rid, declared_class="INTERACTIVE", rule=None)


def test_dispatcher_grants_cancels_and_expires():
    async def scenario():  # the depth rule admits a request that cannot start by its deadline; it expires
        d = Dispatcher(_config(admission="depth"), audit_pk=None, loop=asyncio.get_running_loop())
        first = _admit(d, "one")
        grant = await asyncio.wait_for(first.future, 1)
        assert grant.backend == "b" and first.state == "running"
        second = _admit(d, "two")
        third = _admit(d, "three", deadline_in_ms=30)
        assert d.sched.position("t/two", now_ms=d.now_ms()).position == 1
        d.end(second, "cancelled")
        assert d.sched.state_of("t/two") is None
        with pytest.raises(GatewayError) as err:  # nobody frees the slot: the timer expires it
            await asyncio.wait_for(third.future, 2)
        assert err.value.status == 504 and err.value.code == "queue_timeout"
        assert d.terminal.get("t", "three", now_ms=d.now_ms())["state"] == "queue_timeout"
        fourth = _admit(d, "four")
        d.end(first, "completed", prompt_tokens=10, output_tokens=5, served=True)
        assert (await asyncio.wait_for(fourth.future, 1)).backend == "b"
        assert d.terminal.get("t", "two", now_ms=d.now_ms())["state"] == "cancelled"
        with pytest.raises(GatewayError) as dup:
            _admit(d, "four")
        assert dup.value.status == 400
        await d.close()

    asyncio.run(scenario())


def test_dispatcher_requeue_after_429_and_circuit_opening(settings):
    settings.FAIRGATE_CIRCUIT_FAILURES = 1

    async def scenario():
        d = Dispatcher(_config(), audit_pk=None, loop=asyncio.get_running_loop())
        entry = _admit(d, "one")
        await asyncio.wait_for(entry.future, 1)
        d.requeue(entry, retry_after_ms=40)  # the backend is held closed for 40 ms
        assert entry.state == "queued" and d.sched.state_of("t/one") == "queued"
        assert (await asyncio.wait_for(entry.future, 1)).backend == "b"
        d.upstream_result("b", ok=False)  # opens the circuit: the backend leaves the engine's rotation
        assert not d.serves_now("m")
        with pytest.raises(GatewayError) as err:
            d.check_model("m")
        assert err.value.code == "no_backend"
        d.end(entry, "upstream_error")
        await d.close()

    asyncio.run(scenario())


def test_concurrent_lookups_of_an_expired_key_share_one_database_query(monkeypatch):
    import asyncio
    import time

    from gateway import auth
    from tenants.keys import key_generate

    full_key, prefix, secret_hash = key_generate()
    calls = []

    def slow_load(prefixes):
        calls.extend(prefixes)
        time.sleep(0.05)
        return {p: auth._KeyRow(secret_hash, auth.Caller("t", 1, False, (), "BATCH", p)) for p in prefixes}

    monkeypatch.setattr(auth, "_load_many", slow_load)
    monkeypatch.setattr(auth, "_usable_prefixes", lambda: None)
    auth.cache_clear()

    async def many():
        return await asyncio.gather(*(auth.authenticate(f"Bearer {full_key}") for _ in range(50)))

    callers = asyncio.run(many())
    assert {c.tenant for c in callers} == {"t"}
    assert calls == [prefix]
    auth.cache_clear()


def test_generated_request_ids_are_unique_and_in_time_order(monkeypatch):
    import re

    from gateway import intake, lifecycle

    now_ns = [1_700_000_000_000_000_000]
    monkeypatch.setattr(lifecycle.time, "time_ns", lambda: now_ns[0])
    first = [intake.new_request_id() for _ in range(100)]
    now_ns[0] += 1_000_000  # one ms later
    later = intake.new_request_id()
    assert all(re.fullmatch(r"req_[0-9a-f]{32}", rid) for rid in first + [later])
    assert len(set(first)) == 100
    assert max(first) < later


def _held(amount: str, room: str | None):
    from billing.inflight import HeldEntry

    return HeldEntry(
        request_id="t/r",
        tenant_id=1,
        budget_id=1,
        month_budget_id=None,
        class_name="BATCH",
        price_version_id=1,
        model="m",
        factor=Decimal(1),
        amount=Decimal(amount),
        room=None if room is None else Decimal(room),
    )


def test_early_holds_need_a_fresh_report_of_ample_room_less_what_is_being_held_early(settings):
    from billing.client import BudgetRoomMemo

    settings.FAIRGATE_EARLY_HOLD_ROOM_MS = 1000
    budget_room_memo = BudgetRoomMemo()
    assert budget_room_memo.early_estimate("t", 100, now_s=0.0) is None  # nothing known yet: hold first
    budget_room_memo.learn("t", 100, _held("1", "10"), now_s=0.0)  # 0.01 per token; 10 left
    first = budget_room_memo.early_estimate("t", 100, now_s=0.5)
    assert first == Decimal(1)  # 10 >= 4 x 1
    assert budget_room_memo.early_estimate("t", 100, now_s=0.5) == Decimal(1)  # 10 - 1 >= 4 x 1
    assert budget_room_memo.early_estimate("t", 300, now_s=0.5) is None  # 10 - 2 < 4 x 3
    assert budget_room_memo.early_estimate("t", 100, now_s=1.6) is None  # the report is too old
    budget_room_memo.early_answered("t", first)
    budget_room_memo.learn("t", 100, _held("1", "9"), now_s=2.0)
    assert budget_room_memo.early_estimate("t", 100, now_s=2.0) == Decimal(1)  # 9 - 1 (one still out) >= 4 x 1
    budget_room_memo.refused("t", now_s=2.1)
    assert budget_room_memo.early_estimate("t", 1, now_s=2.1) is None  # last refused: hold first


def test_early_holds_price_at_the_dearest_rate_seen_and_ignore_holds_found_again():
    from billing.client import BudgetRoomMemo

    budget_room_memo = BudgetRoomMemo()
    budget_room_memo.learn("t", 100, _held("1", "1000"), now_s=0.0)
    budget_room_memo.learn("t", 100, _held("0.5", "1000"), now_s=0.0)  # a cheaper class: the dearer rate stays
    assert budget_room_memo.early_estimate("t", 100, now_s=0.0) == Decimal(1)
    budget_room_memo.learn("t", 100, _held("1", None), now_s=0.0)  # an open hold found again says nothing of the room
    assert budget_room_memo.early_estimate("t", 100, now_s=0.0) == Decimal(1)
    budget_room_memo.learn("u", 100, _held("1", "Infinity"), now_s=0.0)  # no limit
    assert budget_room_memo.early_estimate("u", 10**9, now_s=0.0) is not None


def test_the_openapi_document_names_every_api_route():
    import re

    from batches.urls import urlpatterns as batch_routes
    from gateway.openapi import openapi_document
    from gateway.urls import urlpatterns as gateway_routes

    routes = {
        "/" + re.sub(r"<str:(\w+)>", r"{\1}", str(p.pattern))
        for p in (*gateway_routes, *batch_routes)
        if str(p.pattern).startswith("v1/") and str(p.pattern) != "v1/openapi.json"
    }
    assert routes - set(openapi_document()["paths"]) == set()

"""Upstreams that need credentials, end to end with the official openai SDK: simulated backends that
require a key (Bearer, or Azure OpenAI's api-key, deployment path and api-version), a key refused
(the backend's circuit opens, the client gets 502 or another backend, nothing is charged), seed
003's fallback channel with a key of its own, and a batch line run by a Celery worker. The keys
reach the gateway and the worker by their environment only; none is found afterwards in a log, the
database or the audit rows."""

from __future__ import annotations

import io
import json
import secrets
import subprocess
import sys

import openai
import pytest

from simbackend import SimConfig, start_in_thread
from tests.live.gateway.conftest import sim_stats
from tests.support.livestack import (
    REPO_ROOT,
    celery_broker,
    start_celery,
    start_gateway,
    stop_process,
    wait_for,
    wait_until,
)
from tests.support.scheduler_yaml import backend, scheduler_yaml, tenant

pytestmark = pytest.mark.live
CHAT = [{"role": "user", "content": "hello"}]
KEYS = {"plain": ("plain", "INTERACTIVE"), "vip": ("vip", "INTERACTIVE"), "fin": ("plain", "BATCH")}
# The secrets: a value per run, in the environment of the gateway and of the worker only.
SECRETS = {
    name: f"sk-{name.lower()}-{secrets.token_hex(12)}"
    for name in ("FG_KEY_OPENAI", "FG_KEY_AZURE", "FG_KEY_WRONG", "FG_KEY_PRIMARY", "FG_KEY_FALLBACK", "FG_TAG")
}
LEDGER = """
import json
from billing.models import LedgerEntry
print(json.dumps(list(LedgerEntry.objects.filter(request_id__endswith={rid!r}).values_list("kind", flat=True))))
"""
EVERYTHING_STORED = """
from audit.models import AuditLog
from scheduling.models import Backend
print(list(AuditLog.objects.values_list("old", "new")), list(Backend.objects.values()))
"""


def world_yaml(backends: list[dict]) -> str:
    return scheduler_yaml(tenants=[tenant("plain"), tenant("vip") | {"vip": True}], backends=backends)


def _keyed(name: str, url: str, model: str, env: str, **extra) -> dict:
    return backend(name, url, models=(model,), slots=2) | {"api_key_env": env, **extra}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    sims = {
        "openai": SimConfig(port=0, api_key=SECRETS["FG_KEY_OPENAI"], ttft_ms=2, tokens_per_s=5000),
        "azure": SimConfig(port=0, api_key=SECRETS["FG_KEY_AZURE"], azure=True, models=("gpt-dep",), ttft_ms=2),
        "refusing": SimConfig(port=0, api_key="not-the-gateway-key", ttft_ms=2),
        "primary": SimConfig(port=0, api_key=SECRETS["FG_KEY_PRIMARY"], rpm=1, ttft_ms=2),
        "fallback": SimConfig(port=0, api_key=SECRETS["FG_KEY_FALLBACK"], ttft_ms=2),
    }
    running = {name: start_in_thread(config) for name, config in sims.items()}
    url = {name: sim.url for name, sim in running.items()}
    backends = [
        _keyed("b-openai", f"{url['openai']}/v1", "m-key", "FG_KEY_OPENAI", headers={"X-Tag": "env:FG_TAG"}),
        _keyed("b-azure", url["azure"], "m-azure", "FG_KEY_AZURE", dialect="azure", deployment="gpt-dep")
        | {"api_version": "2024-06-01"},
        _keyed("b-refused", f"{url['refusing']}/v1", "m-refused", "FG_KEY_WRONG"),
        _keyed("b-wrong-first", f"{url['refusing']}/v1", "m-two", "FG_KEY_WRONG") | {"slots": 4},
        _keyed("b-right-second", f"{url['openai']}/v1", "m-two", "FG_KEY_OPENAI"),
        _keyed("b-primary", f"{url['primary']}/v1", "m-vip", "FG_KEY_PRIMARY"),
        _keyed("b-fallback", f"{url['fallback']}/v1", "m-vip", "FG_KEY_FALLBACK", fallback_for="b-primary"),
    ]
    yaml = world_yaml(backends)
    var_dir = tmp_path_factory.mktemp("gw-keys")
    settings = {**SECRETS, **celery_broker(), "FAIRGATE_CIRCUIT_COOLDOWN_MS": "60000", "LOG_LEVEL": "INFO"}
    gateway = start_gateway(var_dir, yaml, KEYS, **settings)
    worker = start_celery(gateway.env, var_dir / "worker.log")
    gateway.extra.update(sims=running, var_dir=var_dir, backends=backends)
    yield gateway
    stop_process(worker)
    gateway.stop()
    for sim in running.values():
        sim.stop()


def test_a_bearer_key_from_the_environment_reaches_the_backend(stack):
    sim = stack.extra["sims"]["openai"]
    before = sim_stats(sim)["unauthorized"]
    answer = stack.sdk("plain").chat.completions.create(model="m-key", messages=CHAT, max_tokens=3)
    assert answer.choices[0].message.content
    assert sim_stats(sim)["unauthorized"] == before


def test_the_azure_dialect_uses_the_deployment_path_api_version_and_api_key(stack):
    sim = stack.extra["sims"]["azure"]
    answer = stack.sdk("plain").chat.completions.create(model="m-azure", messages=CHAT, max_tokens=3)
    assert answer.choices[0].message.content and answer.model == "gpt-dep"  # the deployment answered
    stream = stack.sdk("plain").chat.completions.create(model="m-azure", messages=CHAT, max_tokens=3, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert sim_stats(sim)["unauthorized"] == 0


def test_a_refused_key_opens_the_circuit_and_is_a_502_without_a_charge(stack):
    with pytest.raises(openai.APIStatusError) as refused:
        stack.sdk("plain").chat.completions.create(
            model="m-refused", messages=CHAT, max_tokens=3, extra_headers={"X-Request-Id": "refused-1"}
        )
    error = refused.value
    assert error.status_code == 502  # never the client's own 401
    assert error.body["code"] == "upstream_error" and "credential" in error.body["message"]
    assert stack.metric("fairgate_backend_circuit_open", backend="b-refused") == 1
    assert "b-refused: upstream credential refused" in stack.log()
    kinds = wait_for(
        lambda: json.loads(stack.shell(LEDGER.format(rid="refused-1")).strip()),
        lambda kinds: "release" in kinds,
        what="the hold released",
    )
    assert "charge" not in kinds


def test_a_refused_key_sends_the_request_to_another_backend_of_its_model(stack):
    answer = stack.sdk("plain").chat.completions.create(model="m-two", messages=CHAT, max_tokens=3)
    assert answer.choices[0].message.content
    assert stack.metric("fairgate_backend_circuit_open", backend="b-wrong-first") == 1
    assert stack.metric("fairgate_upstream_errors_total", backend="b-wrong-first", kind="credential") == 1


def test_a_vip_tenant_goes_to_the_fallback_with_its_own_key_while_the_primary_answers_429(stack):
    """Seed 003's fallback channel: the primary account (rpm 1 at the provider) is spent; a VIP
    request goes to the fallback account, whose key is another."""
    primary, fallback = stack.extra["sims"]["primary"], stack.extra["sims"]["fallback"]
    vip = stack.sdk("vip")
    vip.chat.completions.create(model="m-vip", messages=CHAT, max_tokens=3, extra_headers={"X-Request-Id": "vip-1"})
    assert sim_stats(primary, request_id="vip-1")["seen"] is True
    answer = vip.chat.completions.with_raw_response.create(
        model="m-vip", messages=CHAT, max_tokens=3, extra_headers={"X-Request-Id": "vip-2"}
    )
    assert answer.parse().choices[0].message.content
    assert sim_stats(primary)["rejected_429"] >= 1  # the primary refused it for its window
    assert sim_stats(fallback, request_id="vip-2")["seen"] is True
    assert sim_stats(primary)["unauthorized"] == sim_stats(fallback)["unauthorized"] == 0


def test_a_batch_line_run_by_a_celery_worker_carries_the_key(stack):
    sim = stack.extra["sims"]["openai"]
    sdk = stack.sdk("fin")
    body = {"model": "m-key", "messages": CHAT, "max_tokens": 3}
    line = {"custom_id": "k1", "method": "POST", "url": "/v1/chat/completions", "body": body}
    upload = sdk.files.create(file=("k.jsonl", io.BytesIO(json.dumps(line).encode() + b"\n")), purpose="batch")
    batch = sdk.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_for(
        lambda: sdk.batches.retrieve(batch.id),
        lambda b: b.status in ("completed", "failed"),
        what="batch ended",
        limit_s=90,
        step_s=0.25,
    )
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 0)
    out = [json.loads(row) for row in sdk.files.content(done.output_file_id).read().splitlines()]
    assert out[0]["response"]["status_code"] == 200
    assert sim_stats(sim)["unauthorized"] == 0


def test_the_secrets_are_in_no_log_row_or_audit_record(stack):
    stored = stack.shell(EVERYTHING_STORED)
    assert "FG_KEY_OPENAI" in stored and "env:FG_TAG" in stored  # the names are configuration
    texts = {"serve log": stack.log(), "worker log": (stack.extra["var_dir"] / "worker.log").read_text(), "db": stored}
    for where, text in texts.items():
        for name, value in SECRETS.items():
            assert value not in text, f"{name}'s value found in the {where}"


def test_a_missing_variable_stops_serve_and_is_refused_by_a_running_process(stack, tmp_path):
    env = {k: v for k, v in stack.env.items() if k != "FG_KEY_AZURE"}
    done = subprocess.run(
        [sys.executable, "manage.py", "serve", "--port", "1"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "backend 'b-azure' needs the environment variable FG_KEY_AZURE" in done.stderr
    # a configuration naming a variable the running gateway lacks: refused, the one in force stays
    extra = backend("b-new", "http://127.0.0.1:9/v1", models=("m-new",)) | {"api_key_env": "FG_NOT_SET"}
    changed = tmp_path / "changed.yaml"
    changed.write_text(world_yaml([*stack.extra["backends"], extra]))
    stack.manage("scheduler_config", "load", str(changed))
    try:
        wait_until(
            lambda: "configuration refused: backend 'b-new' needs the environment variable FG_NOT_SET" in stack.log(),
            what="the configuration refused",
        )
        models = {m.id for m in stack.sdk("plain").models.list()}
        assert "m-new" not in models and "m-key" in models
    finally:
        original = tmp_path / "original.yaml"
        original.write_text(world_yaml(stack.extra["backends"]))
        stack.manage("scheduler_config", "load", str(original))

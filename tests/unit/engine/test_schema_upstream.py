"""A backend's credential, extra headers and dialect in the scheduler YAML: round trip and refusals;
the headers and URL a call carries (scheduling.upstreams) and how they are shown (names only)."""

from __future__ import annotations

import pytest

from scheduling.engine.model import Dialect
from scheduling.engine.schema import ConfigError, config_from_yaml, config_to_yaml
from scheduling.upstreams import (
    CredentialMissing,
    backend_upstream_shown,
    missing_env,
    upstream_headers,
    upstream_path,
)

BASE = """scheduler:
  classes:
    - {name: INTERACTIVE, level: 0, sla_ms: 3000, price_factor: 1}
  backends:
    - name: b
      url: https://upstream.example/v1
      models: [m]
      slots: 2
"""
OPENAI = "      api_key_env: OPENAI_KEY\n      headers: {X-Team: llm, X-Secret: 'env:TEAM_TAG'}\n"
AZURE = "      api_key_env: AZ_KEY\n      dialect: azure\n      deployment: gpt-eu\n      api_version: 2024-06-01\n"
ENV = {"OPENAI_KEY": "sk-secret-1", "TEAM_TAG": "tag-secret-2", "AZ_KEY": "az-secret-3"}


def backend_of(extra: str):
    (spec,) = config_from_yaml(BASE + extra).backends
    return spec


@pytest.mark.parametrize("extra", [OPENAI, AZURE, ""])
def test_dump_then_load_gives_the_same(extra):
    config = config_from_yaml(BASE + extra)
    assert config_from_yaml(config_to_yaml(config)) == config


def test_the_openai_dialect_sends_a_bearer_key_and_the_extra_headers():
    spec = backend_of(OPENAI)
    assert upstream_headers(spec, ENV) == {
        "X-Team": "llm",
        "X-Secret": "tag-secret-2",
        "Authorization": "Bearer sk-secret-1",
    }
    assert upstream_path(spec, "/chat/completions") == "/chat/completions"


def test_the_azure_dialect_sends_api_key_to_the_deployment_path():
    spec = backend_of(AZURE)
    assert spec.dialect == Dialect.AZURE and spec.api_version == "2024-06-01"  # unquoted: a YAML date
    assert upstream_headers(spec, ENV) == {"api-key": "az-secret-3"}
    assert (
        upstream_path(spec, "/chat/completions") == "/openai/deployments/gpt-eu/chat/completions?api-version=2024-06-01"
    )
    no_deployment = backend_of(AZURE.replace("      deployment: gpt-eu\n", ""))
    assert upstream_path(no_deployment, "/embeddings", b'{"model": "m"}').startswith(
        "/openai/deployments/m/embeddings?"
    )


def test_a_missing_variable_names_the_backend_and_the_variable():
    spec = backend_of(OPENAI)
    with pytest.raises(CredentialMissing, match="backend 'b' needs the environment variable TEAM_TAG"):
        upstream_headers(spec, {"OPENAI_KEY": "x"})
    assert [(m.backend, m.variable) for m in missing_env([spec], {})] == [("b", "OPENAI_KEY"), ("b", "TEAM_TAG")]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("      dialect: azure\n", "api_version: is required with dialect: azure"),
        ("      api_version: '1'\n", "applies to dialect: azure only"),
        ("      api_key_env: 9BAD\n", "api_key_env: '9BAD' is not valid"),
        ("      headers: {Authorization: Bearer sk-1}\n", "is set by the gateway"),
        ("      headers: {X-Api-Key: sk-1}\n", "looks like a credential"),
        ("      headers: {X-Foo: 'env:bad-name'}\n", "expected env:NAME"),
        ("      dialect: grpc\n", "'grpc' is not one of: openai, azure"),
    ],
)
def test_bad_upstream_fields_are_refused(extra, message):
    with pytest.raises(ConfigError, match=message):
        config_from_yaml(BASE + extra)


def test_shown_with_variable_names_never_their_values():
    shown = backend_upstream_shown(backend_of(OPENAI)) + backend_upstream_shown(backend_of(AZURE))
    assert "env:OPENAI_KEY" in shown and "X-Secret: env:TEAM_TAG" in shown and "azure gpt-eu" in shown
    assert not any(secret in shown for secret in ENV.values())

"""Settings for running behind an HTTPS ingress (FAIRGATE_PUBLIC_URL, CSRF_TRUSTED_ORIGINS,
FAIRGATE_TRUSTED_PROXIES), and `manage.py check --deploy` in the production shape.

Settings cases start Django in a child process with an environment of their own, as `manage.py`
would; nothing connects to a service."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.env import env_networks, env_origin

REPO = Path(__file__).resolve().parents[3]
SHAPE = {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "DEBUG", "ALLOWED_HOSTS"}
PRODUCTION = {
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/fairgate",
    "REDIS_URL": "redis://127.0.0.1:6379/14",
    "SECRET_KEY": secrets.token_urlsafe(50),
    "FAIRGATE_PUBLIC_URL": "https://llm.example.com",
}
# What `check --deploy` may still say in the production shape: choices only the operator can make.
OPERATOR_CHOICES = {
    "security.W005": "HSTS includeSubDomains binds hosts Fairgate does not serve (FAIRGATE_HSTS_INCLUDE_SUBDOMAINS)",
    "security.W021": "HSTS preload is a commitment of the whole domain (FAIRGATE_HSTS_PRELOAD)",
    "batches.W001": "several machines need shared file storage (FAIRGATE_FILES_STORAGE)",
}
SETTINGS = (
    "import django, json; django.setup(); from django.conf import settings as s; print(json.dumps({n: getattr(s, n)"
    " for n in ('ALLOWED_HOSTS', 'CSRF_TRUSTED_ORIGINS', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE',"
    " 'SECURE_SSL_REDIRECT', 'SECURE_HSTS_SECONDS', 'SECURE_PROXY_SSL_HEADER')}))"
)


def _run(tmp_path: Path, argv: list[str], **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in SHAPE and not k.startswith("FAIRGATE_")}
    base.update(DJANGO_SETTINGS_MODULE="config.settings", FAIRGATE_VAR_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=base, capture_output=True, text=True, timeout=120)


def _settings(tmp_path: Path, **env: str) -> dict:
    done = _run(tmp_path, ["-c", SETTINGS], **env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "raw, origin",
    [
        ("https://LLM.example.com", "https://llm.example.com"),
        ("https://llm.example.com:443/", "https://llm.example.com"),
        ("https://127.0.0.1:8443", "https://127.0.0.1:8443"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("", ""),
    ],
)
def test_public_url_is_an_origin_as_browsers_send_it(monkeypatch, raw, origin):
    monkeypatch.setenv("X_URL", raw)
    assert env_origin("X_URL") == origin


@pytest.mark.parametrize("raw", ["llm.example.com", "ftp://llm.example.com", "https://x/console/", "https://x:0x1"])
def test_a_public_url_that_is_no_origin_fails_naming_it(monkeypatch, raw):
    monkeypatch.setenv("X_URL", raw)
    with pytest.raises(ImproperlyConfigured, match="X_URL"):
        env_origin("X_URL")


def test_trusted_proxies_are_addresses_or_networks(monkeypatch):
    monkeypatch.setenv("X_NETS", "127.0.0.1, 10.0.0.0/8,::1")
    assert env_networks("X_NETS") == ["127.0.0.1", "10.0.0.0/8", "::1"]
    monkeypatch.setenv("X_NETS", "10.0.0.0/8,nginx")
    with pytest.raises(ImproperlyConfigured, match="X_NETS: 'nginx'"):
        env_networks("X_NETS")


def test_an_https_public_url_makes_cookies_secure_and_sends_hsts(tmp_path):
    got = _settings(tmp_path, FAIRGATE_PUBLIC_URL="https://llm.example.com")
    assert got["CSRF_TRUSTED_ORIGINS"] == ["https://llm.example.com"]
    assert "llm.example.com" in got["ALLOWED_HOSTS"]
    assert got["SESSION_COOKIE_SECURE"] and got["CSRF_COOKIE_SECURE"] and got["SECURE_SSL_REDIRECT"]
    assert got["SECURE_HSTS_SECONDS"] >= 31_536_000
    assert got["SECURE_PROXY_SSL_HEADER"] is None  # it would believe any peer (gateway.forwarded decides)


def test_without_a_public_url_nothing_changes_for_plain_http(tmp_path):
    got = _settings(tmp_path)
    assert got["CSRF_TRUSTED_ORIGINS"] == []
    assert not (got["SESSION_COOKIE_SECURE"] or got["SECURE_SSL_REDIRECT"] or got["SECURE_HSTS_SECONDS"])


def test_csrf_trusted_origins_may_be_named_apart(tmp_path):
    got = _settings(
        tmp_path,
        FAIRGATE_PUBLIC_URL="https://llm.example.com",
        CSRF_TRUSTED_ORIGINS="https://a.example,https://b.example",
    )
    assert got["CSRF_TRUSTED_ORIGINS"] == ["https://a.example", "https://b.example"]


def _deploy_warnings(tmp_path: Path, **env: str) -> set[str]:
    done = _run(tmp_path, ["manage.py", "check", "--deploy"], **env)
    assert done.returncode == 0, done.stderr[-3000:]  # errors stop it; warnings are listed
    return set(re.findall(r"\(([a-z_]+\.[WE]\d+)\)", done.stdout + done.stderr))


def test_check_deploy_in_the_production_shape_leaves_only_the_operators_choices(tmp_path):
    warnings = _deploy_warnings(tmp_path, **PRODUCTION)
    assert warnings <= set(OPERATOR_CHOICES), sorted(warnings - set(OPERATOR_CHOICES))
    made = _deploy_warnings(tmp_path, **PRODUCTION, FAIRGATE_HSTS_INCLUDE_SUBDOMAINS="1", FAIRGATE_HSTS_PRELOAD="1")
    assert made <= {"batches.W001"}, made

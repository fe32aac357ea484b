"""SECRET_KEY: the embedded default may run on its built-in (public) key, production may not.

Each case starts Django (``django.setup()``, which loads ``config.settings``) in a child process
with an environment of its own, as ``manage.py`` or ``serve`` would; nothing connects to a service.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
START = "import django; django.setup(); from django.conf import settings; print('KEY', len(settings.SECRET_KEY))"
PRODUCTION = {
    "postgres": {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/fairgate"},
    "redis": {"REDIS_URL": "redis://127.0.0.1:6379/14"},
    "both": {"DATABASE_URL": "postgresql://u@db:5432/fg", "REDIS_URL": "redis://cache:6379/0"},
}


def _start(tmp_path: Path, code: str = START, **env: str) -> subprocess.CompletedProcess:
    """Start Django with ``env`` on top of this process's environment minus what decides the shape,
    and run ``code``."""
    drop = {"SECRET_KEY", "DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "DEBUG", "FAIRGATE_SCHEDULER"}
    base = {k: v for k, v in os.environ.items() if k not in drop}
    base.update(DJANGO_SETTINGS_MODULE="config.settings", FAIRGATE_VAR_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=base, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("shape", sorted(PRODUCTION))
def test_production_shape_without_secret_key_stops_start_up_naming_it(tmp_path, shape):
    done = _start(tmp_path, **PRODUCTION[shape])
    assert done.returncode != 0, f"started without SECRET_KEY:\n{done.stdout}"
    assert "ImproperlyConfigured" in done.stderr and "SECRET_KEY must be set" in done.stderr, done.stderr[-2000:]


def test_debug_does_not_excuse_a_missing_key_in_production(tmp_path):
    done = _start(tmp_path, DEBUG="1", **PRODUCTION["postgres"])
    assert done.returncode != 0 and "SECRET_KEY must be set" in done.stderr, done.stderr[-2000:]


def test_production_shape_starts_with_a_key_from_the_environment(tmp_path):
    done = _start(tmp_path, SECRET_KEY="s" * 50, **PRODUCTION["both"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "KEY 50" in done.stdout


@pytest.mark.parametrize("database_url", [None, "", "sqlite:///{tmp}/other.sqlite3"])
def test_embedded_default_starts_without_a_key(tmp_path, database_url):
    env = {} if database_url is None else {"DATABASE_URL": database_url.format(tmp=tmp_path)}
    done = _start(tmp_path, **env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "KEY" in done.stdout

"""FAIRGATE_SCHEDULER: shared where REDIS_URL is set (the production shape), embedded where it is
not (``make demo``), either one when asked for, and shared without Redis refused at start-up."""

from __future__ import annotations

import pytest

from tests.unit.config.test_secret_key import _start

MODE = "import django; django.setup(); from django.conf import settings; print('MODE', settings.FAIRGATE_SCHEDULER)"
REDIS = {"REDIS_URL": "redis://127.0.0.1:6379/14", "SECRET_KEY": "k" * 40}


@pytest.mark.parametrize(
    ("env", "mode"),
    [
        ({}, "embedded"),
        (REDIS, "shared"),
        ({**REDIS, "FAIRGATE_SCHEDULER": "embedded"}, "embedded"),
        ({"FAIRGATE_SCHEDULER": "embedded"}, "embedded"),
    ],
    ids=["no-redis", "redis", "redis-asked-embedded", "asked-embedded"],
)
def test_the_scheduler_mode_follows_redis_unless_asked(tmp_path, env, mode):
    done = _start(tmp_path, MODE, **env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == mode


def test_shared_without_redis_stops_start_up_naming_it(tmp_path):
    done = _start(tmp_path, MODE, FAIRGATE_SCHEDULER="shared")
    assert done.returncode != 0
    assert "FAIRGATE_SCHEDULER=shared needs REDIS_URL" in done.stderr

"""The Celery side (batches.tasks): one HTTP client per worker process serves every line it runs
(its connections to the backends kept), a forked child makes its own, and each line still ends
once, with its answer and its charge."""

from __future__ import annotations

import httpx
import pytest

from batches import tasks
from batches.models import BatchLine
from billing.models import LedgerEntry
from scheduling.models import Backend
from tests.integration.batches.test_leases import _sent
from tests.integration.billing.conftest import make_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    return make_world()


def test_a_worker_process_runs_every_line_through_one_client_and_a_fork_makes_its_own(world, monkeypatch):
    clients: list[int] = []

    def answer(request: httpx.Request) -> httpx.Response:
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}], "usage": usage})

    made = tasks._Upstream()
    real_client = httpx.Client

    def client(**kwargs):
        clients.append(1)
        return real_client(transport=httpx.MockTransport(answer), **kwargs)

    monkeypatch.setattr(tasks, "upstream", made)
    monkeypatch.setattr(tasks.httpx, "Client", client)
    Backend.objects.filter(name="gpu-b").update(url="http://gpu-b.invalid/v1")
    lines = _sent(world, lines=3)
    for line in lines:
        tasks.run_line(line.pk, 1)
    assert len(clients) == 1  # three lines, one client
    ended = BatchLine.objects.filter(pk__in=[line.pk for line in lines])
    assert sorted(ended.values_list("state", "status_code", "prompt_tokens")) == [("completed", 200, 3)] * 3
    charged = LedgerEntry.objects.filter(kind="charge", request_id__in=[line.ledger_key for line in lines])
    assert charged.count() == 3
    first = made.client()
    monkeypatch.setattr(tasks.os, "getpid", lambda: -1)  # a pool child forked from this process
    assert made.client() is not first and len(clients) == 2

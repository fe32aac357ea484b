"""The fault runner (bench.faults) end to end for one cheap fault: SIGKILL to the gateway's billing
worker under a small load, on the production shape (Procfile's web, worker and beat; a scratch
PostgreSQL database; a Redis db number of its own). It never restarts the shared servers. Checks
that the counts it reports are consistent and meet the finance targets; never how fast anything was."""

from __future__ import annotations

import pytest

from bench import faults
from bench.fault_count import table

pytestmark = [pytest.mark.live, pytest.mark.postgres, pytest.mark.redis]

REDIS_DB = 7  # of its own: not the bench's default (9), nor CI's (14)


def test_a_killed_billing_worker_leaves_nothing_held_and_every_served_request_charged_once(tmp_path):
    """Half of the load is hostile (bench.fault_hostile): the same id twice at once is served once,
    cut streams are charged, nothing is unbilled."""
    opts = faults.parse_args(
        [
            "--only",
            "kill-worker",
            "--requests",
            "40",
            "--duration-s",
            "6",
            "--clients",
            "6",
            "--settle-s",
            "120",  # the most it may take: counted as soon as the ledger settled (a new billing worker
            # replays the lost batch; on a loaded machine its start alone can take seconds)
            "--hostile",
            "0.5",  # half of them hostile: one id twice at once, prompt lists, tools, cut streams
            "--redis-db",
            str(REDIS_DB),
            "--var-dir",
            str(tmp_path),
        ]
    )
    (count,) = faults.run(opts)
    assert count.fault == "kill-worker" and count.rounds == 1
    assert count.tried == 40
    assert count.tried == count.clean + count.unclean == sum(count.client.values())
    served_hows = [n for how, n in count.client.items() if how.startswith(("served", "twins 200+"))]
    assert count.served == sum(served_hows) <= count.clean
    assert count.served > 0, count.client
    assert any(how.startswith("twins 200+") for how in count.client), count.client
    assert count.client["served, cut by the client"] > 0, count.client
    assert count.unbilled == 0, table([count])
    assert count.charged_once + count.uncharged + count.charged_twice == count.served
    assert (count.left_held, count.overspent, count.uncharged, count.charged_twice) == (0, 0, 0, 0), table([count])
    assert count.verify_failures == 0, count.notes
    assert "killed the billing worker" in count.notes[0]
    assert any("the ledger settled" in note for note in count.notes), count.notes
    assert count.target_met

"""bench.launch.scratch: a run's work directory is removed when the run ends well, kept (and named)
when it fails."""

from __future__ import annotations

import pytest

from bench.launch import scratch


def test_removed_after_a_run_that_ends_well():
    with scratch("fg-scratch-test-") as work:
        (work / "serve.log").write_text("ok")
        assert work.is_dir()
    assert not work.exists()


def test_kept_and_named_after_a_run_that_fails(capsys):
    with pytest.raises(RuntimeError), scratch("fg-scratch-test-") as work:
        (work / "serve.log").write_text("why it failed")
        raise RuntimeError("the run failed")
    try:
        assert (work / "serve.log").read_text() == "why it failed"
        assert f"logs kept in {work}" in capsys.readouterr().err
    finally:
        (work / "serve.log").unlink()
        work.rmdir()

"""A batch line that the engine fails early (fast-fail) goes back to its batch (batches.feeder)."""

from __future__ import annotations

from batches.feeder import failed_early
from gateway.errors import ErrorCode


def test_a_queue_timeout_before_the_window_ends_is_an_early_fast_fail():
    assert failed_early(ErrorCode.QUEUE_TIMEOUT, expires_at_s=1000.0, now_s=400.0)


def test_a_queue_timeout_at_the_window_end_expires_the_line():
    assert not failed_early(ErrorCode.QUEUE_TIMEOUT, expires_at_s=1000.0, now_s=1000.0)
    assert not failed_early(ErrorCode.QUEUE_TIMEOUT, expires_at_s=1000.0, now_s=1000.5)


def test_other_refusals_are_not_early_fast_fails():
    assert not failed_early(ErrorCode.QUEUE_FULL, expires_at_s=1000.0, now_s=400.0)

"""Beam's local Pub/Sub reader, hardened (pipelines/local_pubsub.py): transient faults retried
with backoff and a bound, large messages received."""
from __future__ import annotations

import pytest

pytest.importorskip("google.api_core")
from google.api_core import exceptions  # noqa: E402

from pipelines import local_pubsub  # noqa: E402


class _Clock:
    def __init__(self):
        self.now = 0.0

    def time(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_a_pull_is_retried_while_the_subscription_is_missing_then_reads():
    clock, calls = _Clock(), []

    def pull():
        calls.append(clock.now)
        if clock.now < 13.0:  # the subscription is back after 13 s (a restart)
            raise exceptions.NotFound("Subscription does not exist")
        return ["message"]
    assert local_pubsub.retried(pull, 120.0, clock.sleep, clock.time) == ["message"]
    assert calls == [0.0, 0.5, 1.5, 3.5, 7.5, 15.5]  # backoff doubling from 0.5 s


def test_a_fault_that_outlasts_the_retries_is_one_line_naming_continue():
    clock = _Clock()

    def pull():
        raise exceptions.ServiceUnavailable("connection refused")
    with pytest.raises(local_pubsub.PubSubUnavailable) as failed:
        local_pubsub.retried(pull, 30.0, clock.sleep, clock.time)
    text = str(failed.value)
    assert clock.now <= 30.0 and "--continue" in text and "\n" not in text and len(text) < 300
    assert text.startswith("`Pub/Sub` must answer the job's pull within 30 s; got")


def test_other_errors_are_not_retried():
    def pull():
        raise exceptions.PermissionDenied("no")
    with pytest.raises(exceptions.PermissionDenied):
        local_pubsub.retried(pull, 30.0, lambda s: None, lambda: 0.0)


def test_the_reader_receives_ten_messages_of_pubsubs_largest_size():
    assert local_pubsub.MAX_RECEIVE >= 10 * (10 << 20) + (1 << 20)

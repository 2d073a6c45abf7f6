"""The local reader's paced watermark (pipelines/local_watermark.py)."""
from __future__ import annotations

import doctest

from pipelines import local_watermark
from pipelines.local_watermark import Pacer, deadlines
from transforms.steps import TimeSteps


def test_doctests():
    assert doctest.testmod(local_watermark).failed == 0


def test_a_watermark_that_jumps_crosses_each_deadline_once_work_behind_it_is_done():
    busy = {"until": 0}  # work behind a deadline is in flight while calls < busy["until"]
    calls = []

    def in_flight(point):
        calls.append(point)
        return len(calls) < busy["until"]
    pacer = Pacer([100, 200, 300], slack=60.0, clock=lambda: 0.0)
    assert pacer.hold(50, in_flight) == 50  # before every deadline: the reader's own
    busy["until"] = 3  # two calls see work in flight behind 100
    seen = [pacer.hold(10_000, in_flight) for _ in range(6)]
    assert seen == [99, 99, 199, 299, 10_000, 10_000]
    assert calls == [100, 100, 100, 200, 300]


def test_a_deadline_busy_for_the_slack_is_crossed_anyway():
    clock = {"now": 0.0}
    pacer = Pacer([100], slack=10.0, clock=lambda: clock["now"])
    assert pacer.hold(500, lambda point: True) == 99
    clock["now"] = 9.9
    assert pacer.hold(500, lambda point: True) == 99
    clock["now"] = 10.0
    assert pacer.hold(500, lambda point: True) == 500


def test_the_watermark_never_passes_the_readers_own_and_never_goes_back():
    pacer = Pacer(range(0, 1000, 7), slack=1e9, clock=lambda: 0.0)
    last = -1
    for now in list(range(0, 1200, 3)) + [1200] * 200:
        hold = pacer.hold(now, lambda point: False)
        assert last <= hold <= now
        last = hold
    assert last == 1200


def test_deadlines_are_every_step_end_and_every_end_plus_the_lateness():
    steps = TimeSteps(origin=1000.0, size=2.0, horizon=4)
    assert sorted(set(deadlines(steps, 2, 0.5, 1))) == [
        int(t * 1e6) for t in (1006.0, 1006.5, 1008.0, 1008.5, 1010.0)]

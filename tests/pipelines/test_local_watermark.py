"""The local reader's paced watermark (pipelines/local_watermark.py)."""
from __future__ import annotations

import itertools
import random

from pipelines.local_watermark import Pacer, deadlines
from transforms.steps import TimeSteps


def test_a_watermark_that_jumps_stops_below_each_deadline_with_work_behind_it():
    """Timers are set at 100 (a step's flush) and at 200 (its release): crossing 100 fires the
    first; their work is in flight (behind 200) until it is done; only then 200, and 300 with
    it (nothing set before 300 but the timers at 200, which fire as 200 is crossed)."""
    timers, in_flight = {100, 200}, set()

    def blocked(point):
        return any(t < point for t in timers | in_flight)
    pacer = Pacer([100, 200, 300, 400], slack=60.0, clock=lambda: 0.0, every=0.0)
    assert pacer.hold(50, blocked) == 50  # before every deadline: the reader's own
    assert pacer.hold(10_000, blocked) == 199  # 100 crossed; its timers fire
    timers.discard(100)
    in_flight.add(150)  # their outputs, on the way to the release
    assert pacer.hold(10_000, blocked) == 199
    in_flight.clear()
    assert pacer.hold(10_000, blocked) == 299  # 200 crossed alone: its timers fire
    timers.clear()
    assert pacer.hold(10_000, blocked) == 10_000


def test_a_deadline_busy_for_the_slack_is_crossed_anyway():
    clock = {"now": 0.0}
    pacer = Pacer([100], slack=10.0, clock=lambda: clock["now"], every=0.0)
    assert pacer.hold(500, lambda point: True) == 99
    clock["now"] = 9.9
    assert pacer.hold(500, lambda point: True) == 99
    clock["now"] = 10.0
    assert pacer.hold(500, lambda point: True) == 500


def test_the_watermark_never_passes_the_readers_own_and_never_goes_back():
    pacer = Pacer(range(0, 1000, 7), slack=1e9, clock=lambda: 0.0, every=0.0)
    last = -1
    rng = random.Random(7)  # work behind a deadline at random, half the time
    for now in list(range(0, 1200, 3)) + [1200] * 200:
        hold = pacer.hold(now, lambda point: rng.random() < 0.5)
        assert last <= hold <= now
        last = hold
    assert last == 1200


def test_deadlines_are_every_step_end_and_every_end_plus_the_lateness():
    steps = TimeSteps(origin=1000.0, size=2.0, horizon=4)
    assert sorted(set(deadlines(steps, 2, 0.5, 1))) == [
        int(t * 1e6) for t in (1006.0, 1006.5, 1008.0, 1008.5, 1010.0)]


def test_a_blocked_deadline_is_checked_again_only_after_the_recheck_interval():
    """A check walks the runner's pending work and timers: a busy job's every pull would pay
    it. While blocked, the next check waits `every` seconds."""
    clock, calls = {"now": 0.0}, []

    def blocked(point):
        calls.append(clock["now"])
        return clock["now"] < 0.2
    pacer = Pacer([100], slack=60.0, clock=lambda: clock["now"], every=0.05)
    for now in (0.0, 0.01, 0.04, 0.06, 0.1, 0.12, 0.2):
        clock["now"] = now
        hold = pacer.hold(500, blocked)
    assert calls == [0.0, 0.06, 0.12, 0.2] and hold == 500


def test_the_paced_watermark_never_passes_where_the_subscription_is_known_read():
    """`paced_hold` caps the reader's hold (the wall clock) at the drained mark
    (`local_pubsub.Drained`): a backlog not yet pulled keeps every deadline after it."""
    from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp
    from pipelines import local_watermark
    local_watermark.pace(Pacer([500_000_000], slack=1e9, clock=lambda: 0.0, every=0.0))
    try:
        hold = Timestamp(micros=100_000_000)
        assert local_watermark.paced_hold(None, [], hold, 50.25).micros == 50_250_000
        assert local_watermark.paced_hold(None, [], hold, 150.0).micros == 100_000_000
        assert local_watermark.paced_hold(None, [], hold, float("-inf")) == MIN_TIMESTAMP
        assert local_watermark.paced_hold(None, [], hold) == hold  # no mark: the reader's
    finally:
        local_watermark.pace(None)


def test_the_deadlines_of_a_release_with_no_horizon_are_read_in_order_as_needed():
    """2^21 deadlines: computed as the pacer reads them, ascending, the same as those of a
    horizon (a lateness longer than a step interleaves the two kinds)."""
    free = TimeSteps(origin=1000.0, size=2.0, horizon="unbounded")
    known = TimeSteps(origin=1000.0, size=2.0, horizon=50)
    lazy = list(itertools.islice(deadlines(free, 3, 3.0, 3), 60))
    assert lazy == sorted(lazy) and lazy == sorted(deadlines(known, 3, 3.0, 3))[:60]
    pacer = Pacer(deadlines(free, 3, 3.0, 3), slack=1e9, clock=lambda: 0.0, every=0.0)
    assert pacer.hold(lazy[10], lambda point: point == lazy[10]) == lazy[10] - 1

"""transforms/settle.py: a step timer is armed 1 ms before its whole-ms due time, and a firing
is a first one exactly at an armed time, for any steps (fractional sizes, far origins; steps of
2 ms or less are not armed early), brute force over every step."""
from __future__ import annotations

import random

import pytest

from transforms.settle import (SETTLE_MICROS, armed, is_armed_time, release_due, settled_first,
                               step_end_due, whole_ms)
from transforms.steps import TimeSteps


@pytest.mark.parametrize("origin,size,horizon", [
    (1_700_000_000.0, 60.0, 9), (0.0, 0.1, 50), (1e9 + 0.3, 1 / 3, 40), (-5.5, 7e-6, 30),
    (1_700_000_000.123456, 3600.0, 3), (253_402_000_000.0, 0.001, 40),
    (1_700_000_000.0, 0.0021, 40), (1_700_000_000.0004, 0.0107, 40)])
@pytest.mark.parametrize("after_end", [0.0, 2.0, 0.25, 0.0107, "delay"])
def test_a_firing_is_first_exactly_at_an_armed_time(origin, size, horizon, after_end):
    steps = TimeSteps(origin, size, horizon)
    offset = 2 * size if after_end == "delay" else after_end  # a release 2 steps on

    def due(k):
        return whole_ms(int(round(steps.end(k) * 1e6)) + int(round(offset * 1e6))) \
            if after_end != "delay" else whole_ms(int(round(steps.end(k + 2) * 1e6)))

    def armed_of(k):
        return armed(due(k), steps)

    settling = size > 0.002
    arms = {armed_of(k) for k in range(horizon + 20)}  # (and after the horizon: never set)
    for k in range(horizon + 20):
        # whole ms, never before the step end + offset (64 us: float spacing near year 9999)
        assert due(k) % 1000 == 0 and due(k) >= (steps.end(k) + offset) * 1e6 - 64
        assert armed_of(k) == due(k) - (SETTLE_MICROS if settling else 0)
        # the DoFns' own due times (`release_due` for a release, `step_end_due` for a unit)
        assert due(k) == (release_due(steps, k, 2) if after_end == "delay"
                          else step_end_due(steps, k, int(round(offset * 1e6))))
    rng = random.Random(3)
    times = {a + delta for a in arms for delta in (-2, -1, 0, 1, SETTLE_MICROS, 2)}
    times.update(rng.randrange(armed_of(0) - int(10 * size * 1e6), armed_of(horizon + 10))
                 for _ in range(300))
    for fire in sorted(times):
        assert is_armed_time(fire, armed_of, steps, offset) == (fire in arms and settling), fire


def test_steps_of_two_ms_or_less_are_not_armed_early():
    """A settling millisecond could hold the next step's due time: such timers act at once."""
    steps = TimeSteps(0.0, 0.002, 10)
    due = [whole_ms(int(round(steps.end(k) * 1e6))) for k in range(10)]
    assert [armed(d, steps) for d in due] == due
    assert not any(is_armed_time(d, lambda k: due[k], steps, 0.0) for d in due)


class _Timer:
    def __init__(self):
        self.times = []

    def set(self, at):
        self.times.append(at.micros)


def test_a_first_firing_is_settled_at_its_due_time_and_a_second_is_left_to_act():
    steps = TimeSteps(1_700_000_000.0, 60.0, 5)

    def armed_of(k):
        return armed(release_due(steps, k, 1), steps)

    timer = _Timer()
    assert settled_first(timer, armed_of(3), armed_of, steps, 60.0)
    assert timer.times == [release_due(steps, 3, 1)]
    assert not settled_first(timer, release_due(steps, 3, 1), armed_of, steps, 60.0)
    assert timer.times == [release_due(steps, 3, 1)]  # the second firing sets nothing here

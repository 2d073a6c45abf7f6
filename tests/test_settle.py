"""transforms/settle.py: a firing is a timer's first exactly at a step's due time, for any
steps (fractional sizes, far origins; steps of 2 ms or less never settle), brute force over
every step."""
from __future__ import annotations

import random

import pytest

from transforms.settle import SETTLE_MICROS, is_due_time
from transforms.steps import TimeSteps


@pytest.mark.parametrize("origin,size,horizon", [
    (1_700_000_000.0, 60.0, 9), (0.0, 0.1, 50), (1e9 + 0.3, 1 / 3, 40), (-5.5, 7e-6, 30),
    (1_700_000_000.123456, 3600.0, 3), (253_402_000_000.0, 0.001, 40),
    (1_700_000_000.0, 0.0021, 40)])
@pytest.mark.parametrize("after_end", [0.0, 2.0, 0.25, "delay"])
def test_a_firing_is_first_exactly_at_a_due_time(origin, size, horizon, after_end):
    steps = TimeSteps(origin, size, horizon)
    offset = 2 * size if after_end == "delay" else after_end  # a release 2 steps on
    due = (lambda k: int(round(steps.end(k + 2) * 1e6))) if after_end == "delay" else \
        (lambda k: int(round(steps.end(k) * 1e6)) + int(round(offset * 1e6)))
    dues = {due(k) for k in range(horizon + 20)}  # (and after the horizon: never set)
    rng = random.Random(3)
    times = {d + delta for d in dues for delta in (-2, -1, 0, SETTLE_MICROS, 2)}
    low, high = due(0) - int(10 * size * 1e6), due(horizon + 10)
    times.update(rng.randrange(low, high) for _ in range(300))
    for fire in sorted(times):
        assert is_due_time(fire, due, steps, offset) == (fire in dues and size > 0.002), fire


def test_steps_of_two_ms_or_less_never_settle():
    """A second firing 1 ms on could be the next step's due time: such steps act at once."""
    steps = TimeSteps(0.0, 0.002, 10)
    due = lambda k: int(round(steps.end(k) * 1e6))  # noqa: E731
    assert not any(is_due_time(due(k), due, steps, 0.0) for k in range(10))

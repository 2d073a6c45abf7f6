"""TimeSteps: a horizon T, or none (`UNBOUNDED`: the steps a release can reach)."""
from __future__ import annotations

import pytest

from transforms.steps import UNBOUNDED, UNBOUNDED_STEPS, TimeSteps

YEAR_10000 = 253402300800.0


def test_no_horizon_reaches_two_to_the_twenty_steps_or_the_year_10000():
    hourly = TimeSteps(0.0, 3600.0, UNBOUNDED)
    assert hourly.unbounded and hourly.horizon == UNBOUNDED_STEPS
    assert hourly.step_of(3600.0 * (UNBOUNDED_STEPS - 1)) == UNBOUNDED_STEPS - 1
    assert hourly.step_of(3600.0 * UNBOUNDED_STEPS) is None
    weekly = TimeSteps(0.0, 7 * 86400.0, UNBOUNDED)  # 2^20 weeks end after the year 9999
    assert weekly.horizon < UNBOUNDED_STEPS
    assert weekly.end(weekly.horizon - 1) <= YEAR_10000 < weekly.end(weekly.horizon)


def test_no_horizon_is_part_of_the_steps_identity():
    free = TimeSteps(0.0, 60.0, UNBOUNDED)
    fixed = TimeSteps(0.0, 60.0, free.horizon)
    assert free != fixed and not fixed.unbounded  # a release's binding tells them apart
    assert TimeSteps(0.0, 60.0, free.horizon, True) == free
    assert (free.shown_horizon, fixed.shown_horizon) == (UNBOUNDED, free.horizon)


@pytest.mark.parametrize("horizon,unbounded", [(10, True), ("forever", False)])
def test_other_horizons_are_refused(horizon, unbounded):
    with pytest.raises(ValueError, match=r"^`horizon` must be "):
        TimeSteps(0.0, 60.0, horizon, unbounded)

"""Time steps: event-time fixed windows of `size` seconds from `origin`, T steps, or with no
horizon (`UNBOUNDED`): steps until the horizon-free mechanisms' limit (2^20 steps) or the year
10000, whichever comes first, released by a mechanism whose outputs, calibration and state at
step t do not depend on how many steps follow (`ContinualMechanism.horizon_free`).

The step is a pure function of the event timestamp (window [origin + s size, origin + (s+1) size)),
computed directly instead of with WindowInto, which costs a windowing pass per element; the
semantics are those of FixedWindows(size, offset=origin).
"""
from __future__ import annotations

import dataclasses
import datetime
import math
import numbers
from typing import Optional

from transforms import validation as check

UNBOUNDED = "unbounded"  # a horizon: no last step fixed in advance
UNBOUNDED_STEPS = 1 << 20  # the most steps one release with no horizon reaches (the discrete
#                            horizon-free factorization's limit: 120 years of hourly steps)
_LAST_TIME = 253402300799.0  # the end of the year 9999 (what timestamps can print)


def _seconds(name, value) -> float:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            check.fail(name, "a timezone-aware datetime or seconds since the epoch", value)
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        check.fail(name, "a timezone-aware datetime or seconds since the epoch", value)
    return float(value)


@dataclasses.dataclass(frozen=True)
class TimeSteps:
    """`horizon` steps of `size` seconds starting at `origin` (seconds since the epoch).

    `horizon` UNBOUNDED: no horizon (`unbounded` is True, and `horizon` is how many steps the
    release can reach: UNBOUNDED_STEPS, or fewer when they would end after the year 9999).

    >>> steps = TimeSteps(0.0, 3600.0, UNBOUNDED)
    >>> steps.unbounded, steps.horizon == UNBOUNDED_STEPS, steps.step_of(7200.0)
    (True, True, 2)
    """
    origin: float
    size: float
    horizon: int
    unbounded: bool = False

    def __post_init__(self):
        object.__setattr__(self, "origin", _seconds("origin", self.origin))
        object.__setattr__(self, "size", check.positive_finite("step_size", self.size))
        if self.horizon == UNBOUNDED or self.unbounded:
            if self.horizon not in (UNBOUNDED, self.reach()):
                check.fail("horizon", f"{UNBOUNDED!r} for steps with no horizon", self.horizon)
            object.__setattr__(self, "horizon", self.reach())
            object.__setattr__(self, "unbounded", True)
            return
        object.__setattr__(self, "horizon", check.integer_at_least("horizon", self.horizon, 1))

    def reach(self) -> int:
        """The steps a release with no horizon can reach (`UNBOUNDED_STEPS`, or those ending
        before the year 10000)."""
        steps = math.floor((_LAST_TIME - self.origin) / self.size)
        if steps < 1:
            check.fail("origin", "a time whose first step ends before the year 10000",
                       self.origin)
        return min(UNBOUNDED_STEPS, steps)

    @property
    def shown_horizon(self):
        """The horizon as configs and release descriptors say it: T, or UNBOUNDED."""
        return UNBOUNDED if self.unbounded else self.horizon

    def step_of(self, timestamp_seconds: float) -> Optional[int]:
        """The step holding the timestamp, or None outside [origin, origin + T size)."""
        step = math.floor((timestamp_seconds - self.origin) / self.size)
        return step if 0 <= step < self.horizon else None

    def start(self, step: int) -> float:
        return self.origin + step * self.size

    def end(self, step: int) -> float:
        return self.origin + (step + 1) * self.size

    @property
    def stop(self) -> float:
        return self.end(self.horizon - 1)

    @staticmethod
    def iso(seconds: float) -> str:
        try:
            return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat()
        except (ValueError, OverflowError, OSError):  # beyond the years 1..9999
            return f"{seconds!r} s since the epoch"

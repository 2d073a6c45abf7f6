"""Time steps: event-time fixed windows of `size` seconds from `origin`, T steps.

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
    """`horizon` steps of `size` seconds starting at `origin` (seconds since the epoch)."""
    origin: float
    size: float
    horizon: int

    def __post_init__(self):
        object.__setattr__(self, "origin", _seconds("origin", self.origin))
        object.__setattr__(self, "size", check.positive_finite("step_size", self.size))
        object.__setattr__(self, "horizon", check.integer_at_least("horizon", self.horizon, 1))

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

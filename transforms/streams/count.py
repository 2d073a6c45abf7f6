"""Plain continual count / sum per public key with per-unit contribution caps.

Each privacy unit (user) contributes at most `max_contributions_per_step` events (for sums: value
mass, the sum of |value| with each value clamped to [`min_value`, `max_value`], min_value 0 by
default) per step and `max_contributions` over the whole horizon, across all keys, to at most
`max_keys_per_unit` keys. Deterministic drops:
- keys: a unit keeps the first `max_keys_per_unit` keys it uses, by step of first use, ties in
  canonical key order; events for other keys are dropped;
- events within a step: taken in canonical (key, value) order until a cap is reached; for sums
  the event that crosses a cap is cut to what is left (its magnitude; it keeps its sign).
One unit then changes each key's difference stream by a vector with l1 <= k, hence interval sums
in [-k, k]: S_{k,k} (Andersson et al. 2026 Sec. 6.2 define S_{D,k} for integer vectors of any
sign; not the alternating S_{1,k}), on at most max_keys_per_unit keys; the vector is
non-negative when min_value >= 0.
Both caps hold across keys (`used` and the step's total are one budget per unit, not per key):
the unit's vectors v_1..v_m satisfy sum_j ||v_j||_1 <= k and sum_j |v_j[t]| <= per-step cap, which
is what the joint calibration over keys uses (`Declaration.joint_mass` = k, see records.py).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Hashable, Optional, Sequence, Tuple

from transforms import validation as check

from .records import canonical


@dataclasses.dataclass(frozen=True)
class UnitState:
    used: float = 0.0
    keys: Tuple[Hashable, ...] = ()


# what cut a dropped event, named by its bound (operator-only counts: they depend on the data)
KEY_CAP, HORIZON_CAP, STEP_CAP = ("max_keys_per_unit", "max_contributions",
                                  "max_contributions_per_step")


@dataclasses.dataclass(frozen=True)
class ContributionBounds:
    max_contributions: int
    max_contributions_per_step: Optional[int] = None
    max_keys_per_unit: int = 1
    max_value: Optional[float] = None  # sums only
    min_value: Optional[float] = None  # sums only: None is 0 (values clamped to [0, max_value])

    def __post_init__(self):
        check.integer_at_least("max_contributions", self.max_contributions, 1)
        if self.max_contributions_per_step is not None:
            check.integer_at_least("max_contributions_per_step",
                                   self.max_contributions_per_step, 1)
        check.integer_at_least("max_keys_per_unit", self.max_keys_per_unit, 1)
        if self.max_value is not None:
            check.positive_finite("max_value", self.max_value)
        if self.min_value is not None:
            if self.max_value is None:
                check.fail("min_value", "None without a max_value (counts take no values)",
                           self.min_value)
            check.finite_number("min_value", self.min_value)
            if not self.min_value < self.max_value:
                check.fail("min_value", f"below max_value ({self.max_value})", self.min_value)

    @property
    def per_step(self) -> float:
        cap = self.max_contributions_per_step
        return float(self.max_contributions if cap is None else min(cap, self.max_contributions))

    @property
    def least(self) -> Optional[float]:
        """The smallest value kept (sums: min_value, 0 by default; None for counts)."""
        if self.max_value is None:
            return None
        return 0.0 if self.min_value is None else float(self.min_value)

    @property
    def limits(self) -> Tuple[float, int, Optional[float], int, Optional[float]]:
        """(per_step, max_contributions, max_value, max_keys_per_unit, least): `truncate_step`'s
        arguments."""
        return (self.per_step, self.max_contributions, self.max_value, self.max_keys_per_unit,
                self.least)


def magnitude(max_value: float, min_value: Optional[float] = None) -> float:
    """The largest |value| a range keeps: max(|min_value|, max_value) (min_value 0 if None)."""
    return max(max_value, abs(min_value or 0.0))


def value_resolution(max_value: float, given: Optional[float], noise: str,
                     min_value: Optional[float] = None) -> Optional[float]:
    """A sum's value grid g (ContinualSum, ContinualMean, `pipelines.plan`): the given one
    (positive, at most the largest magnitude max(|min_value|, max_value)), else that magnitude
    / 100 with discrete noise (integer grid units), else None (float noise: no grid).

    >>> value_resolution(120.0, None, "discrete", min_value=-60.0)
    1.2
    >>> value_resolution(50.0, None, "discrete", min_value=-200.0)
    2.0
    """
    largest = magnitude(max_value, min_value)
    if given is not None:
        check.positive_finite("value_resolution", given)
        if given > largest:
            limit = "max_value" if min_value is None else "max(|min_value|, max_value)"
            check.fail("value_resolution", f"<= {limit} ({largest})", given)
        return given
    return largest / 100.0 if noise == "discrete" else None


def _grid_units(value: float, g: float, inward) -> float:
    """value / g as whole grid units: the nearest integer when the quotient is one up to float
    rounding (120 / 1.2 = 99.99999999999999 is 100), else rounded by `inward`."""
    quotient = value / g
    nearest = round(quotient)
    if abs(quotient - nearest) <= 1e-9 * max(1.0, abs(quotient)):
        return float(nearest)
    return float(inward(quotient))


def grid_range(least: float, most: float, g: float) -> Tuple[float, float]:
    """[least, most] in whole grid units of g, rounded toward the inside: a value clamped to
    the result and put on the grid stays within [least, most] (the mean's interval assumes
    it). Refuses a grid that leaves a side of the range no grid unit (its values would all be
    0) or the range fewer than two grid points.

    >>> grid_range(-60.0, 120.0, 1.2)
    (-50.0, 100.0)
    >>> grid_range(-2.0, 300.0, 3.0)
    Traceback (most recent call last):
    ...
    transforms.validation.ValidationError: `value_resolution` must be at most |min_value| (2) so negative values keep a grid unit (default: max(|min_value|, max_value) / 100); got 3.0.
    """
    low, high = _grid_units(least, g, math.ceil), _grid_units(most, g, math.floor)
    default = "(default: max(|min_value|, max_value) / 100)"
    if high < 1:
        check.fail("value_resolution", f"at most max_value ({most:g}) so values keep a grid "
                                       f"unit {default}", g)
    if least < 0 and low > -1:
        check.fail("value_resolution", f"at most |min_value| ({-least:g}) so negative values "
                                       f"keep a grid unit {default}", g)
    if low >= high:
        check.fail("value_resolution", f"small enough for two grid points in [min_value, "
                                       f"max_value] ([{least:g}, {most:g}])", g)
    return low, high


def _event_order(event):
    return canonical(event[0]), event[1]


def _key_order(kv):
    return canonical(kv[0])


def truncate_step(limits: tuple, keys: list, used: float, step: int, events: Sequence,
                  out: list, dropped: Optional[dict]) -> float:
    """The count and sum truncation rule: one unit's events (key, value) of one step.

    Admits keys first come (ties in canonical key order) up to `max_keys_per_unit`, then takes
    the events in canonical (key, value) order while the per-step and horizon caps have room
    (a sum's value is clamped to [0, max_value] and cut to the room left; a count event that
    does not fit is dropped whole). Appends the step's contributions (key, step, value), one
    per key in canonical key order, to `out`; admits keys into `keys` in place; counts dropped
    events by the bound that cut them into `dropped` (if not None); returns the new `used`.

    Args:
      limits: `ContributionBounds.limits` (a sum's values are clamped to [least, max_value];
        an event's mass is its clamped value's magnitude).
      keys: the unit's admitted keys (updated in place).
      used: the unit's contribution mass so far.
      step, events: the step and its events, in any order (the rule orders them).

    Returns:
      The unit's contribution mass after the step.

    >>> out = []
    >>> truncate_step((2.0, 3, None, 1, None), [], 0.0, 0, [("a", 1.0)] * 3 + [("b", 1.0)],
    ...               out, None)
    2.0
    >>> out
    [('a', 0, 2.0)]
    >>> signed = []   # a sum in [-5, 5]: mass 4 + 3 = 7 > 6, so 3 is cut to 2 (signs kept)
    >>> truncate_step((6.0, 6, 5.0, 1, -5.0), [], 0.0, 0, [("a", 3.0), ("a", -4.0)], signed,
    ...               None)
    6.0
    >>> signed
    [('a', 0, -2.0)]
    """
    if len(events) == 1:  # one event (most steps of most units)
        return truncate_one(limits, keys, used, step, events[0], out, dropped)
    return truncate_events(limits, keys, used, step, events, out, dropped)


def truncate_events(limits: tuple, keys: list, used: float, step: int, events: Sequence,
                     out: list, dropped: Optional[dict]) -> float:
    """`truncate_step` written out: the reference rule for any number of events."""
    per_step, total, most, max_keys, least = limits
    if len(keys) < max_keys:
        seen = {key for key, _ in events}
        for key in (seen if len(seen) == 1 else sorted(seen, key=canonical)):
            if key not in keys and len(keys) < max_keys:
                keys.append(key)
    if total - used <= 0:  # no room left: every event of the step is dropped
        if dropped is not None:
            for key, _ in events:
                reason = HORIZON_CAP if key in keys else KEY_CAP
                dropped[reason] = dropped.get(reason, 0) + 1
        return used
    taken: Dict[Any, float] = {}
    step_used = 0.0
    for key, value in sorted(events, key=_event_order):
        if key not in keys:
            if dropped is not None:
                dropped[KEY_CAP] = dropped.get(KEY_CAP, 0) + 1
            continue
        amount = value if most is None else min(max(value, least), most)
        step_room, horizon_room = per_step - step_used, total - used
        room = min(step_room, horizon_room)
        mass = abs(amount)
        if mass == 0:  # a zero value: nothing to take, and nothing cut
            continue
        take = min(mass, room) if most is not None else (mass if mass <= room else 0.0)
        if take <= 0:
            if dropped is not None:
                reason = HORIZON_CAP if horizon_room <= step_room else STEP_CAP
                dropped[reason] = dropped.get(reason, 0) + 1
            continue
        taken[key] = taken.get(key, 0.0) + (take if amount > 0 else -take)
        step_used += take
        used += take
    if len(taken) == 1:
        for key, value in taken.items():
            out.append((key, step, value))
    elif taken:
        out.extend((key, step, value) for key, value in sorted(taken.items(), key=_key_order))
    return used


def truncate_one(limits: tuple, keys: list, used: float, step: int, event, out: list,
                  dropped: Optional[dict]) -> float:
    """`truncate_events` of a single event, unrolled: it is most of truncation's per-event
    cost in streaming (tests/streams/test_count.py checks it equals the rule)."""
    per_step, total, most, max_keys, least = limits
    key, value = event
    if len(keys) < max_keys and key not in keys:
        keys.append(key)
    if total - used <= 0:
        reason = HORIZON_CAP if key in keys else KEY_CAP
    elif key not in keys:
        reason = KEY_CAP
    else:
        amount = value if most is None else min(max(value, least), most)
        step_room, horizon_room = per_step - 0.0, total - used
        room = min(step_room, horizon_room)
        mass = abs(amount)
        if mass == 0:  # a zero value: nothing to take, and nothing cut
            return used
        take = min(mass, room) if most is not None else (mass if mass <= room else 0.0)
        if take <= 0:
            reason = HORIZON_CAP if horizon_room <= step_room else STEP_CAP
        else:
            out.append((key, step, 0.0 + (take if amount > 0 else -take)))
            return used + take
    if dropped is not None:
        dropped[reason] = dropped.get(reason, 0) + 1
    return used

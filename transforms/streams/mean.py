"""The running mean's units: one truncation, two difference streams (a sum and a count).

A unit's events (unit, key, value) are truncated by the count rule (`count.truncate_step` on
the events counted as 1: at most `max_contributions` events over the horizon, at most
`max_contributions_per_step` per step, across at most `max_keys_per_unit` keys), and the events
kept of a key at a step are its n smallest clamped values, n the count the rule kept (the
canonical (key, value) order the count rule takes events in). The count part releases n, the
sum part the sum of those values, so the bounds are stated once and mean the same for both:
one unit changes the count stream by a non-negative vector of l1 <= k and the sum stream by a
vector of l1 <= k M, M = max(|min_value|, max_value) (S_{k,k} and S_{kM,kM}, in grid units
for sums; signed when min_value < 0), over at most `max_keys_per_unit` keys. Imports no
Beam.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence, Tuple

from transforms import validation as check
from transforms.mechanisms.base import EXACT_LIMIT, EXACT_LIMIT_TEXT

from .count import grid_range, truncate_step
from .records import Declaration
from .units import CountProblem

SUM, COUNT = "sum", "count"
PARTS = (SUM, COUNT)


def mean_step(part: str, value_range: Tuple[float, float], limits: tuple, keys: list,
              used: float, step: int, events: Sequence, out: list,
              dropped: Optional[dict]) -> float:
    """The mean's truncation rule, one unit and one step: `truncate_step` on the events counted
    as 1 decides how many events n each key keeps; the part's contribution of a key is n
    (COUNT) or the sum of the key's n smallest values clamped to `value_range` (SUM).
    Same arguments and result as `truncate_step`.

    >>> out = []
    >>> mean_step(SUM, (0.0, 10.0), (2.0, 3, None, 1, None), [], 0.0, 0,
    ...           [("a", 7.0), ("a", 50.0), ("a", 1.0)], out, None)
    2.0
    >>> out   # two events kept: the two smallest values, 1 + 7
    [('a', 0, 8.0)]
    """
    counted: list = []
    used = truncate_step(limits, keys, used, step, [(key, 1.0) for key, _ in events],
                         counted, dropped)
    if part == COUNT or not counted:
        out.extend(counted)
        return used
    low, high = value_range
    for key, at, kept in counted:
        values = sorted(min(max(value, low), high) for k, value in events if k == key)
        out.append((key, at, float(sum(values[:int(kept)]))))
    return used


@dataclasses.dataclass
class MeanProblem(CountProblem):
    """One part (SUM or COUNT) of a running mean: elements (unit, key, value); `bounds` in
    events (`max_value` unset: the count rule), values clamped to [min_value, max_value]
    (min_value 0 by default) and, with `value_grid` g, rounded to the nearest multiple of g
    (payloads and the sum part's declaration in grid units)."""
    part: str = SUM
    columnar = False  # its own step rule (`mean_step`), not the count rule's

    def __post_init__(self):
        check.one_of("part", self.part, PARTS)
        if not self.with_value or self.max_value is None or self.bounds.max_value is not None:
            check.fail("bounds", "event counts (no max_value) with a value stream and its "
                                 "max_value", self.bounds)
        super().__post_init__()
        grid = self.value_grid
        least = self.min_value or 0.0
        # in grid units, rounded toward the inside: a kept value, on the grid, stays in
        # [min_value, max_value], where the mean's interval looks for the mean
        self.value_range = (float(least), float(self.max_value)) if grid is None \
            else grid_range(least, self.max_value, grid)
        k = self.bounds.max_contributions
        if self.part == SUM:
            # an integer (exact in grid units)
            mass = math.ceil(k * max(abs(self.value_range[0]), self.value_range[1]))
            if grid is not None and not mass < EXACT_LIMIT:
                check.fail("value_resolution", f"large enough that max_contributions x "
                                               f"max_value / value_resolution < "
                                               f"{EXACT_LIMIT_TEXT} (exact in float64)", grid)
            # one unit: l1 <= k * cap on the sum streams of its keys (`mean_step`)
            self.declaration = Declaration(mass, mass, self.bounds.max_keys_per_unit, "user",
                                           joint_mass=mass)
        else:
            self.declaration = dataclasses.replace(self.declaration, joint_mass=k)

    def key_mass(self, payload) -> int:
        return 1 if self.part == COUNT else int(payload[1])  # an event, or its grid value

    def truncate(self, limits, keys, used, step, events, out, dropped):
        return mean_step(self.part, self.value_range, limits, keys, used, step, events, out,
                         dropped)

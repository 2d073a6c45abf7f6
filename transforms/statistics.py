"""The statistics: one `ContinualBase` per registry row (`transforms.registry`), each naming
its truncation (`make_problem`) and its contribution bounds (`bounds`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from transforms import validation as check
from transforms.continual import ContinualBase
from transforms.streams import ContributionBounds, count_distinct
from transforms.streams.count import value_resolution as grid_of
from transforms.streams.records import Declaration
from transforms.streams.units import (CountProblem, DeclaredProblem, DegreeProblem,
                                      EntityProblem, TriangleProblem)


def _across_keys(problem: CountProblem) -> CountProblem:
    """Counts and sums: `max_contributions` (in grid units for sums) caps one unit's total
    over the horizon across ALL its keys (`streams.count.truncate_step` keeps one `used` per unit),
    so the declaration carries it as the joint mass: the release may calibrate jointly."""
    problem.declaration = dataclasses.replace(
        problem.declaration, joint_mass=problem.bounds.max_contributions)
    return problem


class ContinualCount(ContinualBase):
    """Running count per public key (or per key selected privately, without public_keys);
    elements (unit, key) timestamped with event time.

    Each unit (user) contributes at most `max_contributions_per_step` events per step and
    `max_contributions` over the horizon to at most `max_keys_per_unit` keys."""

    selects_keys = True

    def __init__(self, *, max_contributions: int = 1, max_contributions_per_step=None,
                 max_keys_per_unit: int = 1, **kwargs):
        self.contribution_bounds = ContributionBounds(max_contributions,
                                                      max_contributions_per_step,
                                                      max_keys_per_unit)
        super().__init__(**kwargs)

    def make_problem(self):
        return _across_keys(CountProblem(self.contribution_bounds))

    def bounds(self):
        return dataclasses.asdict(self.contribution_bounds)


class ContinualSum(ContinualBase):
    """Running sum per public key; elements (unit, key, value); values clamped to
    [0, max_value], at most `max_contributions` value mass per unit over the horizon.

    With discrete noise (the default) values are rounded to the grid `value_resolution` g
    (default max_value / 100) after clamping; truncation, sensitivity and noise work in integer
    units of g, so the release is exact integers times g (see docs/privacy.md).
    One unit's total and `max_value` must stay below 2^53 grid units (exact in float64)."""

    selects_keys = True

    def __init__(self, *, max_value: float, max_contributions: int = 1,
                 max_contributions_per_step=None, max_keys_per_unit: int = 1,
                 value_resolution: Optional[float] = None, **kwargs):
        self.contribution_bounds = ContributionBounds(max_contributions,
                                                      max_contributions_per_step,
                                                      max_keys_per_unit, max_value=max_value)
        self.value_resolution = grid_of(max_value, value_resolution,
                                        kwargs.get("noise", "discrete"))
        super().__init__(**kwargs)

    @property
    def value_scale(self):
        return self.value_resolution or 1.0

    def make_problem(self):
        bounds, g = self.contribution_bounds, self.value_resolution
        if g is None:
            return _across_keys(CountProblem(bounds, with_value=True))
        per_step = bounds.max_contributions_per_step
        units = ContributionBounds(
            max(1, math.floor(bounds.max_contributions / g)),
            None if per_step is None else max(1, math.floor(per_step / g)),
            bounds.max_keys_per_unit, max_value=float(math.floor(bounds.max_value / g)))
        return _across_keys(CountProblem(units, with_value=True, value_grid=g,
                                         max_value=bounds.max_value))

    def bounds(self):
        return {**dataclasses.asdict(self.contribution_bounds),
                "value_resolution": self.value_resolution}


class ContinualCountDistinct(ContinualBase):
    """Distinct present items per key; elements (op, item, key), op '+' / '-'; item-level
    privacy with flippancy bound `max_flips` (S_{1,k})."""

    selects_keys = True

    def __init__(self, *, max_flips: int, max_keys_per_unit: int = 1, semantics="count",
                 **kwargs):
        self.machine = count_distinct(max_flips, semantics)
        self.max_flips, self.semantics = max_flips, semantics
        self.max_keys_per_unit = check.integer_at_least("max_keys_per_unit",
                                                        max_keys_per_unit, 1)
        super().__init__(**kwargs)

    def make_problem(self):
        return EntityProblem(self.machine, self.max_keys_per_unit)

    def bounds(self):
        return {"max_flips": self.max_flips, "max_keys_per_unit": self.max_keys_per_unit,
                "semantics": self.semantics}


class ContinualDegreeCount(ContinualBase):
    """Degree of every public node; elements (op, (a, b)); edge-level privacy with degree
    contribution bound `max_updates`; each node's counter gets half the budget (Cor. 6.15)."""

    def __init__(self, *, max_updates: int, **kwargs):
        self.max_updates = check.integer_at_least("max_updates", max_updates, 1)
        super().__init__(**kwargs)

    def make_problem(self):
        return DegreeProblem(self.max_updates)

    def bounds(self):
        return {"max_updates": self.max_updates}


class ContinualTriangleCount(ContinualBase):
    """Triangle count of one graph; elements (op, (a, b)). Private only for graph streams with
    maximum degree <= `max_degree` and triangle contribution <= `max_contribution`; the first
    violation halts the release (no record for that step or later) and goes to dead letters."""

    def __init__(self, *, max_degree: int, max_contribution: int, **kwargs):
        self.max_degree = check.integer_at_least("max_degree", max_degree, 1)
        self.max_contribution = check.integer_at_least("max_contribution", max_contribution, 1)
        given = kwargs.setdefault("public_keys", ["triangles"])
        if list(given) != ["triangles"]:
            check.fail("public_keys", "['triangles'] (the one key of a triangle count)", given)
        super().__init__(**kwargs)

    def make_problem(self):
        return TriangleProblem(self.max_degree, self.max_contribution)

    def bounds(self):
        return {"max_degree": self.max_degree, "max_contribution": self.max_contribution}


class ContinualRelease(ContinualBase):
    """Release already-computed difference values: elements (key, value) with event time; the
    caller declares that one protected unit changes each key's stream by a vector of S_{D,k}
    and touches at most `keys_per_unit` keys (no truncation is applied here).

    With discrete noise (the default) values are integers with |value| <= 2^53, summed
    exactly: a key whose step total, running total or released value would reach 2^53 in
    magnitude (where float64 stops adding integers exactly) halts at that step, with an
    "exact totals" dead letter (`RecordMaker.exact_totals`)."""

    nonnegative_truth = False  # declared differences of any sign

    def __init__(self, *, max_contributions: int = 1, interval_bound: int = 1,
                 keys_per_unit: int = 1, **kwargs):
        self.declaration = Declaration(
            check.integer_at_least("interval_bound", interval_bound, 1),
            check.integer_at_least("max_contributions", max_contributions, 1),
            check.integer_at_least("keys_per_unit", keys_per_unit, 1), "declared")
        super().__init__(**kwargs)

    def bounds(self):
        return {"max_contributions": self.declaration.max_contributions,
                "interval_bound": self.declaration.interval_bound,
                "keys_per_unit": self.declaration.keys_per_unit}

    def make_problem(self):
        return DeclaredProblem(self.declaration, integers=self.noise_kind == "discrete")

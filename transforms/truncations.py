"""Each statistic's truncation, as its registry row names it (`TransformSpec.truncation`): the
statistic's bounds -> a `Truncation` (the per-unit rule `Problem`, the bounds the release
descriptor records, the value scale of its released units). `release_plan.plan_release`
calibrates every statistic from it alike; the Beam classes (`transforms.statistics`) only name
their row. Imports no Beam.

>>> count(max_contributions=3).bounds
{'max_contributions': 3, 'max_contributions_per_step': None, 'max_keys_per_unit': 1, 'max_value': None}
>>> total = sum_(max_value=10.0)
>>> total.value_scale, total.grid, total.problem.declaration.interval_bound
(0.1, True, 10)
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, NamedTuple, Optional

from transforms import validation as check
from transforms.streams import ContributionBounds, count_distinct as distinct_machine
from transforms.streams.count import grid_range, magnitude, value_resolution as grid_of
from transforms.streams.mean import COUNT, PARTS, SUM, MeanProblem
from transforms.streams.records import Declaration
from transforms.streams.units import (CountProblem, DeclaredProblem, DegreeProblem,
                                      EntityProblem, Problem, TriangleProblem)


class MeanParts(NamedTuple):
    """A composed release (a mean): its parts' truncations, in `PARTS` order, and what the
    composition needs (the value range, the sum part's configured share of the budget)."""
    parts: Dict[str, "Truncation"]
    max_value: float
    sum_share: Optional[float]
    min_value: float = 0.0

    @property
    def magnitude(self) -> float:
        """The largest |mean| the range allows: max(|min_value|, max_value)."""
        return magnitude(self.max_value, self.min_value)


@dataclasses.dataclass(frozen=True)
class Truncation:
    problem: Problem               # the per-unit rule; its `declaration` calibrates the release
    bounds: Dict[str, Any]         # the release descriptor's "bounds"
    value_scale: float = 1.0       # records = scale x released units (a sum's grid)
    grid: bool = False             # values are released in grid units (refusals say so)
    nonnegative_truth: bool = True  # every true running total is >= 0 (`postprocess` may clamp)
    composed: Optional[MeanParts] = None  # a release of several parts (a mean)


def _across_keys(problem: CountProblem) -> CountProblem:
    """Counts and sums: `max_contributions` (in grid units for sums) caps one unit's total
    over the horizon across ALL its keys (`streams.count.truncate_step` keeps one `used` per
    unit), so the declaration carries it as the joint mass: the release may calibrate
    jointly."""
    problem.declaration = dataclasses.replace(
        problem.declaration, joint_mass=problem.bounds.max_contributions)
    return problem


def count(*, max_contributions: int = 1, max_contributions_per_step=None,
          max_keys_per_unit: int = 1, noise: str = "discrete") -> Truncation:
    """Each unit (user) contributes at most `max_contributions_per_step` events per step and
    `max_contributions` over the horizon to at most `max_keys_per_unit` keys."""
    bounds = ContributionBounds(max_contributions, max_contributions_per_step,
                                max_keys_per_unit)
    return Truncation(_across_keys(CountProblem(bounds)), _described(bounds))


def _described(bounds: ContributionBounds, **more) -> Dict[str, Any]:
    """The release descriptor's bounds: min_value only when below 0 (a release without it
    describes, and so binds, the same bytes as before it existed)."""
    described = {**dataclasses.asdict(bounds), **more}
    if not described.get("min_value"):
        described.pop("min_value", None)
    return described


def sum_(*, max_value: float, min_value: Optional[float] = None, max_contributions: int = 1,
         max_contributions_per_step=None, max_keys_per_unit: int = 1,
         value_resolution: Optional[float] = None, noise: str = "discrete") -> Truncation:
    """Values clamped to [min_value, max_value] (min_value 0 by default), at most
    `max_contributions` value mass (the sum of |value|) per unit over the horizon; with
    discrete noise rounded to the grid g = `value_resolution` (default max(|min_value|,
    max_value) / 100): truncation, sensitivity and noise then work in integer units of g.

    >>> signed = sum_(min_value=-60.0, max_value=120.0, max_contributions=600)
    >>> signed.value_scale, signed.problem.bounds.limits, signed.nonnegative_truth
    (1.2, (500.0, 500, 100.0, 1, -50.0), False)
    """
    bounds = ContributionBounds(max_contributions, max_contributions_per_step,
                                max_keys_per_unit, max_value=max_value,
                                min_value=None if not min_value else min_value)
    g = grid_of(max_value, value_resolution, noise, min_value=bounds.min_value)
    described = _described(bounds, value_resolution=g)
    nonnegative = bounds.least >= 0
    if g is None:
        return Truncation(_across_keys(CountProblem(bounds, with_value=True)), described,
                          nonnegative_truth=nonnegative)
    per_step = bounds.max_contributions_per_step
    least, most = grid_range(bounds.least, bounds.max_value, g)  # inside the range
    units = ContributionBounds(
        max(1, math.floor(bounds.max_contributions / g)),
        None if per_step is None else max(1, math.floor(per_step / g)),
        bounds.max_keys_per_unit, max_value=most,
        min_value=None if bounds.min_value is None else least)
    return Truncation(_across_keys(CountProblem(units, with_value=True, value_grid=g,
                                                max_value=bounds.max_value,
                                                min_value=bounds.min_value)),
                      described, value_scale=g, grid=True, nonnegative_truth=nonnegative)


def mean(*, max_value: float, min_value: Optional[float] = None, max_contributions: int = 1,
         max_contributions_per_step=None, max_keys_per_unit: int = 1,
         value_resolution: Optional[float] = None, sum_share: Optional[float] = None,
         noise: str = "discrete") -> Truncation:
    """One rule (`streams.mean`) keeps at most `max_contributions` events per unit (values
    clamped to [min_value, max_value], min_value 0 by default, on the grid with discrete
    noise); its SUM and COUNT parts are released under one release. The mean's own problem is
    the count part's (both parts run one rule on the same events, so their unit states are
    equal)."""
    bounds = ContributionBounds(max_contributions, max_contributions_per_step,
                                max_keys_per_unit)
    max_value = check.positive_finite("max_value", max_value)
    least = 0.0
    if min_value:  # as a sum's bounds check it
        least = ContributionBounds(1, max_value=max_value, min_value=min_value).least
    g = grid_of(max_value, value_resolution, noise, min_value=least or None)
    share = None if sum_share is None else check.open_unit_interval("sum_share", sum_share)
    described = _described(bounds, max_value=max_value, value_resolution=g)
    if least:
        described["min_value"] = least

    def part(name):
        return Truncation(MeanProblem(bounds, with_value=True, value_grid=g,
                                      max_value=max_value, min_value=least or None,
                                      part=name),
                          {**described, "part": name},
                          value_scale=(g or 1.0) if name == SUM else 1.0, grid=g is not None,
                          nonnegative_truth=name == COUNT or least >= 0)
    parts = {name: part(name) for name in PARTS}
    return Truncation(parts[COUNT].problem, described, grid=g is not None,
                      composed=MeanParts(parts, max_value, share, least))


def count_distinct(*, max_flips: int, max_keys_per_unit: int = 1, semantics="count",
                   noise: str = "discrete") -> Truncation:
    """Item-level privacy with flippancy bound `max_flips` (S_{1,k})."""
    machine = distinct_machine(max_flips, semantics)
    keys = check.integer_at_least("max_keys_per_unit", max_keys_per_unit, 1)
    return Truncation(EntityProblem(machine, keys), {"max_flips": max_flips,
                                                     "max_keys_per_unit": keys,
                                                     "semantics": semantics})


def degree_count(*, max_updates: int, noise: str = "discrete") -> Truncation:
    """Edge-level privacy with degree contribution bound `max_updates`; each node's counter
    gets half the budget (Fichtenberger et al. 2023, Cor. 6.15)."""
    updates = check.integer_at_least("max_updates", max_updates, 1)
    return Truncation(DegreeProblem(updates), {"max_updates": updates})


def triangle_count(*, max_degree: int, max_contribution: int,
                   noise: str = "discrete") -> Truncation:
    """Private only for graph streams with maximum degree <= `max_degree` and triangle
    contribution <= `max_contribution`; the first violation halts the release."""
    degree = check.integer_at_least("max_degree", max_degree, 1)
    contribution = check.integer_at_least("max_contribution", max_contribution, 1)
    return Truncation(TriangleProblem(degree, contribution),
                      {"max_degree": degree, "max_contribution": contribution})


def release(*, max_contributions: int = 1, interval_bound: int = 1, keys_per_unit: int = 1,
            noise: str = "discrete") -> Truncation:
    """Already-computed differences: the caller declares that one unit changes each key's
    stream by a vector of S_{D,k} and touches at most `keys_per_unit` keys (no truncation)."""
    declaration = Declaration(
        check.integer_at_least("interval_bound", interval_bound, 1),
        check.integer_at_least("max_contributions", max_contributions, 1),
        check.integer_at_least("keys_per_unit", keys_per_unit, 1), "declared")
    return Truncation(DeclaredProblem(declaration, integers=noise == "discrete"),
                      {"max_contributions": declaration.max_contributions,
                       "interval_bound": declaration.interval_bound,
                       "keys_per_unit": declaration.keys_per_unit},
                      nonnegative_truth=False)  # declared differences of any sign

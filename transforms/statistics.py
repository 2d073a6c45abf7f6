"""The statistics: one `ContinualBase` per registry row (`transforms.registry`). A class only
names its row: the row names its bounds and its truncation (`transforms.truncations`), and
`release_plan.plan_release` calibrates every statistic alike. Bounds are keyword arguments
beside the release's (`ReleaseSpec`): e.g. `ContinualCount(max_contributions=10, ...)`.
"""
from __future__ import annotations

from transforms.continual import ContinualBase


class ContinualCount(ContinualBase):
    """Running count per public key (or per key selected privately, without public_keys);
    elements (unit, key) timestamped with event time.

    Each unit (user) contributes at most `max_contributions_per_step` events per step and
    `max_contributions` over the horizon (default 1) to at most `max_keys_per_unit` keys
    (default 1)."""

    statistic = "count"


class ContinualSum(ContinualBase):
    """Running sum per public key; elements (unit, key, value); values clamped to
    [`min_value`, `max_value`] (min_value 0 by default; negative for signed values), at most
    `max_contributions` value mass (the sum of |value|) per unit over the horizon (and
    `max_contributions_per_step`, `max_keys_per_unit` as a count's).

    With discrete noise (the default) values are rounded to the grid `value_resolution` g
    (default max(|min_value|, max_value) / 100) after clamping; truncation, sensitivity and
    noise work in integer units of g, so the release is exact integers times g (see
    docs/privacy.md). One unit's total and the range's ends must stay below 2^53 grid units
    (exact in float64)."""

    statistic = "sum"


class ContinualCountDistinct(ContinualBase):
    """Distinct present items per key; elements (op, item, key), op '+' / '-'; item-level
    privacy with flippancy bound `max_flips` (S_{1,k}), at most `max_keys_per_unit` keys per
    item; `semantics` "count" (default)."""

    statistic = "count_distinct"


class ContinualDegreeCount(ContinualBase):
    """Degree of every public node; elements (op, (a, b)); edge-level privacy with degree
    contribution bound `max_updates`; each node's counter gets half the budget
    (Fichtenberger et al. 2023, Cor. 6.15)."""

    statistic = "degree_count"


class ContinualTriangleCount(ContinualBase):
    """Triangle count of one graph (its one key, "triangles"); elements (op, (a, b)). Private
    only for graph streams with maximum degree <= `max_degree` and triangle contribution
    <= `max_contribution`; the first violation halts the release (no record for that step or
    later) and goes to dead letters."""

    statistic = "triangle_count"


class ContinualRelease(ContinualBase):
    """Release already-computed difference values: elements (key, value) with event time; the
    caller declares that one protected unit changes each key's stream by a vector of S_{D,k}
    (`max_contributions`, `interval_bound`) and touches at most `keys_per_unit` keys (no
    truncation is applied here).

    With discrete noise (the default) values are integers with |value| <= 2^53, summed
    exactly: a key whose step total, running total or released value would reach 2^53 in
    magnitude (where float64 stops adding integers exactly) halts at that step, with an
    "exact totals" dead letter (`RecordMaker.exact_totals`)."""

    statistic = "release"

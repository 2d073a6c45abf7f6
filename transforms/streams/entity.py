"""Per-entity cardinality with bounded-contribution truncation (Andersson et al. 2026 Sec. 6.2-6.3).

A cardinality f(x[0..t]) = sum over entities e of g(n_e(t)), where n_e(t) is entity e's state
after step t and g maps it to an integer in [0, D]. The difference stream is
d[t] = sum_e g(n_e(t)) - g(n_e(t-1)), so one entity changes it by (g(n_e(t)) - g(n_e(t-1)))_t.
Its interval sums are differences of two values of g, so they lie in [-D, D]; truncation keeps
the entity's l1 mass sum_t |g(n_e(t)) - g(n_e(t-1))| <= k: if accepting a step's updates would
exceed k, all of the entity's updates at that step are dropped (replaced by a no-op), which
keeps its state and value. Hence every truncated entity changes d by a vector of S_{D,k}, for
every input stream, and trunc(x) == x whenever x already satisfies the bound.

CountDistinct (Def. 5.6) is g(n) = 1[n > 0] with D = 1 (the l1 mass is the flippancy, counted
per time step: a flip is a change of presence between the ends of two consecutive steps), so its
entity vectors are alternating with at most k non-zeros: S_{1,k} (Thm 6.2, 6.8).

Semantics of n_e: "count" (default, the paper's): n = inserts - deletes so far, present iff
n > 0; "set": an insert makes the item present, a delete absent, the last update of the step wins.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence, Tuple

from transforms import validation as check

from .records import INSERT

SEMANTICS = ("count", "set")


@dataclasses.dataclass(frozen=True)
class EntityState:
    """Small, serialisable per-entity state: its count, its released g value, l1 mass used."""
    count: int = 0
    value: int = 0
    used: int = 0


def apply_ops(count: int, ops: Sequence[str], semantics: str) -> int:
    if semantics == "count":
        return count + sum(1 if op == INSERT else -1 for op in ops)
    for op in ops:
        count = 1 if op == INSERT else 0
    return count


class EntityCardinality:
    """Per-entity state machine: step(state, ops of one step) -> (contribution, state, dropped)."""

    def __init__(self, g: Callable[[int], int], interval_bound: int, max_contributions: int,
                 semantics: str = "count", name: str = "custom"):
        if not callable(g):
            check.fail("g", "a callable from the entity state to an integer in [0, D]", g)
        self.g = g
        self.interval_bound = check.integer_at_least("interval_bound", interval_bound, 1)
        self.max_contributions = check.integer_at_least("max_contributions", max_contributions, 1)
        check.one_of("semantics", semantics, SEMANTICS)
        self.semantics = semantics
        self.name = name

    def init_state(self) -> EntityState:
        return EntityState(0, self._value(0), 0)

    def _value(self, count: int) -> int:
        value = self.g(count)
        if isinstance(value, bool) or not isinstance(value, int) or not (
                0 <= value <= self.interval_bound):
            check.fail("g(state)", f"an integer in [0, {self.interval_bound}] (the declared D)",
                       value)
        return value

    def step(self, state: EntityState, ops: Sequence[str]) -> Tuple[int, EntityState, int]:
        if not ops:
            return 0, state, 0
        count = apply_ops(state.count, ops, self.semantics)
        value = self._value(count)
        change = value - state.value
        if state.used + abs(change) > self.max_contributions:
            return 0, state, len(ops)
        return change, EntityState(count, value, state.used + abs(change)), 0


def count_distinct(max_flips: int, semantics: str = "count") -> EntityCardinality:
    """CountDistinct with flippancy truncation at `max_flips` (S_{1,k})."""
    return EntityCardinality(lambda n: 1 if n > 0 else 0, 1, max_flips, semantics,
                             name="count_distinct")

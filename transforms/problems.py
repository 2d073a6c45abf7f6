"""Per-problem glue between raw Beam elements and the Beam-free state machines.

A problem parses an element into (unit, payload) or a dead-letter reason, and runs one unit's
state machine over one step's payloads, returning contributions ((key, value) pairs to the key's
difference stream at that step) and, for TriangleCount, a violation message that halts release.
Payloads of a step are sorted by (event time, payload) before they reach the machine, so the
outcome never depends on bundle order.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Hashable, List, Optional, Tuple

from transforms.streams import (BoundViolation, ContributionBounds, EdgeDegreeContribution,
                                EntityCardinality, TriangleCounter, UnitState)
from transforms.streams.count import canonical
from transforms.streams.records import Declaration, canonical_edge

OPS = ("+", "-")


def _hashable_id(value) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool) and value != ""


class Problem:
    name = "problem"
    declaration: Declaration
    every_step = False

    def parse(self, element) -> Tuple[Optional[Tuple[Hashable, Any]], Optional[str]]:
        raise NotImplementedError

    def init_state(self):
        raise NotImplementedError

    def step(self, state, step: int, payloads: List[Any]):
        """-> (state, [(key, value)], violation or None)"""
        raise NotImplementedError


@dataclasses.dataclass
class CountProblem(Problem):
    """Counts and sums. With `value_grid` g, a value is clamped to [0, max_value] and rounded to
    the nearest multiple of g; the payload is the integer number of grid units, and `bounds`
    are in grid units too (discrete noise releases integers)."""
    bounds: ContributionBounds
    with_value: bool = False
    value_grid: Optional[float] = None
    max_value: Optional[float] = None

    name = "count"

    def __post_init__(self):
        self.declaration = Declaration(self.bounds.max_contributions,
                                       self.bounds.max_contributions,
                                       self.bounds.max_keys_per_unit, "user")

    def parse(self, element):
        size = 3 if self.with_value else 2
        shape = "(unit, key, value)" if self.with_value else "(unit, key)"
        if not isinstance(element, (tuple, list)) or len(element) != size:
            return None, f"record must be {shape}"
        unit, key = element[0], element[1]
        if not _hashable_id(unit):
            return None, "unit id must be a non-empty str or int"
        if not _hashable_id(key):
            return None, "key must be a non-empty str or int"
        value = 1.0
        if self.with_value:
            value = element[2]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
                    or value in (float("inf"), float("-inf")):
                return None, f"value must be a finite number; got {value!r}"
            if self.value_grid is not None:
                clamped = min(max(float(value), 0.0), self.max_value)
                value = math.floor(clamped / self.value_grid + 0.5)
        return (unit, (key, float(value))), None

    def init_state(self):
        return UnitState()

    def step(self, state, step, payloads):
        out, state, _ = self.bounds.step(state, payloads)
        return state, sorted(out.items(), key=lambda kv: canonical(kv[0])), None


@dataclasses.dataclass
class EntityProblem(Problem):
    """CountDistinct (and the generic hook): elements (op, item, key)."""
    machine: EntityCardinality
    max_keys_per_unit: int = 1

    name = "count_distinct"

    def __post_init__(self):
        self.declaration = Declaration(self.machine.interval_bound,
                                       self.machine.max_contributions, self.max_keys_per_unit,
                                       "item")

    def parse(self, element):
        if not isinstance(element, (tuple, list)) or len(element) != 3:
            return None, "record must be (op, item, key)"
        op, item, key = element
        if op not in OPS:
            return None, f"op must be '+' or '-'; got {op!r}"
        if not _hashable_id(item):
            return None, "item id must be a non-empty str or int"
        if not _hashable_id(key):
            return None, "key must be a non-empty str or int"
        return (item, (op, key)), None

    def init_state(self):
        return ((), {})

    def step(self, state, step, payloads):
        admitted, machines = list(state[0]), dict(state[1])
        for key in sorted({key for _, key in payloads} - set(admitted), key=canonical):
            if len(admitted) < self.max_keys_per_unit:
                admitted.append(key)
        ops_by_key = {}
        for op, key in payloads:
            if key in admitted:
                ops_by_key.setdefault(key, []).append(op)
        out = []
        for key in sorted(ops_by_key, key=canonical):
            change, machines[key], _ = self.machine.step(
                machines.get(key, self.machine.init_state()), ops_by_key[key])
            if change:
                out.append((key, float(change)))
        return (tuple(admitted), machines), out, None


@dataclasses.dataclass
class DegreeProblem(Problem):
    """DegreeCount: elements (op, (a, b)); the keys are the nodes."""
    max_updates: int

    name = "degree_count"

    def __post_init__(self):
        self.machine = EdgeDegreeContribution(self.max_updates)
        self.declaration = Declaration(1, self.max_updates, 2, "edge")

    def parse(self, element):
        if not isinstance(element, (tuple, list)) or len(element) != 2:
            return None, "record must be (op, (a, b))"
        op, edge = element
        if op not in OPS:
            return None, f"op must be '+' or '-'; got {op!r}"
        if not isinstance(edge, (tuple, list)) or len(edge) != 2:
            return None, f"edge must be a pair (a, b); got {edge!r}"
        a, b = edge
        if not (_hashable_id(a) and _hashable_id(b)):
            return None, "edge endpoints must be non-empty str or int ids"
        if a == b:
            return None, f"self-loop ({a!r}, {b!r}) is not an edge"
        return (canonical_edge(a, b), op), None

    def init_state(self):
        return self.machine.init_state()

    def step(self, state, step, payloads):
        change, state, _ = self.machine.step(state, payloads)
        return state, [], change  # contributions are made per edge by the caller (see below)


@dataclasses.dataclass
class TriangleProblem(Problem):
    """TriangleCount: elements (op, (a, b)); one graph, one key ("triangles")."""
    max_degree: int
    max_contribution: int
    key: str = "triangles"

    name = "triangle_count"

    def __post_init__(self):
        self.declaration = Declaration(
            self.max_degree, self.max_contribution, 1, "edge",
            restricted_to=f"graphs with maximum degree <= {self.max_degree} and maximum "
                          f"triangle contribution <= {self.max_contribution}")

    every_step = True  # the counter must see every step, in order

    def parse(self, element):
        parsed, reason = DegreeProblem.parse(self, element)
        if parsed is None:
            return None, reason
        edge, op = parsed
        return (self.key, (op, edge)), None

    def init_state(self):
        return TriangleCounter(self.max_degree, self.max_contribution)

    def step(self, state, step, payloads):
        try:
            delta = state.step(step, payloads)
        except BoundViolation as error:
            return state, [], str(error)
        return state, [(self.key, float(delta))] if delta else [], None


def run_unit(problem: Problem, unit, state, step: int, payloads: List[Any]):
    """One step of one unit -> (state, contributions [(key, value)], violation)."""
    if isinstance(problem, DegreeProblem):
        state, _, change = problem.step(state, step, payloads)
        return state, ([(unit[0], float(change)), (unit[1], float(change))] if change else []), None
    return problem.step(state, step, payloads)

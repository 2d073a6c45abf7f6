"""Batch drivers: raw records -> per-key difference streams d[key][t], t = 0..T-1.

Each driver validates records (bad ones become dead letters with a reason), groups updates by
privacy unit, runs the one units loop (`units.advance_unit`, the loop both Beam paths and the
scheduler run) and adds the unit's contributions to the key streams. `dropped` counts what
truncation removed, by reason; nothing vanishes silently.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Dict, Hashable, Iterable, List, Optional, Tuple

import numpy as np

from transforms import validation as check

from .count import ContributionBounds
from .entity import EntityCardinality, count_distinct
from .graph import BoundViolation
from .records import DeadLetter, Declaration, canonical, validate_event, validate_update
from .units import (CountProblem, DegreeProblem, EntityProblem, Halt, Problem, TriangleProblem,
                    advance_unit, steps_to_run)


@dataclasses.dataclass
class DifferenceStreams:
    horizon: int
    streams: Dict[Hashable, np.ndarray]
    declaration: Declaration
    dead_letters: List[DeadLetter] = dataclasses.field(default_factory=list)
    dropped: Dict[str, int] = dataclasses.field(default_factory=dict)
    valid_steps: Optional[int] = None  # TriangleCount: steps released before a violation
    violation: Optional[str] = None

    def stream(self, key) -> np.ndarray:
        """The key's difference stream (all zeros for a key with no contribution)."""
        return self.streams.get(key, np.zeros(self.horizon, dtype=np.int64))

    def totals(self, key) -> np.ndarray:
        return np.cumsum(self.stream(key))


def _group(records, parse, dead) -> Dict[Hashable, Dict[int, List]]:
    """unit -> step -> [payload] (input order within a step); bad records -> `dead`.

    parse(record) -> ((unit, step, payload), None) or (None, DeadLetter)."""
    grouped: Dict[Hashable, Dict[int, List]] = collections.defaultdict(
        lambda: collections.defaultdict(list))
    for record in records:
        parsed, letter = parse(record)
        if letter is not None:
            dead.append(letter)
            continue
        unit, step, payload = parsed
        grouped[unit][step].append(payload)
    return grouped


def _grouped_updates(records, horizon, edge, dead):
    """entity -> step -> [(op, key)]."""
    def parse(record):
        parsed, letter = validate_update(record, horizon, edge=edge)
        if letter is not None:
            return None, letter
        step, op, entity, key = parsed
        return (entity, step, (op, key)), None
    return _group(records, parse, dead)


def _run_units(problem: Problem, grouped, horizon: int, dtype, dropped) -> Tuple[
        Dict[Hashable, np.ndarray], Optional[Halt]]:
    """The one units loop (`units.advance_unit`) over every unit; contributions are added to
    the key streams. Returns the streams and the earliest halt (fail-closed violation)."""
    streams: Dict[Hashable, np.ndarray] = {}
    first_halt: Optional[Halt] = None
    for unit in sorted(grouped, key=canonical):
        by_step = grouped[unit]
        steps = steps_to_run(problem, by_step, 0, horizon)
        run = advance_unit(problem, unit, problem.init_state(), by_step, steps)
        dropped.update(run.dropped)
        for key, step, value in run.contributions:
            streams.setdefault(key, np.zeros(horizon, dtype=dtype))[step] += value
        if run.halt is not None and (first_halt is None or run.halt.step < first_halt.step):
            first_halt = run.halt
    return streams, first_halt


def entity_difference_streams(records: Iterable[Any], horizon: int,
                              cardinality: EntityCardinality, max_keys_per_unit: int = 1,
                              unit: str = "item") -> DifferenceStreams:
    """The generic hook: any per-entity cardinality g with declared (D, k), per public key."""
    horizon = check.integer_at_least("horizon", horizon, 1)
    check.integer_at_least("max_keys_per_unit", max_keys_per_unit, 1)
    problem = EntityProblem(cardinality, max_keys_per_unit, unit)
    dead: List[DeadLetter] = []
    dropped = collections.Counter()
    streams, _ = _run_units(problem, _grouped_updates(records, horizon, False, dead), horizon,
                            np.int64, dropped)
    return DifferenceStreams(horizon, streams, problem.declaration, dead, dict(dropped))


def count_distinct_streams(records, horizon, max_flips, max_keys_per_unit=1,
                           semantics="count") -> DifferenceStreams:
    """CountDistinct per key with flippancy truncation (item-level privacy, S_{1,k})."""
    return entity_difference_streams(records, horizon, count_distinct(max_flips, semantics),
                                     max_keys_per_unit)


def count_streams(records, horizon, bounds: ContributionBounds) -> DifferenceStreams:
    """Continual count (records (step, unit, key)) or sum (records (step, unit, key, value),
    when bounds.max_value is set) with per-unit caps; S_{k,k} per key."""
    horizon = check.integer_at_least("horizon", horizon, 1)
    with_value = bounds.max_value is not None
    problem = CountProblem(bounds, with_value=with_value)
    dead: List[DeadLetter] = []

    def parse(record):
        parsed, letter = validate_event(record, horizon, with_value=with_value)
        if letter is not None:
            return None, letter
        step, unit, key, value = parsed
        return (unit, step, (key, value)), None

    dropped = collections.Counter()
    streams, _ = _run_units(problem, _group(records, parse, dead), horizon,
                            np.float64 if with_value else np.int64, dropped)
    return DifferenceStreams(horizon, streams, problem.declaration, dead, dict(dropped))


def degree_streams(records, horizon, max_updates, max_keys_per_unit=1,
                   semantics="count") -> DifferenceStreams:
    """DegreeCount: one stream per node (per (graph key, node) if records carry a key)."""
    horizon = check.integer_at_least("horizon", horizon, 1)
    problem = DegreeProblem(max_updates, max_keys_per_unit, semantics)
    dead: List[DeadLetter] = []
    dropped = collections.Counter()
    streams, _ = _run_units(problem, _grouped_updates(records, horizon, True, dead), horizon,
                            np.int64, dropped)
    return DifferenceStreams(horizon, streams, problem.declaration, dead, dict(dropped))


def triangle_streams(records, horizon, max_degree, max_contribution, semantics="count",
                     strict=True) -> DifferenceStreams:
    """TriangleCount per graph key (None if records carry no key), S_{D,k} under the bounds.

    With `strict`, a bound violation raises BoundViolation; otherwise the result holds the
    steps before the first violation (`valid_steps`) and the message (`violation`).
    """
    horizon = check.integer_at_least("horizon", horizon, 1)
    problem = TriangleProblem(max_degree, max_contribution, semantics=semantics)
    dead: List[DeadLetter] = []

    def parse(record):
        parsed, letter = validate_update(record, horizon, edge=True)
        if letter is not None:
            return None, letter
        step, op, edge, key = parsed
        return (key, step, (op, edge)), None

    streams, halt = _run_units(problem, _group(records, parse, dead), horizon, np.int64,
                               collections.Counter())
    if halt is not None and strict:
        raise BoundViolation(halt.reason)
    valid_steps = horizon if halt is None else halt.step
    for key in streams:
        streams[key][valid_steps:] = 0
    declaration = Declaration(max_degree, max_contribution, 1, "edge",
                              restricted_to=f"graphs whose maximum degree is <= {max_degree} and "
                                            f"whose maximum triangle contribution is <= "
                                            f"{max_contribution}")
    return DifferenceStreams(horizon, streams, declaration, dead, {}, valid_steps,
                             None if halt is None else halt.reason)

"""Batch drivers: raw records -> per-key difference streams d[key][t], t = 0..T-1.

Each driver validates records (bad ones become dead letters with a reason), groups updates by
privacy unit, runs that unit's state machine step by step (the same machine a Beam stateful DoFn
runs per unit), and adds the unit's contributions to the key streams. `dropped` counts what
truncation removed, by reason; nothing vanishes silently.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Dict, Hashable, Iterable, List, Optional

import numpy as np

from transforms.mechanisms import _validation as check

from .count import ContributionBounds, UnitState, canonical
from .entity import EntityCardinality, count_distinct
from .graph import BoundViolation, EdgeDegreeContribution, TriangleCounter
from .records import (DeadLetter, Declaration, validate_event, validate_update)


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


def _admit_keys(admitted: List, keys_this_step: Iterable, cap: int) -> None:
    for key in sorted(set(keys_this_step) - set(admitted), key=canonical):
        if len(admitted) < cap:
            admitted.append(key)


def _run_keyed_units(grouped, machine, max_keys_per_unit, dropped, emit) -> None:
    """For each unit: admit keys (cap), run its machine per key and step, emit changes."""
    for unit, steps in grouped.items():
        admitted: List = []
        states: Dict[Hashable, Any] = {}
        for step in sorted(steps):
            _admit_keys(admitted, (key for _, key in steps[step]), max_keys_per_unit)
            by_key: Dict[Hashable, List[str]] = collections.defaultdict(list)
            for op, key in steps[step]:
                if key in admitted:
                    by_key[key].append(op)
                else:
                    dropped["key cap"] += 1
            for key, ops in by_key.items():
                change, states[key], lost = machine.step(states.get(key, machine.init_state()),
                                                         ops)
                dropped["contribution bound"] += lost
                if change:
                    emit(unit, key, step, change)


def entity_difference_streams(records: Iterable[Any], horizon: int,
                              cardinality: EntityCardinality, max_keys_per_unit: int = 1,
                              unit: str = "item") -> DifferenceStreams:
    """The generic hook: any per-entity cardinality g with declared (D, k), per public key."""
    horizon = check.integer_at_least("horizon", horizon, 1)
    check.integer_at_least("max_keys_per_unit", max_keys_per_unit, 1)
    dead: List[DeadLetter] = []
    dropped = collections.Counter()
    streams: Dict[Hashable, np.ndarray] = {}

    def emit(entity, key, step, change):
        streams.setdefault(key, np.zeros(horizon, dtype=np.int64))[step] += change

    _run_keyed_units(_grouped_updates(records, horizon, False, dead), cardinality,
                     max_keys_per_unit, dropped, emit)
    declaration = Declaration(cardinality.interval_bound, cardinality.max_contributions,
                              max_keys_per_unit, unit)
    return DifferenceStreams(horizon, streams, declaration, dead, dict(dropped))


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
    dead: List[DeadLetter] = []

    def parse(record):
        parsed, letter = validate_event(record, horizon, with_value=with_value)
        if letter is not None:
            return None, letter
        step, unit, key, value = parsed
        return (unit, step, (key, value)), None

    by_unit = _group(records, parse, dead)
    dtype = np.float64 if with_value else np.int64
    streams: Dict[Hashable, np.ndarray] = {}
    dropped = collections.Counter()
    for unit, steps in by_unit.items():
        state = UnitState()
        for step in sorted(steps):
            out, state, lost = bounds.step(state, steps[step])
            dropped["contribution bound"] += len(lost)
            for key, amount in out.items():
                streams.setdefault(key, np.zeros(horizon, dtype=dtype))[step] += amount
    declaration = Declaration(bounds.max_contributions, bounds.max_contributions,
                              bounds.max_keys_per_unit, "user")
    return DifferenceStreams(horizon, streams, declaration, dead, dict(dropped))


def _node_key(graph_key, node):
    return node if graph_key is None else (graph_key, node)


def degree_streams(records, horizon, max_updates, max_keys_per_unit=1,
                   semantics="count") -> DifferenceStreams:
    """DegreeCount: one stream per node (per (graph key, node) if records carry a key)."""
    horizon = check.integer_at_least("horizon", horizon, 1)
    machine = EdgeDegreeContribution(max_updates, semantics)
    dead: List[DeadLetter] = []
    dropped = collections.Counter()
    streams: Dict[Hashable, np.ndarray] = {}

    def emit(edge, key, step, change):
        for node in edge:
            streams.setdefault(_node_key(key, node),
                               np.zeros(horizon, dtype=np.int64))[step] += change

    _run_keyed_units(_grouped_updates(records, horizon, True, dead), machine, max_keys_per_unit,
                     dropped, emit)
    declaration = Declaration(1, max_updates, 2 * max_keys_per_unit, "edge")
    return DifferenceStreams(horizon, streams, declaration, dead, dict(dropped))


def triangle_streams(records, horizon, max_degree, max_contribution, semantics="count",
                     strict=True) -> DifferenceStreams:
    """TriangleCount per graph key (None if records carry no key), S_{D,k} under the bounds.

    With `strict`, a bound violation raises BoundViolation; otherwise the result holds the
    steps before the first violation (`valid_steps`) and the message (`violation`).
    """
    horizon = check.integer_at_least("horizon", horizon, 1)
    dead: List[DeadLetter] = []

    def parse(record):
        parsed, letter = validate_update(record, horizon, edge=True)
        if letter is not None:
            return None, letter
        step, op, edge, key = parsed
        return (key, step, (op, edge)), None

    by_key = _group(records, parse, dead)
    streams: Dict[Hashable, np.ndarray] = {}
    valid_steps, violation = horizon, None
    for key in sorted(by_key, key=canonical):
        counter = TriangleCounter(max_degree, max_contribution, semantics)
        stream = np.zeros(horizon, dtype=np.int64)
        for step in range(horizon):
            try:
                stream[step] = counter.step(step, by_key[key].get(step, ()))
            except BoundViolation as error:
                if strict:
                    raise
                valid_steps = min(valid_steps, step)
                violation = str(error)
                break
        streams[key] = stream
    declaration = Declaration(max_degree, max_contribution, 1, "edge",
                              restricted_to=f"graphs whose maximum degree is <= {max_degree} and "
                                            f"whose maximum triangle contribution is <= "
                                            f"{max_contribution}")
    if violation is not None:
        for key in streams:
            streams[key][valid_steps:] = 0
    return DifferenceStreams(horizon, streams, declaration, dead, {}, valid_steps, violation)

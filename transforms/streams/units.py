"""The one units layer: element -> (unit, payload), and one step of one unit's state machine.

Every problem (count / sum, count-distinct, degree, triangles, declared values) implements
- `parse(element) -> Parsed(unit, payload)` or a dead-letter reason (one set of id rules:
  `records.is_id`), and
- `advance(unit, state, step, payloads) -> StepResult(state, contributions, violation, dropped)`,
  where contributions are (public key, value) changes of the keys' difference streams at `step`.
`advance_unit` is the reference loop over steps (the batch drivers in `difference.py` run it);
`Problem.run` is what both Beam pipelines and the scheduler run: `advance_unit`, unless a
problem loops faster over the same rule (counts, entities; tests/test_bounded.py checks they
are equal bit for bit). Payloads of a step reach `advance` in a fixed order (the Beam layer sorts them by event time, then canonically), so
the outcome never depends on bundle order. Imports no Beam.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from operator import itemgetter
from typing import Any, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from transforms import validation as check
from transforms.mechanisms.base import EXACT_LIMIT, EXACT_LIMIT_TEXT

from .count import KEY_CAP, ContributionBounds, UnitState, truncate_step
from .entity import EntityCardinality
from .graph import BoundViolation, EdgeDegreeContribution, TriangleCounter
from .records import (ID_INT_LIMIT, OPS, Declaration, Reason, canonical, canonical_edge, is_id,
                      is_text, not_id_reason, plain_id, shown)

_LIMIT = float(EXACT_LIMIT)  # exact totals: integer sums below it are exact in float64


@dataclasses.dataclass(frozen=True)
class Parsed:
    unit: Hashable
    payload: Any


@dataclasses.dataclass(frozen=True)
class StepResult:
    """One step of one unit: its new state, its (key, value) contributions, a fail-closed
    violation message (the release halts at this step) and how many updates truncation
    dropped, by reason (operator-only: the counts depend on private data)."""
    state: Any
    contributions: Tuple[Tuple[Hashable, float], ...] = ()
    violation: Optional[str] = None
    dropped: Tuple[Tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Halt:
    """The first step a unit's bound was violated at, and why (nothing is released from it)."""
    step: int
    reason: str


@dataclasses.dataclass
class UnitRun:
    state: Any
    contributions: List[Tuple[Hashable, int, float]]  # (key, step, value)
    halt: Optional[Halt] = None
    dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class Problem:
    """What a transform's units are and how one unit's contributions evolve.

    `advance` is the problem's one step rule. The drivers run a unit through `run` (all of
    them: the batch drivers in `difference.py`, both Beam pipelines and the scheduler); a
    problem may override `run` with a one-pass loop over the same rule, and offer the fast
    paths below, which the stages call without knowing the problem's class."""
    declaration: Declaration
    every_step = False  # the machine must see every step, in order (triangles)
    # values parsed below and above the value range, counted by `parse` (sums and means)
    clamped: Optional[list] = None
    # payloads (key, amount) whose kept share per key is exact as input and kept masses
    # (`key_mass`; operator-only per-key truncation counts)
    exact_key_masses = False

    def key_mass(self, payload) -> int:
        """What one payload puts into its key's input (with `exact_key_masses`)."""
        raise NotImplementedError
    # payloads of a step must reach `advance` in `sorted_payloads` order (False: the rule
    # orders a step's payloads itself, and any order gives the same result)
    ordered = True
    # the element's fields when it is a flat tuple that `parse_columns` parses vectorised
    # ("id": an id; "number": a finite number), or None (every element takes `parse`)
    flat_fields: Optional[Tuple[str, ...]] = None

    def parse(self, element) -> Tuple[Optional[Parsed], Optional[str]]:
        raise NotImplementedError

    def init_state(self):
        raise NotImplementedError

    def advance(self, unit, state, step: int, payloads: Sequence[Any]) -> StepResult:
        raise NotImplementedError

    def run(self, unit, state, by_step: Dict[int, Sequence[Any]], steps: Iterable[int]
            ) -> UnitRun:
        """One unit's machine over `steps`: `advance_unit` (a subclass may loop faster over
        the same rule)."""
        return advance_unit(self, unit, state, by_step, steps)

    # whether `streams.columns.truncate_columns` computes the rule's result (CountProblem)
    columnar = False

    def parse_columns(self, columns: Sequence[list]) -> Tuple[list, list]:
        """`parse` of rows whose `flat_fields` passed their checks, as columns of Python
        values -> (units, payloads): the same payloads `parse` gives, vectorised."""
        raise NotImplementedError

    # A plain-tuple state for the streaming truncation's single-event path (None: the
    # problem has none, the stage runs `run`); `flat_step` advances it by one step.
    def flat_state(self) -> Optional[tuple]:
        return None

    def flat_step(self, flat: tuple, step: int, payloads: Sequence[Any], out: list,
                  dropped: Optional[dict]) -> tuple:
        raise NotImplementedError


def steps_to_run(problem: Problem, by_step: Dict[int, Sequence[Any]], first: int,
                 stop: int) -> Sequence[int]:
    """The steps in [first, stop) a unit's machine must see: all of them for every-step
    machines (triangles), else those with payloads."""
    if problem.every_step:
        return range(first, stop)
    return sorted(step for step in by_step if first <= step < stop)


def advance_unit(problem: Problem, unit, state, by_step: Dict[int, Sequence[Any]],
                 steps: Iterable[int]) -> UnitRun:
    """Run one unit's machine over `steps` (payloads per step in `by_step`), stopping at the
    first violation."""
    run = UnitRun(state, [])
    for step in steps:
        result = problem.advance(unit, run.state, step, by_step.get(step, ()))
        run.state = result.state
        for reason, count in result.dropped:
            run.dropped[reason] += count
        if result.violation is not None:
            run.halt = Halt(step, result.violation)
            return run
        run.contributions.extend((key, step, value) for key, value in result.contributions)
    return run


def run_unit(problem: Problem, unit, state, by_step: Dict[int, Sequence], first: int,
             stop: int) -> UnitRun:
    """One unit's machine over the steps in [first, stop) it must see (`steps_to_run`)."""
    return problem.run(unit, state, by_step, steps_to_run(problem, by_step, first, stop))


def sorted_payloads(events: Iterable[Sequence]) -> Dict[int, List[Any]]:
    """Payloads per step in (event time, canonical payload) order: bundle order never matters.
    `events` are (step, micros, payload) tuples. The reference order of every path."""
    by_step: Dict[int, List[Tuple[int, Any]]] = {}
    for step, micros, payload in events:
        by_step.setdefault(step, []).append((micros, payload))
    return {step: [p for _, p in sorted(items, key=lambda tp: (tp[0], canonical(tp[1])))]
            for step, items in by_step.items()}


def _in_order(items: List[Tuple[int, Any]]) -> List[Any]:
    """`sorted_payloads`' order of one step's (micros, payload) pairs, computing canonical
    forms only when two events share an event time (equal canonical forms are equal ids)."""
    if len(items) == 1:
        return [items[0][1]]
    items.sort(key=itemgetter(0))
    for i in range(1, len(items)):
        if items[i][0] == items[i - 1][0]:
            return [p for _, p in sorted(items, key=lambda tp: (tp[0], canonical(tp[1])))]
    return [p for _, p in items]


def payloads_by_step(events: Iterable[Sequence], ordered: bool) -> Dict[int, List[Any]]:
    """Payloads per step; in `sorted_payloads`' order if `ordered` (else in any order).
    `sorted_payloads` is the reference; this skips canonical forms where no two events of a
    step share an event time (tests/streams/test_units.py checks it equals the reference)."""
    grouped: Dict[int, list] = {}
    if not ordered:
        for step, _, payload in events:
            found = grouped.get(step)
            if found is None:
                grouped[step] = [payload]
            else:
                found.append(payload)
        return grouped
    for step, micros, payload in events:
        found = grouped.get(step)
        if found is None:
            grouped[step] = [(micros, payload)]
        else:
            found.append((micros, payload))
    return {step: _in_order(items) for step, items in grouped.items()}


def _finite_number(value) -> bool:
    """An int or float (not a bool) that is a finite float (ints beyond 1.8e308 are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _is_op(op) -> bool:
    return isinstance(op, str) and op in OPS  # (`in` on other types may raise: arrays)


@dataclasses.dataclass
class CountProblem(Problem):
    """Counts and sums (elements (unit, key) or (unit, key, value)). With `value_grid` g, a
    value is clamped to [min_value, max_value] (min_value 0 by default) and rounded to the
    nearest multiple of g; the payload is the integer number of grid units, and `bounds` are in
    grid units too (discrete noise releases integers). `clamped` counts the values parsed below
    min_value and above max_value (operator-only: they depend on the data)."""
    bounds: ContributionBounds
    with_value: bool = False
    value_grid: Optional[float] = None
    max_value: Optional[float] = None
    min_value: Optional[float] = None


    def __post_init__(self):
        self.declaration = Declaration(self.bounds.max_contributions,
                                       self.bounds.max_contributions,
                                       self.bounds.max_keys_per_unit, "user")
        if not self.with_value or self.value_grid is not None:
            self._check_exact()
        self.limits = self.bounds.limits  # `truncate_step`'s, computed once (per event cost)
        # the values' range in the data's units (sums: as configured; truncation clamps to
        # it in grid units), for the clamped counts
        most = self.max_value if self.max_value is not None else self.bounds.max_value
        least = self.min_value if self.min_value is not None else self.bounds.min_value
        self.clamp_range = None if most is None else (float(least or 0.0), float(most))
        self.clamped = [0, 0]  # values below the range, above it (operator-only)
        # counts (events) and non-negative grid sums (grid units): a key's kept total is its
        # kept mass, so input minus kept is what truncation cut, exactly
        self.exact_key_masses = not self.with_value or (
            self.value_grid is not None and self.clamp_range[0] >= 0)

    def key_mass(self, payload) -> int:
        return int(payload[1])

    # the step's truncation rule (`count.truncate_step`; `MeanProblem` takes one of its parts)
    truncate = staticmethod(truncate_step)

    def _check_exact(self):
        """Counts and grid sums are integers (in grid units): one unit's total (`used`, and so
        every per-step and per-key amount) and a clamped value must stay below 2^53, where
        float64 holds and adds integers exactly (`EXACT_LIMIT`; the keys' totals over all
        units are bounded where they are summed, in the release)."""
        bounds = self.bounds
        if bounds.max_contributions < EXACT_LIMIT and (
                bounds.max_value is None or bounds.max_value < EXACT_LIMIT) and (
                bounds.min_value is None or -bounds.min_value < EXACT_LIMIT):
            return
        if self.value_grid is None:
            check.fail("max_contributions", f"an integer < {EXACT_LIMIT_TEXT} (float64 adds "
                                            f"integers exactly only below it)",
                       bounds.max_contributions)
        check.fail("value_resolution", f"at least max_contributions / {EXACT_LIMIT_TEXT} and "
                                       f"max_value / {EXACT_LIMIT_TEXT} (one unit's total in "
                                       f"grid units must stay below {EXACT_LIMIT_TEXT}, where "
                                       f"float64 adds integers exactly)", self.value_grid)

    def parse(self, element):
        if type(element) is tuple and not self.with_value and len(element) == 2:
            # the common case first: plain ints and non-empty ASCII strs that is_id accepts
            # (other strs take the full checks: is_id refuses text that is not Unicode)
            unit, key = element
            kind, key_kind = type(unit), type(key)
            if (kind is str and unit and unit.isascii() or
                    kind is int and -ID_INT_LIMIT < unit < ID_INT_LIMIT) and \
                    (key_kind is str and key and key.isascii() or
                     key_kind is int and -ID_INT_LIMIT < key < ID_INT_LIMIT):
                return Parsed(unit, (key, 1.0)), None
        return self._parse(element)

    def _parse(self, element):
        size = 3 if self.with_value else 2
        shape = "(unit, key, value)" if self.with_value else "(unit, key)"
        if not isinstance(element, (tuple, list)) or len(element) != size:
            return None, f"record must be {shape}"
        unit, key = element[0], element[1]
        if not is_id(unit):
            return None, not_id_reason("unit id", unit)
        if not is_id(key):
            return None, not_id_reason("key", key)
        unit, key = plain_id(unit), plain_id(key)  # one unit, one key, whatever carried it
        value = 1.0
        if self.with_value:
            value = element[2]
            if not _finite_number(value):
                return None, Reason("bad_value", f"value must be a finite number; got "
                                                 f"{shown(value)}")
            low, high = self.clamp_range
            if value < low:
                self.clamped[0] += 1
            elif value > high:
                self.clamped[1] += 1
            if self.value_grid is not None:
                clamped = min(max(float(value), low), high)
                value = math.floor(clamped / self.value_grid + 0.5)
        return Parsed(unit, (key, float(value))), None

    ordered = False  # `truncate_step` orders a step's events itself

    @property
    def flat_fields(self):
        return ("id", "id", "number") if self.with_value else ("id", "id")

    def parse_columns(self, columns):
        """Vectorised `parse` (the same float operations): units, keys and values -> units,
        (key, value) payloads."""
        units, keys = columns[0], columns[1]
        if not self.with_value:
            return units, [(key, 1.0) for key in keys]
        values = self.parse_values(np.asarray(columns[2], dtype=np.float64))
        return units, list(zip(keys, values.tolist()))

    def parse_values(self, values: np.ndarray) -> np.ndarray:
        """`parse`'s payload values of finite float64 values, vectorised (the same float
        operations), counting the clamped ones."""
        low, high = self.clamp_range
        self.clamped[0] += int(np.count_nonzero(values < low))
        self.clamped[1] += int(np.count_nonzero(values > high))
        if self.value_grid is not None:
            values = np.floor(np.minimum(np.maximum(values, low), high)
                              / self.value_grid + 0.5)
        return values

    def column_values(self, values: Optional[np.ndarray], count: int) -> np.ndarray:
        """The payload values of `count` rows whose fields passed their checks (`values`: the
        value column as float64, sums only): 1.0 for counts, else `parse_values`."""
        return np.ones(count) if not self.with_value else self.parse_values(values)

    @property
    def columnar(self) -> bool:
        """Whether `streams.columns.truncate_columns` computes this rule's result: integer
        amounts (counts; sums on a value grid)."""
        return not self.with_value or self.value_grid is not None

    def init_state(self):
        return UnitState()

    def advance(self, unit, state, step, payloads):
        keys, out, dropped = list(state.keys), [], {}
        used = self.truncate(self.limits, keys, state.used, step, payloads, out, dropped)
        return StepResult(UnitState(used, tuple(keys)),
                          tuple((key, value) for key, _, value in out), None,
                          tuple(sorted(dropped.items())))

    def run(self, unit, state, by_step, steps):
        """`advance_unit` in one pass (no per-step objects; the same rule, so the same
        floats)."""
        limits, keys, used, truncate = self.limits, list(state.keys), state.used, self.truncate
        out: List[Tuple[Any, int, float]] = []
        dropped: Dict[str, int] = {}
        for step in steps:
            used = truncate(limits, keys, used, step, by_step.get(step, ()), out, dropped)
        run = UnitRun(UnitState(used, tuple(keys)), out)
        run.dropped.update(dropped)
        return run

    def flat_state(self):
        return 0.0, ()  # = UnitState() as the tuple (used, keys)

    def flat_step(self, flat, step, payloads, out, dropped):
        """`advance` on the state as the tuple (used, keys): the same tuple if nothing was
        admitted or taken."""
        keys = list(flat[1])
        used = self.truncate(self.limits, keys, flat[0], step, payloads, out, dropped)
        if used == flat[0] and len(keys) == len(flat[1]):
            return flat
        return used, tuple(keys)


@dataclasses.dataclass
class EntityProblem(Problem):
    """Count-distinct and the generic per-entity hook: elements (op, item, key). A unit (item)
    is admitted to at most `max_keys_per_unit` keys (first come, canonical order within a
    step), and runs one `machine` per admitted key."""
    machine: Any  # EntityCardinality or EdgeDegreeContribution: step(state, ops)
    max_keys_per_unit: int = 1
    unit_name: str = "item"


    def __post_init__(self):
        self.declaration = Declaration(self.machine.interval_bound,
                                       self.machine.max_contributions, self.max_keys_per_unit,
                                       self.unit_name)

    def parse(self, element):
        if not isinstance(element, (tuple, list)) or len(element) != 3:
            return None, "record must be (op, item, key)"
        op, item, key = element
        if not _is_op(op):
            return None, f"op must be '+' or '-'; got {shown(op)}"
        if not is_id(item):
            return None, not_id_reason("item id", item)
        if not is_id(key):
            return None, not_id_reason("key", key)
        return Parsed(item, (op, key)), None

    def init_state(self):
        return ((), {})

    def targets(self, unit, key) -> Tuple[Hashable, ...]:
        """The public keys a change of (unit, key) is added to."""
        return (key,)

    def advance(self, unit, state, step, payloads):
        admitted, machines = list(state[0]), dict(state[1])
        out: List[Tuple[Any, int, float]] = []
        capped, bounded = self._step(unit, admitted, machines, step, payloads, out)
        dropped = tuple((reason, n) for reason, n in ((KEY_CAP, capped),
                                                      ("contribution bound", bounded)) if n)
        return StepResult((tuple(admitted), machines),
                          tuple((key, value) for key, _, value in out), None, dropped)

    def run(self, unit, state, by_step, steps):
        """`advance_unit` in one pass: the same rule (`_step`), without copying the state and
        building a StepResult at every step."""
        admitted, machines = list(state[0]), dict(state[1])
        out: List[Tuple[Any, int, float]] = []
        capped = bounded = 0
        for step in steps:
            lost = self._step(unit, admitted, machines, step, by_step.get(step, ()), out)
            capped += lost[0]
            bounded += lost[1]
        run = UnitRun((tuple(admitted), machines), out)
        if capped:
            run.dropped[KEY_CAP] += capped
        if bounded:
            run.dropped["contribution bound"] += bounded
        return run

    def _step(self, unit, admitted: list, machines: dict, step: int, payloads, out: list
              ) -> Tuple[int, int]:
        """The entity rule, one step: admits keys first come (ties in canonical order) up to
        `max_keys_per_unit` into `admitted`, runs each admitted key's machine on its ops (keys
        in canonical order) in `machines`, appends (target, step, change) to `out`; returns
        (events dropped by the key cap, updates dropped by the machine's bound)."""
        max_keys, machine = self.max_keys_per_unit, self.machine
        capped = bounded = 0
        if len(payloads) == 1:  # one event: no sets, no sorting
            (op, key), = payloads
            if key not in admitted:
                if len(admitted) >= max_keys:
                    return 1, 0
                admitted.append(key)
            ops_by_key = {key: [op]}
        else:
            if len(admitted) < max_keys:
                for key in sorted({key for _, key in payloads} - set(admitted), key=canonical):
                    if len(admitted) < max_keys:
                        admitted.append(key)
            ops_by_key: Dict[Hashable, List[str]] = {}
            for op, key in payloads:
                if key in admitted:
                    ops_by_key.setdefault(key, []).append(op)
                else:
                    capped += 1
        for key in (ops_by_key if len(ops_by_key) == 1 else sorted(ops_by_key, key=canonical)):
            found = machines.get(key)
            change, machines[key], lost = machine.step(
                machine.init_state() if found is None else found, ops_by_key[key])
            bounded += lost
            if change:
                out.extend((target, step, float(change)) for target in self.targets(unit, key))
        return capped, bounded


def node_key(graph_key, node):
    """A node's public key: the node itself, or (graph key, node) when records carry a key."""
    return node if graph_key is None else (graph_key, node)


class DegreeProblem(EntityProblem):
    """Degree count: elements (op, (a, b)); the unit is the edge, the public keys are its two
    endpoints (each gets the edge's presence change)."""


    def __init__(self, max_updates: int, max_keys_per_unit: int = 1, semantics: str = "count"):
        self.max_updates = max_updates
        super().__init__(EdgeDegreeContribution(max_updates, semantics), max_keys_per_unit,
                         "edge")

    def __post_init__(self):  # each endpoint's stream is in S_{1,k}; one edge, 2 keys per graph
        self.declaration = Declaration(1, self.max_updates, 2 * self.max_keys_per_unit, "edge")

    def parse(self, element):
        parsed, reason = parse_edge_update(element)
        if parsed is None:
            return None, reason
        op, edge = parsed
        return Parsed(edge, (op, None)), None

    def targets(self, unit, key):
        return node_key(key, unit[0]), node_key(key, unit[1])


def parse_edge_update(element):
    """(op, (a, b)) -> ((op, canonical edge), None) or (None, reason)."""
    if not isinstance(element, (tuple, list)) or len(element) != 2:
        return None, "record must be (op, (a, b))"
    op, edge = element
    if not _is_op(op):
        return None, f"op must be '+' or '-'; got {shown(op)}"
    if not isinstance(edge, (tuple, list)) or len(edge) != 2:
        return None, f"edge must be a pair (a, b); got {shown(edge)}"
    a, b = edge
    if not (is_id(a) and is_id(b)):
        bad = b if is_id(a) else a
        if isinstance(bad, str) and bad and not is_text(bad):
            return None, not_id_reason("edge endpoint", bad)
        return None, "edge endpoints must be non-empty str or int ids"
    if a == b:
        return None, f"self-loop ({a!r}, {b!r}) is not an edge"
    return (op, canonical_edge(a, b)), None


@dataclasses.dataclass
class TriangleProblem(Problem):
    """Triangle count: elements (op, (a, b)); one graph per unit (the key "triangles" in Beam,
    the graph key in the batch driver). A bound violation is returned, not raised."""
    max_degree: int
    max_contribution: int
    key: str = "triangles"
    semantics: str = "count"

    every_step = True

    def __post_init__(self):
        self.declaration = Declaration(
            self.max_degree, self.max_contribution, 1, "edge",
            restricted_to=f"graphs with maximum degree <= {self.max_degree} and maximum "
                          f"triangle contribution <= {self.max_contribution}")

    def parse(self, element):
        parsed, reason = parse_edge_update(element)
        if parsed is None:
            return None, reason
        return Parsed(self.key, parsed), None

    def init_state(self):
        return TriangleCounter(self.max_degree, self.max_contribution, self.semantics)

    def advance(self, unit, state, step, payloads):
        try:
            delta = state.step(step, payloads)
        except BoundViolation as error:
            return StepResult(state, (), str(error))
        return StepResult(state, ((unit, float(delta)),) if delta else ())


@dataclasses.dataclass
class DeclaredProblem(Problem):
    """Already-computed differences: elements (key, value), released as given (the caller
    declares S_{D,k} and keys per unit; no truncation). With `integers`, values must be
    integers (discrete noise) and are summed exactly: a value has |value| <= 2^53, and a key's
    step total of magnitude >= 2^53 (`EXACT_LIMIT`, where float64 stops adding integers
    exactly) is a violation that halts the key at that step (fail closed, as the triangle
    bounds; the release bounds the key's running total alike)."""
    declaration: Declaration
    integers: bool = True


    def parse(self, element):
        if not isinstance(element, (tuple, list)) or len(element) != 2:
            return None, "record must be (key, value)"
        key, value = element
        if not is_id(key):
            return None, not_id_reason("key", key)
        if not _finite_number(value) or abs(value) > 2 ** 53:
            return None, Reason("bad_value", f"value must be a finite number with |value| <= "
                                             f"2^53; got {shown(value)}")
        if self.integers and value != math.floor(value):
            return None, (f"value must be an integer with discrete noise (the declared set "
                          f"S_(D,k) is integer); got {value!r}")
        return Parsed(key, float(value)), None

    def init_state(self):
        return None  # declared values carry no truncation state

    def advance(self, unit, state, step, payloads):
        if not payloads:
            return StepResult(state)
        total = math.fsum(payloads)  # exact, then rounded once: exact below 2^53
        if self.integers and not -_LIMIT < total < _LIMIT:
            return StepResult(state, (), (
                f"exact totals: key {unit!r} halts at step {step}: its step total would reach "
                f"{EXACT_LIMIT_TEXT} in magnitude (float64 adds integers exactly only below "
                f"it); no record for this step or later"))
        return StepResult(state, ((unit, total),))

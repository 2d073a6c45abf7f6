"""The pipeline's stages, as small public PTransforms with one job each.

The six `Continual*` transforms validate and compose them; `pipelines.run` (one release in one
run) and `pipelines.schedule` (one release over many runs, resumed from checkpoints) drive that
one composition:

    events                                   timestamped elements, or EventBatches (Arrow
                                             tables: `transforms.arrow_input`, bounded)
    | AssignSteps(problem, steps, window)    -> (unit, Event tuple)      + dead letters;
                                                bounded: (unit, [Event tuples]) per bundle
    | TruncatePerUnit(problem, steps, ...)   -> bounded: (key, KeySums) per bundle, unbounded:
                                                ((key, step), Delta)     + dead letters, unit states
    | SumPerKeyAndStep()                     -> bounded: (key, ({step: total}, halt steps)),
                                                unbounded: (key, StepTotal)
    | KeepPublicKeys(public_keys)            -> the same, of public keys only
    | ReleasePerKey(config, public_keys)     -> records, one per key and step + key states
                                                + dead letters (exact totals)

Messages are typed (no in-band sentinels). A `StepWindow` [first, stop) says which steps a run
releases; bounded stages take the previous run's states (`resume_states`) and return their new
states beside their main output (the scheduler's checkpoint hooks). Bounded input is grouped
(GroupByKey / CombinePerKey) and every key's steps are released in one vectorised call; what
crosses a shuffle is plain tuples and dicts (a dataclass costs ~5x more to encode), and
truncation sums a bundle's contributions per key before they leave it (one element per key
and bundle, not one per contribution). Unbounded input runs stateful DoFns with event-time
timers at step ends, and step s of a key is released when the watermark passes the end of step
s + `release_delay_steps`.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import struct
from fractions import Fraction
from operator import itemgetter
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.coders import FastPrimitivesCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (BagStateSpec, ReadModifyWriteStateSpec,
                                              TimerSpec, on_timer)
from apache_beam.transforms.window import GlobalWindow, GlobalWindows, TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from transforms.mechanisms.base import EXACT_LIMIT, counter_state
from transforms.release import RecordMaker, ReleaseConfig, key_text
from transforms.steps import TimeSteps
from transforms.streams.count import HORIZON_CAP, KEY_CAP, STEP_CAP, UnitState
from transforms.streams.records import canonical
from transforms.streams.units import (CountProblem, DegreeProblem, EntityProblem, Problem,
                                      UnitRun, advance_unit, steps_to_run)
from transforms.validation import fail

_LIMIT = float(EXACT_LIMIT)  # exact totals (`RecordMaker.exact_totals`)
DEAD_LETTER = "dead_letter"
UNIT_STATES = "unit_states"
KEY_STATES = "key_states"
MICRO = 1e-6
METRICS = "continual_release"


# ----- keys ------------------------------------------------------------------------------------
class Id:
    """Type hint for unit and key ids (a non-empty str, an int, or a tuple of them): their
    coder is `KeyCoder`, deterministic, as state and grouping keys must be."""


def tagged(key_id):
    """An id as type-tagged JSON-able data (`KeyCoder`'s encoding: 1 and "1" differ)."""
    if isinstance(key_id, tuple):
        return ["t", [tagged(part) for part in key_id]]
    if isinstance(key_id, int) and not isinstance(key_id, bool):
        return ["i", str(key_id)]
    if isinstance(key_id, str):
        return ["s", key_id]
    return ["r", repr(key_id)]  # not an id: never a state key here; kept distinguishable


def _untagged(data):
    tag, body = data
    if tag == "t":
        return tuple(_untagged(part) for part in body)
    if tag == "i":
        return int(body)
    if tag == "s":
        return body
    raise ValueError(f"`key` must be an id (str, int or a tuple of them); got {body}.")


class KeyCoder(beam.coders.Coder):
    """Type-tagged JSON of an id: the same id always has the same bytes (1, "1" and (1,)
    differ), on every worker and Python version."""

    def encode(self, value) -> bytes:
        kind = type(value)
        if kind is int:  # fast paths: the very bytes json.dumps writes
            return b'["i","%d"]' % value
        if kind is str and '"' not in value and "\\" not in value and value.isprintable():
            return ('["s","' + value + '"]').encode("utf-8")
        return json.dumps(tagged(value), separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8")

    def decode(self, encoded: bytes):
        head = encoded[:6]
        if head == b'["i","':
            return int(encoded[6:-2])
        if head == b'["s","' and b"\\" not in encoded:
            return encoded[6:-2].decode("utf-8")
        return _untagged(json.loads(encoded.decode("utf-8")))

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return Id


beam.coders.registry.register_coder(Id, KeyCoder)
KEYED = Tuple[Id, Any]  # (unit or key id, message)


# ----- messages --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StepWindow:
    """The steps [first, stop) one run releases (one run of `pipelines.run`: all of them)."""
    first: int
    stop: int

    @classmethod
    def whole(cls, steps: TimeSteps) -> "StepWindow":
        return cls(0, steps.horizon)


class Event(NamedTuple):
    """An element's step, event time (microseconds) and parsed payload. `AssignSteps` emits
    it as the plain tuple (step, micros, payload): a tuple costs ~6x less to encode than a
    NamedTuple or dataclass in a shuffle; consumers index it (`STEP`, `MICROS`, `PAYLOAD`)."""
    step: int
    micros: int
    payload: Any


STEP, MICROS, PAYLOAD = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Delta:
    """One unit's change of a key's difference stream at a step, or `halt`: a bound violation
    at this step, from which nothing more of the key is released (fail closed)."""
    value: float = 0.0
    halt: bool = False


@dataclasses.dataclass(frozen=True)
class StepTotal:
    """A key's total change at a step (exact sum of its deltas), or a halt."""
    step: int
    value: float = 0.0
    halt: bool = False


@dataclasses.dataclass(frozen=True)
class Seed:
    """Starts a public key's release in streaming (every public key gets every step)."""


class StageOutput(NamedTuple):
    """A stage's main output, its dead letters and (bounded input) its new states; a NamedTuple
    so that Beam registers the PCollections as the composite's outputs."""
    main: Any
    dead_letters: Any = None
    states: Any = None


DEAD_LETTER_CHARS = 1024  # a dead letter keeps at most this much of the record's repr


def writable(text: str) -> str:
    """Text every coder and sink can encode: lone surrogates (text that is not Unicode, which
    UTF-8 cannot encode) become their backslash escapes (\\udc80); Unicode text is unchanged."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def dead_letter_record(record, reason: str) -> dict:
    """{"record": its repr (at most 1 KiB), "size": the repr's full length, "reason" (at most
    1 KiB)}: both always writable, whatever the record (a repr that fails or recurses too deep
    shows the record's type; text that is not Unicode is escaped)."""
    try:
        text = repr(record)
    except Exception as error:  # noqa: BLE001 (a bad record's own repr failing: no crash)
        text = f"<{type(record).__name__} whose repr fails: {type(error).__name__}>"
    text = writable(text)
    return {"record": text[:DEAD_LETTER_CHARS], "size": len(text),
            "reason": writable(str(reason))[:DEAD_LETTER_CHARS]}


def dead_letter(record, reason: str) -> beam.pvalue.TaggedOutput:
    return beam.pvalue.TaggedOutput(DEAD_LETTER, dead_letter_record(record, reason))


def _micros(seconds: float) -> Timestamp:
    return Timestamp(micros=int(round(seconds * 1e6)))


def _empty(pipeline, label):
    return pipeline | label >> beam.Create([])


class _PerUnitPacks:
    """A DoFn's per-bundle packs: (unit, Event tuple) -> (unit, [Event tuples]) once per unit
    and bundle (or per `MAX_EVENTS` buffered events): one shuffled element per unit and bundle,
    not per event (the shuffle's per-element cost dominates the bounded path)."""

    MAX_EVENTS = 500_000  # ~100 MB of buffered events at most

    def _start_packs(self):
        self._packs: Dict[Any, list] = {}
        self._buffered = 0

    def _pack(self, unit, event):
        """Adds one event; yields the packs when `MAX_EVENTS` are buffered."""
        found = self._packs.get(unit)
        if found is None:
            self._packs[unit] = [event]
        else:
            found.append(event)
        self._buffered += 1
        if self._buffered >= self.MAX_EVENTS:
            yield from self._flush()

    def _flush(self):
        packs, self._packs, self._buffered = self._packs, {}, 0
        for unit, events in packs.items():
            yield WindowedValue((unit, events), _END_OF_GLOBAL, _GLOBAL)


# ----- AssignSteps -----------------------------------------------------------------------------
@beam.typehints.with_output_types(KEYED)
class AssignStepsFn(_PerUnitPacks, beam.DoFn):
    """Timestamped element -> (unit, Event tuple), or with `packed` (bounded input) ->
    (unit, [Event tuples]) once per unit and bundle (or per `MAX_EVENTS` buffered events):
    step assignment and the per-unit packing before the shuffle in one DoFn, so an event
    crosses one Beam stage, and the shuffle moves one element per unit and bundle."""

    def __init__(self, problem: Problem, steps: TimeSteps, window: StepWindow,
                 diagnostics: bool = False, packed: bool = False):
        self.problem, self.steps, self.window = problem, steps, window
        self.diagnostics, self.packed = diagnostics, packed

    def start_bundle(self):
        self._released = self._assigned = 0  # counted here, one Metrics.inc per bundle
        self._start_packs()

    def finish_bundle(self):
        # operator-only: how many events of already released steps a resumed run skipped,
        # and how many events entered truncation
        if self.diagnostics:
            if self._released:
                Metrics.counter(METRICS, "events_of_released_steps").inc(self._released)
            if self._assigned:
                Metrics.counter(METRICS, "events_in_window").inc(self._assigned)
            self._released = self._assigned = 0
        yield from self._flush()

    def process(self, element, timestamp=beam.DoFn.TimestampParam):
        out = self._assign(element, timestamp.micros)
        if out is None:
            return
        if not self.packed or type(out) is not tuple:  # an event, or a dead letter
            yield out
            return
        yield from self._pack(*out)

    def _assign(self, element, micros: int):
        """The one per-element rule: a dead letter (TaggedOutput), None (skipped), or
        (unit, Event tuple)."""
        seconds = float(micros) / 1e6
        step = self.steps.step_of(seconds)
        if step is None:
            return dead_letter(element, f"event time {self.steps.iso(seconds)} is outside the "
                                        f"horizon [{self.steps.iso(self.steps.origin)}, "
                                        f"{self.steps.iso(self.steps.stop)})")
        if step < self.window.first:  # released by an earlier run: skipped (the source
            self._released += 1       # holds history), not a dead letter each
            return None
        if step >= self.window.stop:
            return None  # left for a later run, which reads it again (not lost)
        parsed, reason = self.problem.parse(element)
        if parsed is None:
            return dead_letter(element, reason)
        self._assigned += 1
        return parsed.unit, (step, int(micros), parsed.payload)  # an Event, as a tuple


class AssignSteps(beam.PTransform):
    """Timestamped elements -> (unit, Event tuple) for the steps of `window`; elements outside the
    horizon or malformed -> dead letters with a reason. Elements of steps before the window
    (released by an earlier run) are skipped, those after it are left for a later run.

    The input may also be `EventBatch`es (`transforms.arrow_input.ArrowEvents`, bounded
    input): steps are then assigned with numpy, with the same result event for event. With
    `packed` (bounded input; `TruncatePerUnit(packed=True)` takes it) the output is
    (unit, [Event tuples]), one element per unit and bundle."""

    def __init__(self, problem: Problem, steps: TimeSteps, window: Optional[StepWindow] = None,
                 diagnostics: bool = False, packed: bool = False):
        super().__init__()
        self.problem, self.steps = problem, steps
        self.window = window or StepWindow.whole(steps)
        self.diagnostics, self.packed = diagnostics, packed

    def expand(self, events):
        from transforms.arrow_input import is_batched
        if self.packed and not events.is_bounded:
            fail("packed", "False for unbounded input (streaming truncation takes events)",
                 True)
        batched = is_batched(events)
        # steps come from event times, not windows: one global window, whatever the input's
        # windowing (per-window truncation would bound a unit only within each window)
        if not events.windowing.is_default():  # (WindowInto costs ~3 us an element)
            events = events | "GlobalWindow" >> beam.WindowInto(GlobalWindows())
        if batched:
            if not events.is_bounded:
                fail("input", "bounded when it holds EventBatches (unbounded input: "
                              "timestamped elements)", "unbounded EventBatches")
            from transforms.arrow_input import AssignBatchStepsFn
            fn = AssignBatchStepsFn(self.problem, self.steps, self.window, self.diagnostics,
                                    self.packed)
        else:
            fn = AssignStepsFn(self.problem, self.steps, self.window, self.diagnostics,
                                self.packed)
        out = events | "Assign" >> beam.ParDo(fn).with_outputs(DEAD_LETTER, main="events")
        return StageOutput(out.events, out[DEAD_LETTER])


# ----- TruncatePerUnit -------------------------------------------------------------------------
def sorted_payloads(events: Iterable[Sequence]) -> Dict[int, List[Any]]:
    """Payloads per step in (event time, canonical payload) order: bundle order never matters.
    `events` are Event tuples (step, micros, payload). The reference order of every path."""
    by_step: Dict[int, List[Tuple[int, Any]]] = {}
    for event in events:
        by_step.setdefault(event[STEP], []).append((event[MICROS], event[PAYLOAD]))
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
    """Payloads per step; in `sorted_payloads`' order if `ordered` (else in any order)."""
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


def _key_order(kv):
    return canonical(kv[0])


def _event_order(event):
    return canonical(event[0]), event[1]


def truncate_counts(problem: CountProblem, state: UnitState, by_step: Dict[int, Sequence],
                    steps: Iterable[int]
                    ) -> Tuple[List[Tuple[Any, int, float]], UnitState, collections.Counter]:
    """`advance_unit` for counts and sums in one pass: (contributions (key, step, value), new
    state, dropped events by the bound that cut them). The same operations as
    `ContributionBounds.step` and `CountProblem.advance` in the same order (so bit for bit the
    same floats), without the per-step objects; a step's payloads may come in any order (the
    machine sorts them canonically)."""
    limits = count_bounds(problem.bounds)
    keys, used = list(state.keys), state.used
    out_all: List[Tuple[Any, int, float]] = []
    dropped = collections.Counter()
    for step in steps:
        used = truncate_count_step(limits, keys, used, step, by_step.get(step, ()), out_all,
                                   dropped)
    return out_all, UnitState(used, tuple(keys)), dropped


# problems whose `advance` is EntityProblem.advance itself (a subclass may change it)
_ONE_PASS_ENTITIES = tuple(kind for kind in (EntityProblem, DegreeProblem)
                           if kind.advance is EntityProblem.advance)


def truncate_entities(problem: EntityProblem, unit, state, by_step: Dict[int, Sequence],
                      steps: Iterable[int]) -> UnitRun:
    """`advance_unit` for `EntityProblem` (count-distinct, degrees) in one pass: the same
    operations as `EntityProblem.advance` step after step, without copying the state and
    building a StepResult at every step."""
    admitted, machines = list(state[0]), dict(state[1])
    max_keys, machine, targets = problem.max_keys_per_unit, problem.machine, problem.targets
    out: List[Tuple[Any, int, float]] = []
    capped = bounded = 0
    for step in steps:
        payloads = by_step.get(step, ())
        if len(payloads) == 1:
            (op, key), = payloads
            if key not in admitted:
                if len(admitted) < max_keys:
                    admitted.append(key)
                else:
                    capped += 1
                    continue
            ops_by_key = {key: [op]}
        else:
            if len(admitted) < max_keys:
                for key in sorted({key for _, key in payloads} - set(admitted), key=canonical):
                    if len(admitted) < max_keys:
                        admitted.append(key)
            ops_by_key = {}
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
                out.extend((target, step, float(change)) for target in targets(unit, key))
    run = UnitRun((tuple(admitted), machines), out)
    if capped:
        run.dropped[KEY_CAP] += capped
    if bounded:
        run.dropped["contribution bound"] += bounded
    return run


def run_unit(problem: Problem, unit, state, by_step: Dict[int, Sequence], first: int,
             stop: int) -> UnitRun:
    """One unit's machine over the steps [first, stop) it must see: `advance_unit`, with a
    one-pass loop for counts and sums (`truncate_counts`) and for count-distinct and degrees
    (`truncate_entities`): the same result, bit for bit (tests/test_stages.py)."""
    steps = steps_to_run(problem, by_step, first, stop)
    kind = type(problem)
    if kind is CountProblem:
        contributions, state, dropped = truncate_counts(problem, state, by_step, steps)
        run = UnitRun(state, contributions)
        run.dropped.update(dropped)
        return run
    if kind in _ONE_PASS_ENTITIES:
        return truncate_entities(problem, unit, state, by_step, steps)
    return advance_unit(problem, unit, state, by_step, steps)


def count_truncation(run: UnitRun) -> None:
    """Operator-only metrics (they depend on private data): updates the unit's machine dropped,
    by the bound that cut them (`truncated_by_max_contributions`, `..._per_step`,
    `truncated_by_max_keys_per_unit`, `truncated_by_contribution_bound` for flips/updates)."""
    count_dropped(run.dropped)


def count_dropped(dropped: Dict[str, int]) -> None:
    """`count_truncation` of dropped events counted per bound (reason -> count)."""
    for reason, count in dropped.items():
        Metrics.counter(METRICS, "truncated_by_" + reason.replace(" ", "_")).inc(count)


def _unit_outputs(unit, run: UnitRun, step_end=None):
    """Contributions, then the halt (dead letter + halt delta for the unit's key)."""
    for key, step, value in run.contributions:
        item = ((key, step), Delta(value))
        yield item if step_end is None else TimestampedValue(item, step_end(step) - MICRO)
    if run.halt is not None:
        yield dead_letter(unit, run.halt.reason)
        item = ((unit, run.halt.step), Delta(halt=True))
        yield item if step_end is None else TimestampedValue(item,
                                                             step_end(run.halt.step) - MICRO)


class KeySums:
    """A bundle's (then a key's) exact sums of one key's deltas per step: integer deltas add
    up as Python ints (exact), fractional ones as Shewchuk partials; `halts` are the steps with
    a halt. On the wire (bounded input) the plain tuple (ints, partials, halts):
    ({step: int}, {step: [partials]}, [halt steps])."""

    @staticmethod
    def new():
        return {}, {}, set()

    @staticmethod
    def add(acc, step: int, value: float) -> None:
        ints, partials, _ = acc
        if isinstance(value, int) or value.is_integer():
            ints[step] = ints.get(step, 0) + int(value)
        else:
            partials[step] = add_exact(partials.get(step, []), value)

    @staticmethod
    def merge(acc, wire) -> None:
        ints, partials, halts = acc
        for step, value in wire[0].items():
            ints[step] = ints.get(step, 0) + value
        for step, values in wire[1].items():
            found = partials.get(step, [])
            for value in values:
                found = add_exact(found, value)
            partials[step] = found
        halts.update(wire[2])

    @staticmethod
    def wire(acc):
        return acc[0], acc[1], sorted(acc[2])

    @staticmethod
    def totals(acc) -> Dict[int, float]:
        """{step: the correctly rounded exact total} (as math.fsum of all deltas): the exact
        integer below 2^53 in magnitude; a total at or beyond it (rounded here) halts its key
        in the release (`RecordMaker.exact_totals`)."""
        ints, partials, _ = acc
        out = {step: float(value) for step, value in ints.items()}
        for step, values in partials.items():
            whole = ints.get(step, 0)
            if abs(whole) <= 2 ** 53:  # float(whole) is exact
                out[step] = math.fsum(values + [float(whole)])
            else:
                out[step] = float(sum((Fraction(v) for v in values), Fraction(whole)))
        return out


GLOBAL = GlobalWindow()  # a singleton
_GLOBAL = (GLOBAL,)
_END_OF_GLOBAL = GLOBAL.max_timestamp()


@beam.typehints.with_output_types(KEYED)
class _PackPerUnitFn(_PerUnitPacks, beam.DoFn):
    """(unit, Event tuple) -> (unit, [Event tuples]) once per unit and bundle."""

    def start_bundle(self):
        self._start_packs()

    def process(self, element):
        yield from self._pack(*element)

    def finish_bundle(self):
        yield from self._flush()


@beam.typehints.with_output_types(KEYED)
class _TruncateUnitsFn(beam.DoFn):
    """(unit, [packs of Event tuples]) or, resumed, (unit, ([packs], [saved state])) -> the new
    unit state (tagged) and, once per bundle, (key, KeySums wire tuple) of every key the
    bundle's units contributed to (fewer, larger elements than one per contribution)."""

    def __init__(self, problem: Problem, window: StepWindow, diagnostics: bool,
                 with_states: bool = True):
        self.problem, self.window = problem, window
        self.diagnostics, self.with_states = diagnostics, with_states

    def start_bundle(self):
        self._sums: Dict[Any, tuple] = {}
        self._dropped: collections.Counter = collections.Counter()

    def process(self, item):
        unit, grouped = item
        if self.with_states:
            packs, saved = grouped
            saved = list(saved)
        else:
            packs, saved = grouped, ()
        packs = list(packs)
        wire_events = packs[0] if len(packs) == 1 else [e for pack in packs for e in pack]
        state = saved[0] if saved else self.problem.init_state()
        problem = self.problem
        by_step = payloads_by_step(wire_events, ordered=type(problem) is not CountProblem)
        # a unit first seen in a resumed run starts its machine at step 0 (it had no events)
        run = run_unit(problem, unit, state, by_step, self.window.first if saved else 0,
                       self.window.stop)
        if self.diagnostics:  # operator-only: depends on private data
            self._dropped.update(run.dropped)
        sums = self._sums
        for key, step, value in run.contributions:
            acc = sums.get(key)
            if acc is None:
                acc = sums[key] = KeySums.new()
            KeySums.add(acc, step, value)
        if run.halt is not None:
            yield dead_letter(unit, run.halt.reason)
            acc = sums.get(unit)
            if acc is None:
                acc = sums[unit] = KeySums.new()
            acc[2].add(run.halt.step)
        yield beam.pvalue.TaggedOutput(UNIT_STATES, (unit, run.state))

    def finish_bundle(self):
        for reason, count in self._dropped.items():
            Metrics.counter(METRICS, "truncated_by_" + reason.replace(" ", "_")).inc(count)
        for key, acc in self._sums.items():
            yield WindowedValue((key, KeySums.wire(acc)), _END_OF_GLOBAL, _GLOBAL)
        self._sums, self._dropped = {}, collections.Counter()


def count_bounds(bounds) -> Tuple[float, int, Optional[float], int]:
    """(per_step, max_contributions, max_value, max_keys_per_unit) of ContributionBounds."""
    return (bounds.per_step, bounds.max_contributions, bounds.max_value,
            bounds.max_keys_per_unit)


def truncate_count_step(bounds: tuple, keys: list, used: float, step: int, events: Sequence,
                         out_all: list, dropped: Optional[dict]) -> float:
    """One step of `truncate_counts` (the same operations as `ContributionBounds.step` and
    `CountProblem.advance` in the same order, so bit for bit the same floats), shared by the
    bounded pass and the streaming flush: appends the step's contributions (key, step,
    value) to `out_all`, admits keys into `keys` (in place), counts dropped events by bound
    into `dropped` (if not None) and returns the new `used`. `bounds` is `count_bounds`.
    tests/test_streaming_perf_paths.py checks the flush against `advance_unit`."""
    per_step, total, most, max_keys = bounds
    if len(events) == 1:  # the loop below for one event, unrolled
        (key, value), = events
        if len(keys) < max_keys and key not in keys:
            keys.append(key)
        if total - used <= 0:
            reason = HORIZON_CAP if key in keys else KEY_CAP
        elif key not in keys:
            reason = KEY_CAP
        else:
            amount = value if most is None else min(max(value, 0.0), most)
            step_room, horizon_room = per_step - 0.0, total - used
            room = min(step_room, horizon_room)
            take = min(amount, room) if most is not None else (
                amount if amount <= room else 0.0)
            if take <= 0:
                reason = HORIZON_CAP if horizon_room <= step_room else STEP_CAP
            else:
                out_all.append((key, step, 0.0 + take))
                return used + take
        if dropped is not None:
            dropped[reason] = dropped.get(reason, 0) + 1
        return used
    if len(keys) < max_keys:  # first come (by step), ties in canonical key order
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
    out: Dict[Any, float] = {}
    step_used = 0.0
    for key, value in (events if len(events) == 1 else sorted(events, key=_event_order)):
        if key not in keys:
            if dropped is not None:
                dropped[KEY_CAP] = dropped.get(KEY_CAP, 0) + 1
            continue
        amount = value if most is None else min(max(value, 0.0), most)
        step_room, horizon_room = per_step - step_used, total - used
        room = min(step_room, horizon_room)
        take = min(amount, room) if most is not None else (
            amount if amount <= room else 0.0)
        if take <= 0:
            if dropped is not None:
                reason = HORIZON_CAP if horizon_room <= step_room else STEP_CAP
                dropped[reason] = dropped.get(reason, 0) + 1
            continue
        out[key] = out.get(key, 0.0) + take
        step_used += take
        used += take
    if len(out) == 1:
        for key, value in out.items():
            out_all.append((key, step, value))
    elif out:
        out_all.extend((key, step, value) for key, value in sorted(out.items(),
                                                                  key=_key_order))
    return used


_new_instance = object.__new__


_SHARED_DELTAS: Dict[float, Delta] = {}  # a nonzero float -> its Delta (bounded)


def delta_of(value: float) -> Delta:
    """Delta(value): the instance dict filled directly, as the frozen dataclass's __init__
    does through object.__setattr__ (equal, hashed and pickled alike). A Delta is immutable,
    so one instance per nonzero float value is shared (counts emit a few values over and
    over); zeros are not shared (0.0 == -0.0), nor other types (1 == 1.0)."""
    if type(value) is float:
        shared = _SHARED_DELTAS.get(value)
        if shared is not None:
            return shared
    delta = _new_instance(Delta)
    fields = delta.__dict__
    fields["value"] = value
    fields["halt"] = False
    if type(value) is float and value != 0.0 and len(_SHARED_DELTAS) < 1024:
        _SHARED_DELTAS[value] = delta
    return delta


_NOTHING_BUFFERED = (0, None, None)  # a unit's progress before its first event
_FAST_PRIMITIVES = FastPrimitivesCoder().get_impl()


class FastStateCoder(FastPrimitivesCoder):
    """Beam's FastPrimitivesCoder (tuples of ints, floats, str and bytes round-trip with their
    types; other objects are pickled) with its compiled encode / decode as the methods
    themselves. The DirectRunner codes state through `Coder.encode` / `decode` at every
    access, where the base class adds two Python calls (~0.25 us of ~0.6); runners on the Fn
    API use the same compiled impl either way."""

    encode = _FAST_PRIMITIVES.encode  # a compiled method: no binding, no Python frame
    decode = _FAST_PRIMITIVES.decode


@beam.typehints.with_output_types(Tuple[Tuple[Id, int], Any])
class TruncateStreamingFn(beam.DoFn):
    """Unbounded input: buffer a unit's events until the watermark passes their step's end.

    State per unit: the progress (next step to process, earliest buffered step or None, and the
    buffered event itself while it is the only one: the one cell an event reads), the bag of
    buffered events when there are two or more, and the machine's state (read and written only
    at a step end). A unit has mostly one event per step, which then costs two state
    operations at the event and three or four at its step end (progress, machine state), no
    bag."""

    # FastPrimitivesCoder (40% faster to encode than pickle)
    BUFFER = BagStateSpec("buffer", FastStateCoder())
    # the machine's state; counts keep theirs as the plain tuple (used, keys) (a tuple encodes
    # several times faster than the UnitState dataclass)
    UNIT = ReadModifyWriteStateSpec("unit", FastStateCoder())
    # (done, earliest, held): nothing buffered iff earliest is None; exactly one event buffered
    # iff held is not None (it is held here, the bag is empty); else the bag holds them all
    PROGRESS = ReadModifyWriteStateSpec("progress", FastStateCoder())
    STEP_END = TimerSpec("step_end", TimeDomain.WATERMARK)

    def __init__(self, problem: Problem, steps: TimeSteps, diagnostics: bool):
        self.problem, self.steps = problem, steps
        self.diagnostics = diagnostics
        self.setup()

    def setup(self):
        self._ends: Dict[int, Timestamp] = {}  # step -> its end, bounded
        self._stamps: Dict[int, Timestamp] = {}  # step -> its outputs' event time, bounded
        self._ready: Dict[int, int] = {}  # a firing's micros -> `_ready_through`, bounded
        self._bounds = self._fresh = None
        if type(self.problem) is CountProblem:
            self._bounds = count_bounds(self.problem.bounds)
            fresh = self.problem.init_state()
            self._fresh = (fresh.used, tuple(fresh.keys))  # a count unit's first saved state

    def _ready_through(self, fire: Timestamp) -> int:
        """The last step a timer firing at `fire` processes: the largest s in [-1, T) whose
        end is <= fire + 1 us (ends grow with s, so an event is ready iff its step is <= it:
        the same test as comparing each event's end), cached per firing time."""
        micros = fire.micros
        found = self._ready.get(micros)
        if found is None:
            limit, end = float(micros) / 1e6 + MICRO, self.steps.end
            low, high = -1, self.steps.horizon - 1  # end(low) <= limit (low = -1: none)
            while low < high:
                middle = (low + high + 1) // 2
                if end(middle) <= limit:
                    low = middle
                else:
                    high = middle - 1
            if len(self._ready) >= 1 << 16:
                self._ready.clear()
            found = self._ready[micros] = low
        return found

    def _end(self, step: int) -> Timestamp:
        """The end of `step` as a Timestamp (the step-end timer), cached."""
        ends = self._ends
        found = ends.get(step)
        if found is None:
            if len(ends) >= 1 << 16:
                ends.clear()
            found = ends[step] = _micros(self.steps.end(step))
        return found

    def _stamp(self, step: int) -> Timestamp:
        """The event time of a step's outputs (its end - 1 us, as `_unit_outputs`), cached."""
        stamps = self._stamps
        found = stamps.get(step)
        if found is None:
            if len(stamps) >= 1 << 16:
                stamps.clear()
            found = stamps[step] = Timestamp.of(self.steps.end(step) - MICRO)
        return found

    def process(self, element, buffer=beam.DoFn.StateParam(BUFFER),
                progress=beam.DoFn.StateParam(PROGRESS),
                timer=beam.DoFn.TimerParam(STEP_END)):
        unit, event = element
        step = event[STEP]
        current = progress.read()
        done, earliest, held = _NOTHING_BUFFERED if current is None else current
        if step < done:
            yield dead_letter((unit, event[PAYLOAD]),
                              f"late: step {step} of this unit was already processed")
            return
        if type(event) is not tuple:
            event = tuple(event)
        if earliest is None:  # the only buffered event: held in the progress cell
            progress.write((done, step, event))
            timer.set(self._end(step))
            return
        if held is not None:  # a second event: both go to the bag
            buffer.add(held)
        buffer.add(event)
        if step < earliest:
            progress.write((done, step, None))
            timer.set(self._end(step))
        elif held is not None:
            progress.write((done, earliest, None))

    @on_timer(STEP_END)
    def flush(self, key=beam.DoFn.KeyParam, fire=beam.DoFn.TimestampParam,
              buffer=beam.DoFn.StateParam(BUFFER), unit_state=beam.DoFn.StateParam(UNIT),
              progress=beam.DoFn.StateParam(PROGRESS),
              timer=beam.DoFn.TimerParam(STEP_END)):
        through = self._ready_through(fire)
        current = progress.read()
        done, earliest, held = _NOTHING_BUFFERED if current is None else current
        if held is not None and self._bounds is not None and done <= earliest <= through:
            # the common case, one count event held in the progress cell: `truncate_counts`
            # for its step, as below
            saved = unit_state.read() or self._fresh
            used, keys = saved[0], list(saved[1])
            contributions = []
            dropped = {} if self.diagnostics else None
            used = truncate_count_step(self._bounds, keys, used, earliest, (held[PAYLOAD],),
                                       contributions, dropped)
            if dropped:
                count_dropped(dropped)
            for unit_key, step, value in contributions:
                yield TimestampedValue(((unit_key, step), delta_of(value)), self._stamp(step))
            if used != saved[0] or len(keys) != len(saved[1]):
                unit_state.write((used, tuple(keys)))
            progress.write((earliest + 1, None, None))
            return
        bagged = earliest is not None and held is None
        ready, later = [], []
        for event in ((held,) if held is not None else buffer.read() if bagged else ()):
            (ready if event[STEP] <= through else later).append(event)
        problem = self.problem
        saved = unit_state.read()
        stamp = self._stamp
        if type(problem) is CountProblem:  # = run_unit: truncate_counts, step by step
            if saved is None:
                saved = self._fresh
            used, keys = saved[0], list(saved[1])
            admitted = len(keys)
            contributions: List[Tuple[Any, int, float]] = []
            dropped = {} if self.diagnostics else None
            bounds = self._bounds
            if len(ready) == 1:  # the common case: one event
                last = ready[0][STEP]
                if done <= last:
                    used = truncate_count_step(bounds, keys, used, last, (ready[0][PAYLOAD],),
                                                contributions, dropped)
            else:
                by_step = payloads_by_step(ready, ordered=False)  # the machine sorts a step
                last = max(by_step) if by_step else done - 1
                for step in (sorted(by_step) if len(by_step) > 1 else by_step):
                    if done <= step:
                        used = truncate_count_step(bounds, keys, used, step, by_step[step],
                                                    contributions, dropped)
            if dropped:
                count_dropped(dropped)
            for unit_key, step, value in contributions:  # as _unit_outputs, stamps cached
                yield TimestampedValue(((unit_key, step), delta_of(value)), stamp(step))
            if bagged:
                buffer.clear()
            if used != saved[0] or len(keys) != admitted:  # else the machine did not move
                unit_state.write((used, tuple(keys)))
        else:
            state = problem.init_state() if saved is None else saved
            # the order `sorted_payloads` gives (= advance_unit's)
            by_step = payloads_by_step(ready, ordered=True)
            last = max(by_step) if by_step else done - 1
            run = run_unit(problem, key, state, by_step, done, last + 1)  # = advance_unit
            if self.diagnostics:
                count_truncation(run)
            for unit_key, step, value in run.contributions:  # as _unit_outputs
                yield TimestampedValue(((unit_key, step), delta_of(value)), stamp(step))
            if bagged:
                buffer.clear()
            if run.halt is not None:
                yield dead_letter(key, run.halt.reason)
                yield TimestampedValue(((key, run.halt.step), Delta(halt=True)),
                                       stamp(run.halt.step))
                # nothing more from this unit
                progress.write((self.steps.horizon, None, None))
                return
            unit_state.write(run.state)
        if not later:
            progress.write((last + 1, None, None))
            return
        first = min(event[STEP] for event in later)
        if len(later) == 1:
            progress.write((last + 1, first, later[0]))
        else:
            for event in later:
                buffer.add(event)
            progress.write((last + 1, first, None))
        timer.set(self._end(first))


class TruncatePerUnit(beam.PTransform):
    """(unit, Event) -> what each unit contributes: each unit's state machine (`streams.units`)
    run over its steps in order, which bounds what one unit contributes. Bounded input groups a
    unit's events with its saved state (`resume_states`, (unit, state) pairs), returns the new
    states and emits (key, KeySums wire tuple), one per key and bundle (the bundle's exact sums
    per step and its halts); unbounded input keeps the states in Beam state and emits
    ((key, step), Delta) at each step's end. With `packed` (bounded input) the input is
    already packed per unit: (unit, [Event tuples]) from `AssignSteps(packed=True)`."""

    def __init__(self, problem: Problem, steps: TimeSteps, window: Optional[StepWindow] = None,
                 resume_states=None, diagnostics: bool = False, packed: bool = False):
        super().__init__()
        self.problem, self.steps = problem, steps
        self.window = window or StepWindow.whole(steps)
        self.resume_states, self.diagnostics = resume_states, diagnostics
        self.packed = packed  # input already (unit, [Event tuples]) (AssignSteps(packed=True))

    def expand(self, events):
        if not events.is_bounded:
            if self.resume_states is not None:
                fail("resume_states", "None for unbounded input (Beam keeps the state)",
                     "states")
            out = events | "Truncate" >> beam.ParDo(TruncateStreamingFn(
                self.problem, self.steps, self.diagnostics)).with_outputs(
                    DEAD_LETTER, main="deltas")
            return StageOutput(out.deltas, out[DEAD_LETTER])
        # plain tuples through the shuffle (a dataclass costs ~5x more to encode), packed:
        # one list of events per unit and bundle
        packed = events if self.packed else events | "PackPerUnit" >> beam.ParDo(
            _PackPerUnitFn())
        if self.resume_states is None:
            grouped = packed | "GroupByUnit" >> beam.GroupByKey()
        else:
            grouped = ({"events": packed, "state": self.resume_states}
                       | "GroupByUnit" >> beam.CoGroupByKey()
                       | "EventsAndState" >> beam.MapTuple(
                           lambda unit, parts: (unit, (parts["events"], parts["state"]))))
        out = (grouped
               | "Truncate" >> beam.ParDo(_TruncateUnitsFn(
                   self.problem, self.window, self.diagnostics,
                   with_states=self.resume_states is not None)).with_outputs(
                       DEAD_LETTER, UNIT_STATES, main="deltas"))
        return StageOutput(out.deltas, out[DEAD_LETTER], out[UNIT_STATES])


# ----- SumPerKeyAndStep ------------------------------------------------------------------------
def add_exact(partials: List[float], value: float) -> List[float]:
    """Shewchuk's exact running sum: math.fsum(partials) is the correctly rounded total, so the
    result does not depend on the order contributions arrive in (batch = streaming)."""
    out = []
    for partial in partials:
        if abs(value) < abs(partial):
            value, partial = partial, value
        high = value + partial
        low = partial - (high - value)
        if low:
            out.append(low)
        value = high
    out.append(value)
    return out


class ExactSum(beam.CombineFn):
    """Exact sum of deltas; a halt wins (fail closed). Accumulator: (partials, halted)."""

    def create_accumulator(self):
        return [], False

    def add_input(self, acc, delta: Delta):
        if delta.halt:
            return acc[0], True
        return add_exact(acc[0], delta.value), acc[1]

    def merge_accumulators(self, accs):
        partials, halted = [], False
        for acc in accs:
            for value in acc[0]:
                partials = add_exact(partials, value)
            halted = halted or acc[1]
        return partials, halted

    def extract_output(self, acc):
        return math.fsum(acc[0]), acc[1]


class _KeySumsFn(beam.CombineFn):
    """Merges a key's KeySums wire tuples -> (key totals {step: exact total}, halt steps)."""

    def create_accumulator(self):
        return KeySums.new()

    def add_input(self, acc, wire):
        KeySums.merge(acc, wire)
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        out = next(accs)
        for acc in accs:
            KeySums.merge(out, acc)
        return out

    def extract_output(self, acc):
        return KeySums.totals(acc), tuple(sorted(acc[2]))


class SumPerKeyAndStep(beam.PTransform):
    """Exact totals per key and step. Bounded: (key, KeySums wire tuple) -> one (key,
    ({step: total}, (halt steps))) per key (CombinePerKey; a total is the correctly rounded
    exact sum of the key's deltas at the step). Unbounded: ((key, step), Delta) -> one
    (key, StepTotal) per delta (the release sums them exactly)."""

    def expand(self, deltas):
        if not deltas.is_bounded:
            return deltas | "ToStepTotals" >> beam.MapTuple(
                lambda key_step, delta: (key_step[0], StepTotal(key_step[1], delta.value,
                                                                delta.halt))
            ).with_output_types(KEYED)
        return deltas | "ExactSums" >> beam.CombinePerKey(_KeySumsFn()).with_output_types(KEYED)


# ----- KeepPublicKeys --------------------------------------------------------------------------
class KeepPublicKeys(beam.PTransform):
    """Keeps the totals of public keys. Others are dropped: their presence must not decide any
    output (the count of them goes to an operator-only metric with `diagnostics`)."""

    def __init__(self, public_keys: Sequence, diagnostics: bool = False):
        super().__init__()
        self.public_keys, self.diagnostics = list(public_keys), diagnostics

    def expand(self, totals):
        public = set(self.public_keys)
        dropped = Metrics.counter(METRICS, "dropped_non_public_keys") \
            if self.diagnostics else None

        def keep(item):
            key, total = item
            if key in public:
                yield item
            elif dropped is not None:
                if isinstance(total, StepTotal):  # unbounded: one total
                    if total.halt or total.value != 0:
                        dropped.inc()
                else:  # bounded: the key's totals and halts, counted per step as above
                    values, halts = total
                    count = len(set(halts).union(s for s, v in values.items() if v != 0))
                    if count:
                        dropped.inc(count)

        return totals | "KeepPublic" >> beam.FlatMap(keep).with_output_types(KEYED)


# ----- ReleasePerKey ---------------------------------------------------------------------------
class _ReleaseKeysFn(beam.DoFn):
    """(key, {"totals": [StepTotal], "state": [saved], "seed": [...]}) -> the key's records for
    the window's steps and its new state (tagged with the release: a state of another release
    or secret is refused, it would re-draw published noise)."""

    def __init__(self, config: ReleaseConfig, window: StepWindow):
        self.config, self.window = config, window

    def setup(self):
        self.maker = RecordMaker(self.config)
        steps = self.config.steps  # every record of a step carries the same event time
        self._stamps = [Timestamp.of(steps.end(step) - MICRO) for step in range(steps.horizon)]

    def process(self, item, window=beam.DoFn.WindowParam):
        key, grouped = item
        if list(grouped["seed"]):  # else not a public key: no output, whatever its data or state
            yield from self._release(key, grouped, window)

    def _release(self, key, grouped, window=None):
        first, stop = self.window.first, self.window.stop
        saved = list(grouped["state"])
        if len(saved) > 1:
            fail("key states", f"one per key (key {key_text(key)!r} has {len(saved)})",
                 len(saved))
        if saved:
            data, halted = saved[0]
            state = self.maker.restore(key, data)
        elif first == 0:
            state, halted = self.maker.mechanism.init_state(), None
        else:
            raise RuntimeError(f"no saved state for public key {key_text(key)!r}")
        if state.steps != first:
            raise RuntimeError(f"key {key_text(key)!r} is at step {state.steps}, the run "
                               f"starts at {first}")
        x = np.zeros(stop - first)
        for values, halts in grouped["totals"]:  # one per key (SumPerKeyAndStep)
            if halts:
                halted = min(halts) if halted is None else min(halted, min(halts))
            for step, value in values.items():
                if step not in halts:  # a halted step's sum is not added (as one StepTotal)
                    x[step - first] += value
        maker = self.maker
        over = maker.exact_halt(state, x)  # exact totals: None unless a total reaches 2^53
        if over is not None:
            x[over:] = 0.0  # not summed: the key's state keeps its exact total
            if halted is None or first + over < halted:
                halted = first + over
                yield dead_letter(key, maker.limit_reason(key, halted))
            if over == 0 and not -_LIMIT < state.running_total < _LIMIT:  # (an old state's)
                state = counter_state(stop, state.running_total)  # the steps only
                x = x[:0]
        outputs, state = maker.for_key(key).advance(state, x) if x.shape[0] else ((), state)
        if maker.exact_totals:  # a released value reaching 2^53 halts the key too
            count = len(outputs) if halted is None else halted - first
            over = maker.exact_outputs(outputs, count)
            if over is not None:
                halted = first + over
                yield dead_letter(key, maker.limit_reason(key, halted))
        stamps = self._stamps
        for offset, value in enumerate(outputs):
            step = first + offset
            if halted is not None and step >= halted:
                break
            record = self.maker.record(key, step, float(value))
            if isinstance(window, GlobalWindow):  # = TimestampedValue, without re-assigning
                yield WindowedValue(record, stamps[step], _GLOBAL)
            else:
                yield TimestampedValue(record, stamps[step])
        yield beam.pvalue.TaggedOutput(KEY_STATES, (key, (self.maker.seal(key, state), halted)))


def _partials_struct(count: int) -> struct.Struct:
    """(step, count, count float64 partials) of one pending step (cached per count)."""
    found = _PARTIALS.get(count)
    if found is None:
        found = _PARTIALS[count] = struct.Struct("<II%dd" % count)
    return found


_PARTIALS: Dict[int, struct.Struct] = {}


class ReleaseStateCoder(beam.coders.Coder):
    """`ReleaseStreamingFn`'s state of one key, (sealed mechanism state or None, steps
    released, halt step or None, pending exact sums {step: [partials]}), as compact bytes:
    a header (steps released, halt step or -1, sealed length or -1, number of pending steps),
    the sealed bytes, then per pending step (step, number of partials, the partials as
    float64: exact, so the sums stay exact). Steps fit 31 bits (struct refuses others)."""

    _HEAD = struct.Struct("<IiiI")
    _ENTRY = struct.Struct("<II")
    # the common layouts in one struct call: a sealed CounterState (33 bytes) and one pending
    # step with one partial (or none)
    _ONE = struct.Struct("<IiiI33sIId")
    _NONE = struct.Struct("<IiiI33s")

    def encode(self, value) -> bytes:
        sealed, released, halted, pending = value
        if sealed is not None and len(sealed) == 33 and len(pending) <= 1:
            halt = -1 if halted is None else halted
            if not pending:
                return self._NONE.pack(released, halt, 33, 0, sealed)
            (step, partials), = pending.items()
            if len(partials) == 1:
                return self._ONE.pack(released, halt, 33, 1, sealed, step, 1, partials[0])
        head = self._HEAD.pack(released, -1 if halted is None else halted,
                               -1 if sealed is None else len(sealed), len(pending))
        if sealed is not None:
            head += sealed
        if not pending:
            return head
        parts = [head]
        for step, partials in pending.items():
            count = len(partials)
            parts.append(_partials_struct(count).pack(step, count, *partials))
        return b"".join(parts)

    def decode(self, encoded: bytes):
        if type(encoded) is not bytes:
            encoded = bytes(encoded)
        if len(encoded) == 65:  # = self._ONE.size
            released, halted, size, count, sealed, step, n, value = self._ONE.unpack(encoded)
            if size == 33 and count == 1 and n == 1:
                return sealed, released, None if halted < 0 else halted, {step: [value]}
        released, halted, size, count = self._HEAD.unpack_from(encoded)
        at = 16  # self._HEAD.size
        sealed = None
        if size >= 0:
            sealed, at = encoded[at:at + size], at + size
        pending = {}
        if count:
            entry = self._ENTRY.unpack_from
            for _ in range(count):
                step, n = entry(encoded, at)
                layout = _partials_struct(n)
                pending[step] = list(layout.unpack_from(encoded, at)[2:])
                at += layout.size
        return sealed, released, None if halted < 0 else halted, pending

    def is_deterministic(self) -> bool:
        return True


class ReleaseStreamingFn(beam.DoFn):
    """Unbounded input, per public key: collects step totals and releases step s when the
    watermark passes the end of step s + release_delay_steps.

    One state cell per key (`ReleaseStateCoder`): the sealed mechanism state (tagged with the
    release, its secret and the key: `RecordMaker.seal`), the number of steps released as a
    plain int (the late check in `process` needs no unsealing), the halt step and the pending
    exact sums. `process` reads and writes it once; a release timer reads it, unseals the
    mechanism state once (refused if another release, secret or key sealed it) and writes it
    once."""

    STATE = ReadModifyWriteStateSpec("release_state", ReleaseStateCoder())
    RELEASE = TimerSpec("release", TimeDomain.WATERMARK)

    def __init__(self, config: ReleaseConfig, public_keys: Sequence):
        self.config, self.public = config, frozenset(public_keys)
        # operator-only: the count depends on private data
        self.late = Metrics.counter(METRICS, "late_contributions") if config.diagnostics \
            else None

    def setup(self):
        self.maker = RecordMaker(self.config)
        self._times: Dict[int, Tuple[Timestamp, Timestamp]] = {}

    def _step_times(self, step: int) -> Tuple[Timestamp, Timestamp]:
        """(the event time of step's records, the release time of step), cached per step."""
        found = self._times.get(step)
        if found is None:
            if len(self._times) >= 1 << 16:
                self._times.clear()
            steps = self.config.steps
            found = self._times[step] = (Timestamp.of(steps.end(step) - MICRO),
                                         self._release_time(step))
        return found

    def _release_time(self, step):
        return _micros(self.config.steps.end(step + self.config.release_delay_steps))

    def process(self, element, state=beam.DoFn.StateParam(STATE),
                timer=beam.DoFn.TimerParam(RELEASE)):
        key, message = element
        if key not in self.public:
            return  # not a public key: no output and no state
        current = state.read()
        if current is None:
            sealed, released, halted, pending = None, 0, None, {}  # nothing yet
        else:
            sealed, released, halted, pending = current
        if isinstance(message, Seed):
            if sealed is None:
                timer.set(self._step_times(0)[1])
                state.write((self.maker.seal(key, self.maker.mechanism.init_state()), released,
                             halted, pending))
            return
        step = message.step
        if message.halt:
            state.write((sealed, released, step if halted is None else min(step, halted),
                         pending))
            return
        if step < released:
            if self.late is not None:
                self.late.inc()
            yield dead_letter((key, step, message.value),
                              f"late: step {step} of key {key_text(key)!r} was "
                              f"already released")
            return
        if halted is not None and step >= halted:
            return  # never released (the key halted): not kept
        found = pending.get(step)
        pending[step] = add_exact(found, message.value) if found else [message.value]
        state.write((sealed, released, halted, pending))

    @on_timer(RELEASE)
    def release(self, key=beam.DoFn.KeyParam, state=beam.DoFn.StateParam(STATE),
                timer=beam.DoFn.TimerParam(RELEASE)):
        current = state.read()
        sealed, released, stop, pending = current if current is not None else (None, 0, None, {})
        if sealed is None:  # the timer is set only after the seed sealed a state: state lost
            raise RuntimeError(f"key {key_text(key)!r}: a release timer without its sealed "
                               f"state (state lost, or a job updated from another state "
                               f"layout); releasing again from step 0 would repeat its noise "
                               f"on other data")
        maker, step = self.maker, released
        out, sealed = maker.step_sealed(key, sealed, pending.get(step), step)
        if out is None:  # exact totals: the key halts at this step (fail closed, no timer)
            if stop is None or step < stop:
                stop = step
                yield dead_letter(key, maker.limit_reason(key, step))
            state.write((sealed, step, stop, {}))  # the state is not advanced
            return
        pending.pop(step, None)  # only once the state passed its checks
        state.write((sealed, step + 1, stop, pending))
        if step + 1 < self.config.steps.horizon and (stop is None or step + 1 < stop):
            timer.set(self._step_times(step + 1)[1])
        if stop is None or step < stop:
            yield TimestampedValue(maker.record(key, step, float(out)),
                                   self._step_times(step)[0])


class ReleasePerKey(beam.PTransform):
    """(key, StepTotal) -> one record per public key and step of the window (a key without
    data gets its records too: no output's presence depends on private data, except a halt);
    totals and saved states of other keys are ignored. Bounded input continues each key from
    its saved state (`resume_states`, (key, (sealed bytes, halted)) pairs) and returns the new
    states. Exact totals (discrete noise, `RecordMaker.exact_totals`): a key whose step total,
    running total or released value would reach 2^53 in magnitude halts at that step (no
    record for it or later; the halt step is kept in its state) with an "exact totals" dead
    letter, in both paths alike: a data-dependent halt, as a bound violation's. Records
    carry the event time of their step's end (minus 1 us); in streaming that is behind the
    watermark when they are emitted, so window them with allowed lateness or write them
    unwindowed (the bundled sinks do)."""

    def __init__(self, config: ReleaseConfig, public_keys: Sequence,
                 window: Optional[StepWindow] = None, resume_states=None):
        super().__init__()
        self.config, self.public_keys = config, list(public_keys)
        self.window = window or StepWindow.whole(config.steps)
        self.resume_states = resume_states

    def expand(self, totals):
        pipeline = totals.pipeline
        keys = pipeline | "PublicKeys" >> beam.Create(self.public_keys, reshuffle=False)
        if not totals.is_bounded:
            if self.resume_states is not None or self.window != StepWindow.whole(
                    self.config.steps):
                fail("resume_states", "None for unbounded input (Beam keeps the state)",
                     "states")
            origin = self.config.steps.origin
            seeds = keys | "SeedEveryKey" >> beam.Map(
                lambda key: TimestampedValue((key, Seed()), origin)).with_output_types(KEYED)
            out = ((totals, seeds) | "WithSeeds" >> beam.Flatten().with_output_types(KEYED)
                   | "Release" >> beam.ParDo(ReleaseStreamingFn(self.config, self.public_keys)).with_outputs(
                       DEAD_LETTER, main="records"))
            return StageOutput(out.records, out[DEAD_LETTER])
        states = self.resume_states if self.resume_states is not None else _empty(
            pipeline, "NoSavedStates")
        seeds = keys | "SeedEveryKey" >> beam.Map(lambda key: (key, None)).with_output_types(
            KEYED)
        out = ({"totals": totals, "state": states, "seed": seeds}
               | "GroupByKey" >> beam.CoGroupByKey()
               | "Release" >> beam.ParDo(_ReleaseKeysFn(self.config, self.window)).with_outputs(
                   KEY_STATES, DEAD_LETTER, main="records"))
        return StageOutput(out.records, out[DEAD_LETTER], out[KEY_STATES])

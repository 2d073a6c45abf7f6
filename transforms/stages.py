"""The pipeline's stages, as small public PTransforms with one job each.

The six `Continual*` transforms validate and compose them; `pipelines.run` (one release in one
run) and `pipelines.schedule` (one release over many runs, resumed from checkpoints) drive that
one composition:

    events                                   timestamped elements
    | AssignSteps(problem, steps, window)    -> (unit, Event)            + dead letters
    | TruncatePerUnit(problem, steps, ...)   -> ((key, step), Delta)     + dead letters, unit states
    | SumPerKeyAndStep()                     -> (key, StepTotal)
    | KeepPublicKeys(public_keys)            -> (key, StepTotal) of public keys only
    | ReleasePerKey(config, public_keys)     -> records, one per key and step + key states

Messages are typed (no in-band sentinels). A `StepWindow` [first, stop) says which steps a run
releases; bounded stages take the previous run's states (`resume_states`) and return their new
states beside their main output (the scheduler's checkpoint hooks). Bounded input is grouped
(GroupByKey / CombinePerKey) and every key's steps are released in one vectorised call;
unbounded input runs stateful DoFns with event-time timers at step ends, and step s of a key is
released when the watermark passes the end of step s + `release_delay_steps`.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.coders import BytesCoder, PickleCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (BagStateSpec, ReadModifyWriteStateSpec,
                                              TimerSpec, on_timer)
from apache_beam.transforms.window import GlobalWindows, TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from transforms.release import RecordMaker, ReleaseConfig, key_text
from transforms.steps import TimeSteps
from transforms.streams.records import canonical
from transforms.streams.units import Problem, UnitRun, advance_unit, steps_to_run
from transforms.validation import fail

DEAD_LETTER = "dead_letter"
UNIT_STATES = "unit_states"
KEY_STATES = "key_states"
MICRO = 1e-6
METRICS = "continual_release"


# ----- keys ------------------------------------------------------------------------------------
class Id:
    """Type hint for unit and key ids (a non-empty str, an int, or a tuple of them): their
    coder is `KeyCoder`, deterministic, as state and grouping keys must be."""


def _tagged(key_id):
    if isinstance(key_id, tuple):
        return ["t", [_tagged(part) for part in key_id]]
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
        return json.dumps(_tagged(value), separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8")

    def decode(self, encoded: bytes):
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


@dataclasses.dataclass(frozen=True)
class Event:
    """An element's step, event time (microseconds) and parsed payload."""
    step: int
    micros: int
    payload: Any


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


def dead_letter_record(record, reason: str) -> dict:
    """{"record": its repr (at most 1 KiB), "size": the repr's full length, "reason"}."""
    text = repr(record)
    return {"record": text[:DEAD_LETTER_CHARS], "size": len(text), "reason": reason}


def dead_letter(record, reason: str) -> beam.pvalue.TaggedOutput:
    return beam.pvalue.TaggedOutput(DEAD_LETTER, dead_letter_record(record, reason))


def _micros(seconds: float) -> Timestamp:
    return Timestamp(micros=int(round(seconds * 1e6)))


def _empty(pipeline, label):
    return pipeline | label >> beam.Create([])


# ----- AssignSteps -----------------------------------------------------------------------------
@beam.typehints.with_output_types(KEYED)
class _AssignStepsFn(beam.DoFn):
    def __init__(self, problem: Problem, steps: TimeSteps, window: StepWindow,
                 diagnostics: bool = False):
        self.problem, self.steps, self.window = problem, steps, window
        # operator-only: how many events of already released steps a resumed run skipped,
        # and how many events entered truncation
        self.released = Metrics.counter(METRICS, "events_of_released_steps") \
            if diagnostics else None
        self.assigned = Metrics.counter(METRICS, "events_in_window") if diagnostics else None

    def process(self, element, timestamp=beam.DoFn.TimestampParam):
        seconds = float(timestamp.micros) / 1e6
        step = self.steps.step_of(seconds)
        parsed, reason = self.problem.parse(element)
        if step is None:
            yield dead_letter(element, f"event time {self.steps.iso(seconds)} is outside the "
                                       f"horizon [{self.steps.iso(self.steps.origin)}, "
                                       f"{self.steps.iso(self.steps.stop)})")
        elif step < self.window.first:  # released by an earlier run: skipped (the source
            if self.released is not None:  # holds history), not a dead letter each
                self.released.inc()
        elif step >= self.window.stop:
            pass  # left for a later run, which reads it again (not lost)
        elif parsed is None:
            yield dead_letter(element, reason)
        else:
            if self.assigned is not None:
                self.assigned.inc()
            yield parsed.unit, Event(step, int(timestamp.micros), parsed.payload)


class AssignSteps(beam.PTransform):
    """Timestamped elements -> (unit, Event) for the steps of `window`; elements outside the
    horizon or malformed -> dead letters with a reason. Elements of steps before the window
    (released by an earlier run) are skipped, those after it are left for a later run."""

    def __init__(self, problem: Problem, steps: TimeSteps, window: Optional[StepWindow] = None,
                 diagnostics: bool = False):
        super().__init__()
        self.problem, self.steps = problem, steps
        self.window = window or StepWindow.whole(steps)
        self.diagnostics = diagnostics

    def expand(self, events):
        # steps come from event times, not windows: one global window, whatever the input's
        # windowing (per-window truncation would bound a unit only within each window)
        out = (events
               | "GlobalWindow" >> beam.WindowInto(GlobalWindows())
               | "Assign" >> beam.ParDo(_AssignStepsFn(self.problem, self.steps, self.window,
                                                       self.diagnostics)
                                        ).with_outputs(DEAD_LETTER, main="events"))
        return StageOutput(out.events, out[DEAD_LETTER])


# ----- TruncatePerUnit -------------------------------------------------------------------------
def sorted_payloads(events: Sequence[Event]) -> Dict[int, List[Any]]:
    """Payloads per step in (event time, canonical payload) order: bundle order never matters."""
    by_step: Dict[int, List[Tuple[int, Any]]] = {}
    for event in events:
        by_step.setdefault(event.step, []).append((event.micros, event.payload))
    return {step: [p for _, p in sorted(items, key=lambda tp: (tp[0], canonical(tp[1])))]
            for step, items in by_step.items()}


def count_truncation(run: UnitRun) -> None:
    """Operator-only metrics (they depend on private data): updates the unit's machine dropped,
    by bound (`truncated_by_contribution_bound`, `truncated_by_key_cap`)."""
    for reason, count in run.dropped.items():
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


@beam.typehints.with_output_types(Tuple[Tuple[Id, int], Any])
class _TruncateUnitsFn(beam.DoFn):
    """(unit, ([Event as a tuple], [saved state])) -> deltas, new unit state."""

    def __init__(self, problem: Problem, window: StepWindow, diagnostics: bool):
        self.problem, self.window = problem, window
        self.diagnostics = diagnostics

    def process(self, item):
        unit, (wire_events, saved) = item
        saved = list(saved)
        state = saved[0] if saved else self.problem.init_state()
        by_step = sorted_payloads([Event(*wire) for wire in wire_events])
        # a unit first seen in a resumed run starts its machine at step 0 (it had no events)
        steps = steps_to_run(self.problem, by_step, self.window.first if saved else 0,
                             self.window.stop)
        run = advance_unit(self.problem, unit, state, by_step, steps)
        if self.diagnostics:  # operator-only: depends on private data
            count_truncation(run)
        yield from _unit_outputs(unit, run)
        yield beam.pvalue.TaggedOutput(UNIT_STATES, (unit, run.state))


@beam.typehints.with_output_types(Tuple[Tuple[Id, int], Any])
class _TruncateStreamingFn(beam.DoFn):
    """Unbounded input: buffer a unit's events until the watermark passes their step's end."""

    BUFFER = BagStateSpec("buffer", PickleCoder())
    UNIT = ReadModifyWriteStateSpec("unit", PickleCoder())
    NEXT = ReadModifyWriteStateSpec("next", PickleCoder())
    EARLIEST = ReadModifyWriteStateSpec("earliest", PickleCoder())  # earliest buffered step
    STEP_END = TimerSpec("step_end", TimeDomain.WATERMARK)

    def __init__(self, problem: Problem, steps: TimeSteps, diagnostics: bool):
        self.problem, self.steps = problem, steps
        self.diagnostics = diagnostics

    def process(self, element, buffer=beam.DoFn.StateParam(BUFFER),
                next_step=beam.DoFn.StateParam(NEXT), earliest=beam.DoFn.StateParam(EARLIEST),
                timer=beam.DoFn.TimerParam(STEP_END)):
        unit, event = element
        if event.step < (next_step.read() or 0):
            yield dead_letter((unit, event.payload),
                              f"late: step {event.step} of this unit was already processed")
            return
        buffer.add(event)
        current = earliest.read()
        if current is None or event.step < current:
            earliest.write(event.step)
            timer.set(_micros(self.steps.end(event.step)))

    @on_timer(STEP_END)
    def flush(self, key=beam.DoFn.KeyParam, fire=beam.DoFn.TimestampParam,
              buffer=beam.DoFn.StateParam(BUFFER), unit_state=beam.DoFn.StateParam(UNIT),
              next_step=beam.DoFn.StateParam(NEXT), earliest=beam.DoFn.StateParam(EARLIEST),
              timer=beam.DoFn.TimerParam(STEP_END)):
        events = list(buffer.read())
        fired = float(fire.micros) / 1e6
        ready = [e for e in events if self.steps.end(e.step) <= fired + MICRO]
        later = [e for e in events if self.steps.end(e.step) > fired + MICRO]
        state = unit_state.read()
        state = self.problem.init_state() if state is None else state
        done = next_step.read() or 0
        by_step = sorted_payloads(ready)
        last = max(by_step) if by_step else done - 1
        steps = steps_to_run(self.problem, by_step, done, last + 1)
        run = advance_unit(self.problem, key, state, by_step, steps)
        if self.diagnostics:
            count_truncation(run)
        yield from _unit_outputs(key, run, self.steps.end)
        buffer.clear()
        earliest.clear()
        if run.halt is not None:
            next_step.write(self.steps.horizon)  # nothing more from this unit
            return
        unit_state.write(run.state)
        next_step.write(last + 1)
        for event in later:
            buffer.add(event)
        if later:
            first = min(e.step for e in later)
            earliest.write(first)
            timer.set(_micros(self.steps.end(first)))


class TruncatePerUnit(beam.PTransform):
    """(unit, Event) -> ((key, step), Delta): each unit's state machine (`streams.units`) run
    over its steps in order, which bounds what one unit contributes. Bounded input groups a
    unit's events with its saved state (`resume_states`, (unit, state) pairs) and returns the
    new states; unbounded input keeps them in Beam state."""

    def __init__(self, problem: Problem, steps: TimeSteps, window: Optional[StepWindow] = None,
                 resume_states=None, diagnostics: bool = False):
        super().__init__()
        self.problem, self.steps = problem, steps
        self.window = window or StepWindow.whole(steps)
        self.resume_states, self.diagnostics = resume_states, diagnostics

    def expand(self, events):
        if not events.is_bounded:
            if self.resume_states is not None:
                fail("resume_states", "None for unbounded input (Beam keeps the state)",
                     "states")
            out = events | "Truncate" >> beam.ParDo(_TruncateStreamingFn(
                self.problem, self.steps, self.diagnostics)).with_outputs(
                    DEAD_LETTER, main="deltas")
            return StageOutput(out.deltas, out[DEAD_LETTER])
        # plain tuples through the shuffle (a dataclass costs ~5x more to encode)
        wire = events | "ToWire" >> beam.MapTuple(
            lambda unit, event: (unit, dataclasses.astuple(event))).with_output_types(KEYED)
        if self.resume_states is None:
            grouped = (wire | "GroupByUnit" >> beam.GroupByKey()
                       | "NoSavedState" >> beam.MapTuple(lambda unit, evs: (unit, (evs, ()))))
        else:
            grouped = ({"events": wire, "state": self.resume_states}
                       | "GroupByUnit" >> beam.CoGroupByKey()
                       | "EventsAndState" >> beam.MapTuple(
                           lambda unit, parts: (unit, (parts["events"], parts["state"]))))
        out = (grouped
               | "Truncate" >> beam.ParDo(_TruncateUnitsFn(
                   self.problem, self.window, self.diagnostics)).with_outputs(
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


class SumPerKeyAndStep(beam.PTransform):
    """((key, step), Delta) -> (key, StepTotal). Bounded: one exact total per key and step
    (CombinePerKey). Unbounded: one StepTotal per delta (the release sums them exactly)."""

    def expand(self, deltas):
        if not deltas.is_bounded:
            return deltas | "ToStepTotals" >> beam.MapTuple(
                lambda key_step, delta: (key_step[0], StepTotal(key_step[1], delta.value,
                                                                delta.halt))
            ).with_output_types(KEYED)
        return (deltas
                | "ExactSums" >> beam.CombinePerKey(ExactSum())
                | "ToStepTotals" >> beam.MapTuple(
                    lambda key_step, total: (key_step[0], StepTotal(key_step[1], *total))
                ).with_output_types(KEYED))


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
            elif dropped is not None and (total.halt or total.value != 0):
                dropped.inc()

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

    def process(self, item):
        key, grouped = item
        if list(grouped["seed"]):  # else not a public key: no output, whatever its data or state
            yield from self._release(key, grouped)

    def _release(self, key, grouped):
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
        for total in grouped["totals"]:
            if total.halt:
                halted = total.step if halted is None else min(halted, total.step)
            else:
                x[total.step - first] += total.value
        outputs, state = self.maker.for_key(key).advance(state, x)
        for offset, value in enumerate(outputs):
            step = first + offset
            if halted is not None and step >= halted:
                break
            yield TimestampedValue(self.maker.record(key, step, float(value)),
                                   self.config.steps.end(step) - MICRO)
        yield beam.pvalue.TaggedOutput(KEY_STATES, (key, (self.maker.seal(key, state), halted)))


class _ReleaseStreamingFn(beam.DoFn):
    """Unbounded input, per public key: collects step totals and releases step s when the
    watermark passes the end of step s + release_delay_steps."""

    PENDING = ReadModifyWriteStateSpec("pending", PickleCoder())
    COUNTER = ReadModifyWriteStateSpec("counter", BytesCoder())
    HALTED = ReadModifyWriteStateSpec("halted", PickleCoder())
    RELEASE = TimerSpec("release", TimeDomain.WATERMARK)

    def __init__(self, config: ReleaseConfig, public_keys: Sequence):
        self.config, self.public = config, frozenset(public_keys)
        # operator-only: the count depends on private data
        self.late = Metrics.counter(METRICS, "late_contributions") if config.diagnostics \
            else None

    def setup(self):
        self.maker = RecordMaker(self.config)

    def _read_state(self, key, counter):
        data = counter.read()
        return self.maker.mechanism.init_state() if data is None else \
            self.maker.restore(key, data)

    def _release_time(self, step):
        return _micros(self.config.steps.end(step + self.config.release_delay_steps))

    def process(self, element, pending=beam.DoFn.StateParam(PENDING),
                counter=beam.DoFn.StateParam(COUNTER), halted=beam.DoFn.StateParam(HALTED),
                timer=beam.DoFn.TimerParam(RELEASE)):
        key, message = element
        if key not in self.public:
            return  # not a public key: no output and no state
        if isinstance(message, Seed):
            if counter.read() is None:
                timer.set(self._release_time(0))
                counter.write(self.maker.seal(key, self.maker.mechanism.init_state()))
            return
        if message.halt:
            current = halted.read()
            halted.write(message.step if current is None else min(message.step, current))
            return
        if message.step < self._read_state(key, counter).steps:
            if self.late is not None:
                self.late.inc()
            yield dead_letter((key, message.step, message.value),
                              f"late: step {message.step} of key {key_text(key)!r} was "
                              f"already released")
            return
        values = pending.read() or {}
        values[message.step] = add_exact(values.get(message.step, []), message.value)
        pending.write(values)

    @on_timer(RELEASE)
    def release(self, key=beam.DoFn.KeyParam, pending=beam.DoFn.StateParam(PENDING),
                counter=beam.DoFn.StateParam(COUNTER), halted=beam.DoFn.StateParam(HALTED),
                timer=beam.DoFn.TimerParam(RELEASE)):
        values = pending.read() or {}
        stop = halted.read()
        state = self._read_state(key, counter)
        step = state.steps
        out, state = self.maker.for_key(key).step(state, math.fsum(values.pop(step, [])))
        pending.write(values)
        counter.write(self.maker.seal(key, state))
        if step + 1 < self.config.steps.horizon and (stop is None or step + 1 < stop):
            timer.set(self._release_time(step + 1))
        if stop is None or step < stop:
            yield TimestampedValue(self.maker.record(key, step, float(out)),
                                   self.config.steps.end(step) - MICRO)


class ReleasePerKey(beam.PTransform):
    """(key, StepTotal) -> one record per public key and step of the window (a key without
    data gets its records too: no output's presence depends on private data); totals and saved
    states of other keys are ignored. Bounded input continues each key from its saved state
    (`resume_states`, (key, (sealed bytes, halted)) pairs) and returns the new states. Records
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
                   | "Release" >> beam.ParDo(_ReleaseStreamingFn(self.config, self.public_keys)).with_outputs(
                       DEAD_LETTER, main="records"))
            return StageOutput(out.records, out[DEAD_LETTER])
        states = self.resume_states if self.resume_states is not None else _empty(
            pipeline, "NoSavedStates")
        seeds = keys | "SeedEveryKey" >> beam.Map(lambda key: (key, None)).with_output_types(
            KEYED)
        out = ({"totals": totals, "state": states, "seed": seeds}
               | "GroupByKey" >> beam.CoGroupByKey()
               | "Release" >> beam.ParDo(_ReleaseKeysFn(self.config, self.window)).with_outputs(
                   KEY_STATES, main="records"))
        return StageOutput(out.records, None, out[KEY_STATES])

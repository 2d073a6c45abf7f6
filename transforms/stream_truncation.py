"""The unbounded truncation stage: units' events wait, per bucket of units, in Beam state until
the watermark passes their step's end (`TruncateStreaming`).

    (unit, Event tuple)
    | ByBucket                 -> (bucket, (unit, Event tuple))   (`streams.columns.bucket_of`)
    | WithSeeds                -> the same + (bucket, None) for every bucket, at the first step
    | Truncate                 -> ((key, step), Delta) at each step's end + dead letters

Keyed by bucket, not by unit: a runner that keeps state in another process (Flink, Spark,
Dataflow) makes one state round trip per key and bundle, so an event costs a blind bag append
plus one small read per bucket and bundle, and a step end one read and one write per bucket,
whatever the number of units. Each bucket's timer visits every step end from its seed on, so
when a step closes, and so which events are late, depends on the watermark alone, not on the
data of the units that share the bucket. The truncation rule itself is per unit, as in the
batch pipeline: each unit's machine (`Problem.run` / `flat_step`) sees its own events only, in
the order `streams.units.sorted_payloads` gives.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import apache_beam as beam
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, \
    on_timer
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from transforms.messages import (DEAD_LETTER, MICRO, PAYLOAD, STEP, Delta, Id, FastStateCoder,
                                 StageOutput, count_dropped, dead_letter, delta_of)
from transforms.settle import armed, settled_first, step_end_due
from transforms.steps import TimeSteps
from transforms.streams.columns import BUCKETS, bucket_of
from transforms.streams.records import Reason
from transforms.streams.units import Problem, payloads_by_step, run_unit
from transforms.validation import fail


def cached(cache: dict, key, value):
    """cache[key] = value (the cache emptied first at 2^16 entries: bounded); -> value."""
    if len(cache) >= 1 << 16:
        cache.clear()
    cache[key] = value
    return value


LOCAL_RUNNERS = frozenset(("DirectRunner", "BundleBasedDirectRunner", "FnApiRunner",
                           "SwitchingDirectRunner", "PrismRunner"))
LOCAL_BUCKETS = 16  # a divisor of BUCKETS


def bucket_count(pipeline) -> int:
    """How many buckets the truncation keys units by: `streams.columns.BUCKETS` (256: its
    parallelism on a distributed runner), or 16 on Beam's local runners, which run every key in
    one process and pay per timer firing (each bucket's timer fires twice per step). The
    records do not depend on it (a unit's events and the steps' closing times do not)."""
    return LOCAL_BUCKETS if type(pipeline.runner).__name__ in LOCAL_RUNNERS else BUCKETS


class ByBucket(beam.DoFn):
    """(unit, event) -> (its unit's bucket, (unit, event)): `bucket_of` modulo `buckets` (a
    divisor of 256), cached per unit (bounded)."""

    def __init__(self, buckets: int = BUCKETS):
        self.buckets = buckets

    def setup(self):
        self._buckets: Dict[Any, int] = {}

    def process(self, element):
        unit = element[0]
        found = self._buckets.get(unit)
        if found is None:
            found = cached(self._buckets, unit, bucket_of(unit) % self.buckets)
        yield found, element


@beam.typehints.with_output_types(Tuple[Tuple[Id, int], Any])
class TruncateStreamingFn(beam.DoFn):
    """Unbounded input, per bucket of units: buffer the units' events until the watermark passes
    their step's end, then run each unit's machine over its ready steps.

    Every bucket is seeded at the origin (`(bucket, None)`), and its step-end timer then visits
    every step end in turn, whatever the data: which events a firing closes, and which are late
    (an event of a step its bucket already closed: a dead letter at once), depend only on the
    watermark, never on what other units of the bucket sent. State per bucket: the last step
    closed, the bag of buffered (unit, event) pairs (appended blind) and each unit's progress
    and machine state, {unit: (next step to process, state)}, read and written only at a step
    end. An event reads the last step closed (once per bundle on a runner's state cache) and
    appends to the bag."""

    # FastPrimitivesCoder (40% faster to encode than pickle)
    BUFFER = BagStateSpec("bucket_events", FastStateCoder())
    # {unit: (done, state)}; counts keep their state as the plain tuple (used, keys)
    UNITS = ReadModifyWriteStateSpec("units", FastStateCoder())
    CLOSED = ReadModifyWriteStateSpec("closed", FastStateCoder())  # the last step closed
    STEP_END = TimerSpec("step_end", TimeDomain.WATERMARK)

    def __init__(self, problem: Problem, steps: TimeSteps, diagnostics: bool,
                 lateness_seconds: float = 0.0, unit_log=None, first: int = 0):
        self.problem, self.steps = problem, steps
        self.diagnostics = diagnostics
        self.lateness = int(round(lateness_seconds * 1e6))  # micros after a step's end
        # a checkpointed release (`transforms.stream_checkpoint.UnitLog`): every state a unit
        # reaches, per step, written at the end of the bundle, before its outputs leave it
        self.unit_log = unit_log
        self.first = first  # the first step of this execution (a continuation's window)
        if unit_log is not None and problem.flat_state() is None:
            fail("checkpoint", "used with a transform whose truncation keeps a flat state "
                               "(count, sum)", type(problem).__name__)
        self.setup()

    def start_bundle(self):
        if self.unit_log is not None:
            self.unit_log.start()

    def finish_bundle(self):
        if self.unit_log is not None:
            self.unit_log.flush()

    def setup(self):
        self._ends: Dict[int, Timestamp] = {}  # step -> its end, bounded
        self._stamps: Dict[int, Timestamp] = {}  # step -> its outputs' event time, bounded
        self._ready: Dict[int, int] = {}  # a firing's micros -> `_ready_through`, bounded
        # the problem's plain-tuple state and step (`Problem.flat_state`), or None
        self._flat = self.problem.flat_state()

    def _ready_through(self, fire: Timestamp) -> int:
        """The last step a firing at `fire` processes: the largest s in [-1, T) whose due time
        (`_due`) is <= fire, in whole micros (due times grow with s: an event is ready iff its
        step is <= it; floats 30 us apart by 2514 made a step never due), cached per firing."""
        micros = fire.micros
        found = self._ready.get(micros)
        if found is None:
            low, high = -1, self.steps.horizon - 1  # due(low) <= micros (low = -1: none)
            while low < high:
                middle = (low + high + 1) // 2
                if self._due(middle) <= micros:
                    low = middle
                else:
                    high = middle - 1
            found = cached(self._ready, micros, low)
        return found

    def _due(self, step: int) -> int:
        """Step's end + the allowed lateness in micros, whole ms: its step-end timer's due."""
        return step_end_due(self.steps, step, self.lateness)

    def _end(self, step: int) -> Timestamp:
        """The step-end timer's armed time (`transforms.settle`), cached."""
        found = self._ends.get(step)
        return found if found is not None else cached(
            self._ends, step, Timestamp(micros=armed(self._due(step), self.steps)))

    def _stamp(self, step: int) -> Timestamp:
        """The event time of a step's outputs (its end - 1 us), cached."""
        found = self._stamps.get(step)
        return found if found is not None else cached(
            self._stamps, step, Timestamp.of(self.steps.end(step) - MICRO))

    def process(self, element, buffer=beam.DoFn.StateParam(BUFFER),
                closed=beam.DoFn.StateParam(CLOSED),
                timer=beam.DoFn.TimerParam(STEP_END)):
        pair = element[1]
        last = closed.read()
        if pair is None:  # the bucket's seed: its timer starts at the first step's end
            if last is None:
                closed.write(self.first - 1)
                if self.first < self.steps.horizon:
                    timer.set(self._end(self.first))
            return
        step = pair[1][STEP]
        if step < self.first or (last is not None and step <= last):
            yield dead_letter((pair[0], pair[1][PAYLOAD]), Reason(
                "late", f"late: step {step} was already closed"))
            return
        buffer.add(pair if type(pair[1]) is tuple else (pair[0], tuple(pair[1])))

    @on_timer(STEP_END)
    def flush(self, fire=beam.DoFn.TimestampParam, buffer=beam.DoFn.StateParam(BUFFER),
              units=beam.DoFn.StateParam(UNITS), closed=beam.DoFn.StateParam(CLOSED),
              timer=beam.DoFn.TimerParam(STEP_END)):
        """At the second firing of a step end (`transforms.settle`): closes every step due by
        the firing, runs each unit's machine over its events of those steps and sets the timer
        for the next step's end."""
        if settled_first(timer, fire.micros, lambda s: self._end(s).micros, self.steps,
                         self.lateness / 1e6):
            return  # the step closes at the second firing
        through = self._ready_through(fire)
        last = closed.read()
        last = self.first - 1 if last is None else last
        following = max(through, last) + 1
        if through > last:
            closed.write(through)
            yield from self._close(through, buffer, units)
        if following < self.steps.horizon:
            # after the closed steps' outputs: set before them, Flink's runner let the
            # watermark pass them (3 of 5 runs of bench_kafka.py at 1,000 events/s left
            # totals late at the release; 0 of 4 with this order)
            timer.set(self._end(following))

    def _close(self, through: int, buffer, units):
        """The outputs of closing every step up to `through`: each unit's machine over its
        buffered events of those steps; the later events stay buffered."""
        ready: Dict[Any, list] = {}  # unit -> its ready events, in arrival order
        later = []
        for pair in buffer.read():
            if pair[1][STEP] <= through:
                found = ready.get(pair[0])
                if found is None:
                    ready[pair[0]] = [pair[1]]
                else:
                    found.append(pair[1])
            else:
                later.append(pair)
        if not ready:
            return
        known = units.read() or {}
        out: List[Any] = []
        for unit, events in ready.items():
            found = known.get(unit)
            known[unit] = self._run(unit, events, (0, None) if found is None else found, out)
        yield from out
        units.write(known)
        buffer.clear()
        for pair in later:
            buffer.add(pair)

    def _run(self, unit, events: list, progress: Tuple[int, Any], out: list):
        """One unit's ready events after its progress (done, state): its outputs into `out`
        (events of a unit that halted, or of steps before a continued unit's checkpoint, as
        late dead letters); -> its new progress."""
        done, saved = progress
        kept = []
        for event in events:
            if event[STEP] < done:
                out.append(dead_letter((unit, event[PAYLOAD]), Reason(
                    "late", f"late: step {event[STEP]} of this unit was already processed")))
            else:
                kept.append(event)
        if not kept:
            return progress
        problem, stamp, flat = self.problem, self._stamp, self._flat
        by_step = payloads_by_step(kept, ordered=problem.ordered)
        last = max(by_step)
        if flat is not None:  # = `Problem.run` step by step, on the plain-tuple state
            state = flat if saved is None else saved
            contributions: List[Tuple[Any, int, float]] = []
            dropped = {} if self.diagnostics else None
            for step in (sorted(by_step) if len(by_step) > 1 else by_step):
                state = problem.flat_step(state, step, by_step[step], contributions, dropped)
                if self.unit_log is not None:
                    self.unit_log.add(unit, step, state)
            if dropped:
                count_dropped(dropped)
            for unit_key, step, value in contributions:
                out.append(TimestampedValue(((unit_key, step), delta_of(value)), stamp(step)))
            return last + 1, state
        state = problem.init_state() if saved is None else saved
        run = run_unit(problem, unit, state, by_step, done, last + 1)  # = advance_unit
        if self.diagnostics:
            count_dropped(run.dropped)
        for unit_key, step, value in run.contributions:
            out.append(TimestampedValue(((unit_key, step), delta_of(value)), stamp(step)))
        if run.halt is not None:
            for event in kept:  # its events after the halt (steps closed together)
                if event[STEP] > run.halt.step:
                    out.append(dead_letter((unit, event[PAYLOAD]), Reason(
                        "late", f"late: step {event[STEP]} of this unit was already "
                                f"processed")))
            out.append(dead_letter(unit, Reason("bound_violation", run.halt.reason)))
            out.append(TimestampedValue(((unit, run.halt.step), Delta(halt=True)),
                                        stamp(run.halt.step)))
            return self.steps.horizon, None  # nothing more from this unit
        return last + 1, run.state


class ResumedTruncateStreamingFn(TruncateStreamingFn):
    """`TruncateStreamingFn` of a continued release: a unit's first event here gives it its
    progress and state as of the checkpoint in `seeds` (a side input: no event is processed
    before it is ready, so no unit restarts afresh). An event of a seeded unit also reads the
    bucket's units (once per bucket and bundle on a runner's state cache)."""

    def process(self, element, seeds, buffer=beam.DoFn.StateParam(TruncateStreamingFn.BUFFER),
                closed=beam.DoFn.StateParam(TruncateStreamingFn.CLOSED),
                timer=beam.DoFn.TimerParam(TruncateStreamingFn.STEP_END),
                units=beam.DoFn.StateParam(TruncateStreamingFn.UNITS)):
        if element[1] is not None and element[1][0] in seeds:
            unit = element[1][0]
            known = units.read() or {}
            if unit not in known:
                at, state = seeds[unit]
                known[unit] = (at + 1, state)
                units.write(known)
        return super().process(element, buffer, closed, timer)


class TruncateStreaming(beam.PTransform):
    """(unit, Event tuple) -> ((key, step), Delta) at each step's end (`TruncateStreamingFn`,
    every bucket seeded at the start of step `first`) + dead letters; checkpointed: each unit's
    state after each step into `unit_log`; continued: `seeds`, (unit, (step, state)) as of the
    checkpoint, and `first`, the continuation's first step."""

    def __init__(self, problem: Problem, steps: TimeSteps, diagnostics: bool = False,
                 lateness_seconds: float = 0.0, unit_log=None, seeds=None, first: int = 0):
        super().__init__()
        self.problem, self.steps, self.diagnostics = problem, steps, diagnostics
        self.lateness_seconds, self.unit_log, self.seeds = lateness_seconds, unit_log, seeds
        self.first = first

    def expand(self, events):
        args = (self.problem, self.steps, self.diagnostics, self.lateness_seconds,
                self.unit_log, self.first)
        fn = TruncateStreamingFn(*args) if self.seeds is None else \
            ResumedTruncateStreamingFn(*args)
        side = () if self.seeds is None else (beam.pvalue.AsDict(self.seeds),)
        start = self.steps.start(min(self.first, self.steps.horizon - 1))
        count = bucket_count(events.pipeline)
        buckets = (events.pipeline
                   | "Buckets" >> beam.Create(range(count), reshuffle=False)
                   | "SeedEveryBucket" >> beam.Map(
                       lambda bucket: TimestampedValue((bucket, None), start))
                   .with_output_types(Tuple[int, Any]))
        keyed = events | "ByBucket" >> beam.ParDo(ByBucket(count)).with_output_types(
            Tuple[int, Any])
        out = ((keyed, buckets) | "WithSeeds" >> beam.Flatten().with_output_types(
            Tuple[int, Any])
               # the count in the name: a job updated in place with another count fails by
               # name instead of restarting units in new buckets
               | f"Truncate{count}" >> beam.ParDo(fn, *side).with_outputs(DEAD_LETTER,
                                                                          main="deltas"))
        return StageOutput(out.deltas, out[DEAD_LETTER])

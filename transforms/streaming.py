"""The unbounded pipeline: stateful DoFns with event-time timers at step ends.

    events                                  timestamped elements (e.g. from Pub/Sub)
    | AssignSteps                           -> (unit, Event tuple) + dead letters
    | TruncateStreaming                     -> ((key, step), Delta) at each step's end, per
                                               bucket of units (`stream_truncation`)
                                               + dead letters (halts, late events)
    | ToStepTotals                          -> (key, StepTotal)
    | KeepPublicKeys                        -> the same, of public keys only
                                               + dead letters (other keys' totals)
    | ReleaseStreaming                      -> records, one per public key and step,
                                               + dead letters (late totals, exact totals)

`release_streaming` composes them. A unit's events wait in Beam state until the watermark
passes their step's end; step s of a key is released when the watermark passes the end of
step s + `release_delay_steps`. Beam keeps the states, so the pipeline takes and returns
none.
"""
from __future__ import annotations

import struct
import time
from typing import Dict, Sequence, Tuple

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from transforms import stages
from transforms.messages import (DEAD_LETTER, KEYED, METRICS, MICRO, Seed, StageOutput,
                                 StepTotal, StepWindow, Released, add_exact, dead_letter,
                                 partials_struct)
from transforms.key_state import due_stop
from transforms.release import RecordMaker, ReleaseConfig, key_text
from transforms.streams.records import Reason
from transforms.streams.units import Problem
from transforms.validation import fail
from transforms.claims import guarded
from transforms.stream_checkpoint import UnitLog
from transforms.stream_truncation import TruncateStreaming, cached
from transforms.selecting import ReleaseSelected
from transforms.settle import armed, release_due, settled_first

KEY_STATES = "key_states"  # its keys' states after each step, (step, (key, state, record))


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
            parts.append(partials_struct(count).pack(step, count, *partials))
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
                layout = partials_struct(n)
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
    RETRY = TimerSpec("retry", TimeDomain.REAL_TIME)  # a step held by the wall clock

    def __init__(self, config: ReleaseConfig, public_keys: Sequence,
                 checkpointed: bool = False):
        self.config, self.public = config, frozenset(public_keys)
        # a checkpointed release: each key's sealed state after each step it released
        self.checkpointed = checkpointed
        # operator-only: the count depends on private data
        self.late = Metrics.counter(METRICS, "late_contributions") if config.diagnostics \
            else None
        self.held = Metrics.counter(METRICS, "keys_held_at_wall_clock")

    def setup(self):
        self.maker = RecordMaker(self.config)
        self._times: Dict[int, Tuple[Timestamp, Timestamp]] = {}

    def _step_times(self, step: int) -> Tuple[Timestamp, Timestamp, int]:
        """(the event time of step's records, its release timer's armed time, its release
        time: the end of step + release_delay_steps, whole ms, in micros), cached per step."""
        found = self._times.get(step)
        if found is None:
            steps = self.config.steps
            due = release_due(steps, step, self.config.release_delay_steps)
            found = cached(self._times, step, (Timestamp.of(steps.end(step) - MICRO),
                                               Timestamp(micros=armed(due, steps)), due))
        return found

    def _release_micros(self, step: int) -> int:
        found = self._times.get(step)  # (the cached case inlined: one call per step checked)
        return (found or self._step_times(step))[2]

    def process(self, element, state=beam.DoFn.StateParam(STATE),
                timer=beam.DoFn.TimerParam(RELEASE)):
        key, message = element
        if key not in self.public:  # not a public key: no output and no state
            return
        current = state.read()
        if current is None:
            sealed, released, halted, pending = None, 0, None, {}  # nothing yet
        else:
            sealed, released, halted, pending = current
        if isinstance(message, Seed):
            if sealed is None:
                if message.sealed is None:  # a new release
                    sealed = self.maker.seal(key, self.maker.mechanism.init_state())
                else:  # a continued one: its key's state after `released` steps (`release`
                    # refuses a state another release, secret or key sealed, or at another
                    # step)
                    sealed, released, halted = message.sealed, message.released, message.halted
                if halted is None or released < halted:
                    timer.set(self._step_times(released)[1])
                state.write((sealed, released, halted, pending))
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
                              Reason("late", f"late: step {step} of key {key_text(key)!r} was "
                                             f"already released"))
            return
        if halted is not None and step >= halted:  # never released (the key halted): not kept
            return
        found = pending.get(step)
        pending[step] = add_exact(found, message.value) if found else [message.value]
        state.write((sealed, released, halted, pending))

    @on_timer(RELEASE)
    def release(self, key=beam.DoFn.KeyParam, fire=beam.DoFn.TimestampParam,
                state=beam.DoFn.StateParam(STATE), timer=beam.DoFn.TimerParam(RELEASE),
                retry=beam.DoFn.TimerParam(RETRY)):
        """At the second firing (`transforms.settle`), releases in order every step of the key
        due (release time <= the firing time and <= the wall clock), then sets the timer for
        the next step. A firing with nothing due (a repeat) releases nothing and sets the timer
        again. A step whose release time the watermark passed but the wall clock has not (a
        drain; a worker's clock lagging the event times) is held: `retry` re-checks it on the
        wall clock at its release time."""
        steps = self.config.steps
        if settled_first(timer, fire.micros, lambda s: self._step_times(s)[1].micros, steps,
                         self.config.release_delay_steps * steps.size):
            return
        yield from self._release(key, fire.micros, state, timer, retry)

    @on_timer(RETRY)
    def retry(self, key=beam.DoFn.KeyParam, state=beam.DoFn.StateParam(STATE),
              timer=beam.DoFn.TimerParam(RELEASE), retry=beam.DoFn.TimerParam(RETRY)):
        """A held step, on the wall clock: released once the worker's clock passed its release
        time (the watermark had), and the event-time timer set for the next. A retry firing
        before that time (a drain that fires processing-time timers at once) releases nothing
        and sets nothing: the release ends at its last step released."""
        current = state.read()
        if current is None:
            return
        held = current[1]
        if held >= self.config.steps.horizon:
            return
        release = self._step_times(held)[2]
        if int(time.time() * 1e6) < release:
            self.held.inc()
            return
        yield from self._release(key, release, state, timer, retry)

    def _release(self, key, fire: int, state, timer, retry):
        """The steps due by `fire` (micros) and the wall clock, then the next timer."""
        current = state.read()
        sealed, released, stop, pending = current if current is not None else (None, 0, None, {})
        if sealed is None:  # the timer is set only after the seed sealed a state: state lost
            raise RuntimeError(f"key {key_text(key)!r}: a release timer without its sealed "
                               f"state (state lost, or a job updated from another state "
                               f"layout); releasing again from step 0 would repeat its noise "
                               f"on other data")
        maker, horizon, step = self.maker, self.config.steps.horizon, released
        previous = None  # the key's release at step - 1, derived once it is needed
        # the steps due by the watermark and the wall clock (`key_state.due_stop`)
        due, wake = due_stop(self._release_micros, horizon, step, fire, int(time.time() * 1e6),
                             stop)
        records = []
        while step < due:
            times = self._step_times(step)
            before = sealed
            out, sealed = maker.step_sealed(key, sealed, pending.get(step), step)
            if out is None:  # exact totals: the key halts at this step (fail closed)
                stop, wake = step, None
                records.append(dead_letter(key, maker.limit_reason(key, step)))
                break
            if previous is None:  # from the state before this step (checked by step_sealed)
                previous = maker.previous(key, step, before)
            pending.pop(step, None)  # only once the state passed its checks
            record = maker.record(key, step, float(out), previous)
            previous = float(out)
            maker.released(key, step, previous)
            records.append(TimestampedValue(record, times[0]))
            if self.checkpointed:  # with its record: one element per key and step to checkpoint
                records.append(beam.pvalue.TaggedOutput(KEY_STATES, TimestampedValue(
                    (step, (key, (sealed, None), record)), times[0])))
            step += 1
        if records:
            state.write((sealed, step, stop, {} if stop == step else pending))
        if wake is not None and wake[0]:  # held by the wall clock: re-check on it
            self.held.inc()
            retry.set(Timestamp(micros=wake[1]))
        elif wake is not None:
            timer.set(self._step_times(step)[1])
        yield from records


class ToStepTotals(beam.PTransform):
    """((key, step), Delta) -> (key, StepTotal), one per delta (the release sums them
    exactly)."""

    def expand(self, deltas):
        return deltas | "ToStepTotals" >> beam.MapTuple(
            lambda key_step, delta: (key_step[0], StepTotal(key_step[1], delta.value,
                                                            delta.halt))
        ).with_output_types(KEYED)


class KeepPublicKeys(stages.KeepPublicKeys):
    """(key, StepTotal) -> the same, of public keys only + one `not_public_key` dead letter per
    nonzero total of another key (operator-only, like every dead letter: a streaming job
    counts each event or dead-letters it, and a misspelt public key shows at once). What is
    published never depends on them."""

    @staticmethod
    def changed_steps(total) -> int:
        return 1 if total.halt or total.value != 0 else 0

    def expand(self, totals):
        public = frozenset(self.public_keys)

        def keep(item):
            key, total = item
            if key in public:
                yield item
            elif total.value != 0:
                yield dead_letter((key, total.step, total.value), Reason(
                    "not_public_key", f"key {key_text(key)!r} is not in public_keys: its "
                                      f"total of step {total.step} is not released"))

        out = totals | "KeepPublic" >> beam.FlatMap(keep).with_outputs(DEAD_LETTER,
                                                                        main="kept")
        return StageOutput(out.kept,
                           out[DEAD_LETTER])


class ReleaseStreaming(beam.PTransform):
    """(key, StepTotal) -> one record per public key and step (`ReleaseStreamingFn`; every
    public key is seeded at the origin, so a key without data gets its records too) + dead
    letters. Records carry the event time of their step's end (minus 1 us), behind the
    watermark when they are emitted: window them with allowed lateness or write them
    unwindowed (the bundled sinks do)."""

    def __init__(self, config: ReleaseConfig, public_keys: Sequence, checkpointed=False,
                 window: StepWindow = None, key_states=None):
        super().__init__()
        self.config, self.public_keys = config, list(public_keys)
        self.checkpointed, self.window, self.key_states = checkpointed, window, key_states

    def expand(self, totals):
        origin = self.config.steps.origin
        keys = totals.pipeline | "PublicKeys" >> beam.Create(self.public_keys, reshuffle=False)
        if self.key_states is None:
            seeds = keys | "SeedEveryKey" >> beam.Map(
                lambda key: TimestampedValue((key, Seed()), origin)).with_output_types(KEYED)
        else:  # a continued release: every public key from its state after window.first steps
            seeds = keys | "SeedEveryKey" >> beam.Map(
                _resumed_seed, beam.pvalue.AsDict(self.key_states), self.window.first,
                origin).with_output_types(KEYED)
        out = ((totals, seeds) | "WithSeeds" >> beam.Flatten().with_output_types(KEYED)
               | "Release" >> beam.ParDo(ReleaseStreamingFn(
                   self.config, self.public_keys, self.checkpointed)).with_outputs(
                       DEAD_LETTER, KEY_STATES, main="records"))
        return StageOutput(out.records, out[DEAD_LETTER],
                           out[KEY_STATES] if self.checkpointed else None)


def _resumed_seed(key, states: dict, first: int, origin: float):
    if key not in states:
        fail("key_states", f"holding every public key's state (key {key_text(key)!r} has none: "
                           f"it would restart its noise from step 0)", "a missing key")
    sealed, halted = states[key]
    return TimestampedValue((key, Seed(sealed, first, halted)), origin)


def release_streaming(events, problem: Problem, config: ReleaseConfig, public_keys: Sequence,
                      window: StepWindow, unit_states=None, key_states=None,
                      diagnostics: bool = False, checkpoint=None) -> Released:
    """The unbounded composition, stage by stage (the module docstring's shapes).
    `checkpoint` ((folder, execution id, the claim's singleton), `transforms.stream_checkpoint`):
    the events wait for the claim, the units' states go to the execution's unit log, and the
    release also returns the keys' states after each step (`key_states`) for `WriteStepFiles`
    to checkpoint; a continuation from a checkpoint (`window.first` > 0)
    takes the units' states as of it, (unit, (step, state)), and the keys' states after it,
    (key, (sealed state, halt step))."""
    resumed = window.first > 0
    if window.stop != config.steps.horizon or resumed != (unit_states is not None) or \
            resumed != (key_states is not None) or (resumed and checkpoint is None):
        fail("resume_states", "None for unbounded input, or a continuation from a streaming "
                              "checkpoint (`checkpoint`, unit and key states) up to the "
                              "horizon", "states")
    unit_log = None
    if checkpoint is not None:
        folder, execution, passed = checkpoint
        unit_log = UnitLog(folder, config, execution)
        # only the execution that claimed the release writes its unit log (a second execution
        # of the same graph fails at its claim before any event reaches the truncation)
        events = guarded(events, passed, "ClaimedEvents")
    stepped = events | "AssignSteps" >> stages.AssignSteps(problem, config.steps, window,
                                                           diagnostics)
    # (unit, Event tuple) + dead letters
    truncated = stepped.main | "TruncatePerBucket" >> TruncateStreaming(
        problem, config.steps, diagnostics, config.allowed_lateness_seconds, unit_log,
        unit_states, window.first)
    # ((key, step), Delta(value | halt)) at each step's end + dead letters
    totals = truncated.main | "SumPerKeyAndStep" >> ToStepTotals()
    # (key, StepTotal(step, value | halt))
    if public_keys is None:  # keys selected privately: released per bucket of keys
        released = totals | "ReleaseSelectedKeys" >> ReleaseSelected(config)
        # records of selected keys from their selection step on + dead letters
        return Released(released.main, [stepped.dead_letters, truncated.dead_letters,
                                        released.dead_letters], None, None)
    public = totals | "KeepPublicKeys" >> KeepPublicKeys(public_keys, diagnostics)
    # the same, of public keys only + dead letters (other keys' totals)
    released = public.main | "ReleasePerKey" >> ReleaseStreaming(
        config, public_keys, checkpoint is not None, window, key_states)
    # records, one per public key and step + dead letters (+ checkpointed: the key states with
    # their records (step, (key, (sealed, halt), record)))
    return Released(released.main, [stepped.dead_letters, truncated.dead_letters,
                                    public.dead_letters, released.dead_letters], None,
                    released.states)

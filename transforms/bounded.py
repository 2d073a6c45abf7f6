"""The bounded pipeline (files, one run of `pipelines.run`, a window of a scheduled run).

    events                                  timestamped elements, or EventBatches
    | AssignSteps(packed=True)              -> (unit, [Event tuples]) per unit and bundle
                                               + dead letters
    | GroupByUnit (with saved unit states)  -> (unit, [packs]) or (unit, ([packs], [state]))
    | TruncateUnits                         -> (key, KeySums wire tuple) per key and bundle
                                               + unit states + dead letters (halts)
    | SumPerKey                             -> (key, ({step: exact total}, (halt steps)))
    | KeepPublicKeys                        -> the same, of public keys only
    | ReleaseKeys (with saved key states)   -> records, one per public key and step
                                               + key states + dead letters (exact totals)

`release_bounded` composes them. Input is grouped (GroupByKey / CombinePerKey) and every
key's steps are released in one vectorised call; truncation sums a bundle's contributions per
key before they leave it (one element per key and bundle, not one per contribution). A run
takes the previous run's states and returns its new ones beside its records (the
scheduler's checkpoint hooks).
"""
from __future__ import annotations

import collections
import math
from fractions import Fraction
from typing import Any, Dict, Optional, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow, TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from transforms import stages
from transforms.key_state import KeyState, advance, other_key_type
from transforms.messages import (DEAD_LETTER, METRICS, END_OF_GLOBAL, GLOBAL_WINDOWS, KEY_STATES, KEYED,
                                 MICRO, UNIT_STATES, Released, StageOutput, StepWindow,
                                 add_exact, count_dropped, count_keys, dead_letter, empty)
from transforms.release import RecordMaker, ReleaseConfig, key_text
from transforms.streams.records import Reason
from transforms.columnar import by_bucket
from transforms.streams.columns import Codes, exact_enough, sum_cells, truncate_columns
from transforms.streams.count import UnitState
from transforms.streams.units import Problem, payloads_by_step, run_unit
from transforms.validation import fail

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


@beam.typehints.with_output_types(KEYED)
class TruncateUnitsFn(beam.DoFn):
    """(unit, [packs of Event tuples]) or, resumed, (unit, ([packs], [saved state])) -> the new
    unit state (tagged) and, once per bundle, (key, KeySums wire tuple) of every key the
    bundle's units contributed to (fewer, larger elements than one per contribution)."""

    def __init__(self, problem: Problem, window: StepWindow, diagnostics: bool,
                 with_states: bool = True, public_keys: Sequence = None):
        self.problem, self.window = problem, window
        self.diagnostics, self.with_states = diagnostics, with_states
        # operator-only per-key truncation: each public key's input and kept amounts
        self.public_keys = set(public_keys) if diagnostics and public_keys is not None \
            and problem.exact_key_masses else None

    def start_bundle(self):
        self._sums: Dict[Any, tuple] = {}
        self._dropped: collections.Counter = collections.Counter()
        self._given: collections.Counter = collections.Counter()
        self._kept: collections.Counter = collections.Counter()

    def process(self, item):
        unit, grouped = item
        if self.with_states:
            packs, saved = grouped
            saved = list(saved)
        else:
            packs, saved = grouped, ()
        packs = list(packs)
        wire_events = packs[0] if len(packs) == 1 else [e for pack in packs for e in pack]
        yield from self._unit(unit, wire_events, saved[0] if saved else None)

    def _unit(self, unit, wire_events, saved):
        """One unit's events ((step, micros, payload) tuples) through its machine from its saved
        state (None: a new unit): its state out, its contributions into the bundle's sums."""
        state = saved if saved is not None else self.problem.init_state()
        problem = self.problem
        by_step = payloads_by_step(wire_events, ordered=problem.ordered)
        # a unit first seen in a resumed run starts its machine at step 0 (it had no events)
        run = run_unit(problem, unit, state, by_step,
                       self.window.first if saved is not None else 0, self.window.stop)
        if self.diagnostics:  # operator-only: depends on private data
            self._dropped.update(run.dropped)
        if self.public_keys is not None:
            self._count_keys(wire_events, run.contributions)
        sums = self._sums
        for key, step, value in run.contributions:
            acc = sums.get(key)
            if acc is None:
                acc = sums[key] = KeySums.new()
            KeySums.add(acc, step, value)
        if run.halt is not None:
            yield dead_letter(unit, Reason("bound_violation", run.halt.reason))
            acc = sums.get(unit)
            if acc is None:
                acc = sums[unit] = KeySums.new()
            acc[2].add(run.halt.step)
        yield beam.pvalue.TaggedOutput(UNIT_STATES, (unit, run.state))

    def _count_keys(self, events, contributions):
        public, given, kept, mass = self.public_keys, self._given, self._kept, \
            self.problem.key_mass
        for _, _, payload in events:
            if payload[0] in public:
                given[payload[0]] += mass(payload)
        for key, _, value in contributions:
            if key in public:
                kept[key] += int(value)

    def finish_bundle(self):
        count_dropped(self._dropped)
        count_keys(self._given, self._kept)
        for key, acc in self._sums.items():
            yield WindowedValue((key, KeySums.wire(acc)), END_OF_GLOBAL, GLOBAL_WINDOWS)
        self._sums, self._dropped = {}, collections.Counter()


@beam.typehints.with_output_types(KEYED)
class TruncateBucketsFn(TruncateUnitsFn):
    """(bucket, [UnitColumns]) or, resumed, (bucket, ([UnitColumns], [(unit, saved state)]))
    -> what `TruncateUnitsFn` gives for each unit of the bucket: new units with numpy
    (`streams.columns.truncate_columns`, the rule's result), resumed units (and a bucket
    whose masses could round) one by one through the rule itself."""

    def start_bundle(self):
        super().start_bundle()
        self._keys = Codes()  # the bundle's key codes, and their canonical ranks
        self._ranks, self._cells = np.zeros(0, np.int64), []

    def process(self, item):
        _, grouped = item
        parts, saved = (grouped if self.with_states else (grouped, ()))
        parts, states = list(parts), {}
        for unit, state in saved:
            states.setdefault(unit, state)
        unit_codes, keys = Codes(), self._keys
        units = [unit_codes.of(p.units) for p in parts]
        codes = [keys.of(p.keys) for p in parts]
        u = np.concatenate(units) if parts else np.zeros(0, np.int64)
        k = np.concatenate(codes) if parts else np.zeros(0, np.int64)
        s = np.concatenate([p.steps for p in parts]) if parts else np.zeros(0, np.int64)
        v = np.concatenate([p.values for p in parts]) if parts else np.zeros(0)
        limits = self.problem.limits
        one_by_one = np.zeros(len(unit_codes.ids), dtype=bool)
        for unit in states:
            code = unit_codes.index.get(unit)
            if code is not None:
                one_by_one[code] = True
        if not exact_enough(limits, v):
            one_by_one[:] = True
        slow = one_by_one[u]
        for unit, events in self._events_of(unit_codes, keys, u[slow], k[slow], s[slow],
                                            v[slow]).items():
            yield from self._unit(unit, events, states.pop(unit, None))
        for unit, state in states.items():  # saved, no events in this run
            yield from self._unit(unit, [], state)
        fast = ~slow
        if not fast.any():
            return
        present, u = np.unique(u[fast], return_inverse=True)
        k, s, v = k[fast], s[fast], v[fast]
        if len(self._ranks) < len(keys.ids):
            self._ranks = keys.canonical_ranks()
        done = truncate_columns(limits, u, len(present), k, self._ranks, s, v)
        ids = unit_codes.ids
        for code, used, admitted in zip(present.tolist(), done.used.tolist(), done.admitted):
            yield beam.pvalue.TaggedOutput(UNIT_STATES, (ids[code], UnitState(
                used, tuple(keys.ids[c] for c in admitted.tolist()))))
        self._cells.append((done.cell_keys, done.cell_steps, done.cell_values))
        if self.diagnostics:  # operator-only: depends on private data
            self._dropped.update(done.dropped)
        if self.public_keys is not None:
            self._count_key_codes(k, v, done)

    @staticmethod
    def _events_of(unit_codes, keys, u, k, s, v) -> Dict[Any, list]:
        """Events as the rule takes them: {unit: [(step, micros, (key, value))]} (a count's
        or sum's rule does not read event times)."""
        out: Dict[Any, list] = {}
        units, key_ids = unit_codes.ids, keys.ids
        for unit, key, step, value in zip(u.tolist(), k.tolist(), s.tolist(), v.tolist()):
            out.setdefault(units[unit], []).append((step, 0, (key_ids[key], value)))
        return out

    def _count_key_codes(self, k, v, done):
        key_ids, public = self._keys.ids, self.public_keys
        given = np.bincount(k, weights=v, minlength=len(key_ids))
        kept = np.bincount(done.cell_keys, weights=done.cell_values, minlength=len(key_ids))
        for code in np.flatnonzero(given).tolist():
            key = key_ids[code]
            if key in public:
                self._given[key] += int(given[code])
                self._kept[key] += int(kept[code])

    def finish_bundle(self):
        if self._cells:  # (key, step) sums over the bundle's buckets, into KeySums
            keys, steps, values = sum_cells(*(np.concatenate(part)
                                              for part in zip(*self._cells)))
            key_ids, sums = self._keys.ids, self._sums
            for code, step, value in zip(keys.tolist(), steps.tolist(), values.tolist()):
                acc = sums.get(key_ids[code])
                if acc is None:
                    acc = sums[key_ids[code]] = KeySums.new()
                acc[0][step] = acc[0].get(step, 0) + value
            self._cells = []
        yield from super().finish_bundle()


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


class _ReleaseKeysFn(beam.DoFn):
    """(key, {"totals": [StepTotal], "state": [saved], "seed": [...]}) -> the key's records for
    the window's steps and its new state (tagged with the release: a state of another release
    or secret is refused, it would re-draw published noise)."""

    def __init__(self, config: ReleaseConfig, window: StepWindow):
        self.config, self.window = config, window
        # no public keys: keys are selected privately (`transforms.mechanisms.selection`)
        self.tau = config.selection_threshold
        self.selects = self.tau is not None
        # operator-only: keys with data (a private count) and keys selected, so far
        self.with_data = self.published = None
        if config.diagnostics:
            self.with_data = Metrics.counter(METRICS, "selection_keys_with_data")
            self.published = Metrics.counter(METRICS, "selection_keys_published")

    def setup(self):
        self.maker = RecordMaker(self.config)
        steps = self.config.steps  # every record of a step carries the same event time
        self._stamps = {step: Timestamp.of(steps.end(step) - MICRO)  # the window's only
                        for step in range(self.window.first, self.window.stop)}

    def process(self, item, window=beam.DoFn.WindowParam):
        key, grouped = item
        if self.selects:  # every key with data (or a state: it had data in a run before)
            refused = other_key_type(key, self.config)
            if refused is not None:
                yield dead_letter(key, refused)
                return
            yield from self._release(key, grouped, window)
        elif list(grouped["seed"]):  # else not a public key: no output, whatever its data
            yield from self._release(key, grouped, window)

    def _release(self, key, grouped, window=None):
        first, stop = self.window.first, self.window.stop
        saved = list(grouped["state"])
        if len(saved) > 1:
            fail("key states", f"one per key (key {key_text(key)!r} has {len(saved)})",
                 len(saved))
        saved = KeyState(*saved[0]) if saved else None
        x = np.zeros(stop - first)
        halt = data_from = None
        for values, halts in grouped["totals"]:  # one per key (SumPerKeyAndStep)
            if halts:
                halt = min(halts) if halt is None else min(halt, min(halts))
            for step, value in values.items():
                if step not in halts:  # a halted step's sum is not added (as one StepTotal)
                    x[step - first] += value
            if values and data_from is None:  # a kept contribution starts the key (any value)
                data_from = min(values)
        # a public key's stream starts at step 0; a selected key's whenever it has data
        published, dead, state = advance(self.maker, key, saved, x, first, halt, data_from,
                                         self.tau, may_start=first == 0 or self.selects)
        for reason in dead:
            yield dead_letter(key, reason)
        stamps = self._stamps
        for step, value, previous in published:
            record = self.maker.record(key, step, value, previous)
            if isinstance(window, GlobalWindow):  # = TimestampedValue, without re-assigning
                yield WindowedValue(record, stamps[step], GLOBAL_WINDOWS)
            else:
                yield TimestampedValue(record, stamps[step])
        if self.selects and self.with_data is not None:  # operator-only (private counts)
            self.with_data.inc()
            if state.selected is not None:
                self.published.inc()
        yield beam.pvalue.TaggedOutput(KEY_STATES, (key, state.wire(self.selects)))


class TruncateUnits(beam.PTransform):
    """(unit, [Event tuples]) packs (`AssignSteps(packed=True)`) -> (key, KeySums wire tuple),
    one per key and bundle, + the units' new states + dead letters (bound violations). Each
    unit's machine (`Problem.run`) runs over its steps in order from its saved state
    (`resume_states`, (unit, state) pairs), which bounds what one unit contributes."""

    def __init__(self, problem: Problem, window: StepWindow, resume_states=None,
                 diagnostics: bool = False, public_keys: Sequence = None,
                 columnar: bool = False):
        super().__init__()
        self.problem, self.window = problem, window
        self.resume_states, self.diagnostics = resume_states, diagnostics
        self.public_keys = public_keys  # with diagnostics: per-key truncation counts
        # packs are (bucket, UnitColumns) (`transforms.columnar`), not (unit, [Event tuples])
        self.columnar = columnar

    def expand(self, packs):
        states = self.resume_states
        if self.columnar and states is not None:
            states = states | "StatesByBucket" >> beam.Map(by_bucket).with_output_types(KEYED)
        if states is None:
            grouped = packs | "GroupByUnit" >> beam.GroupByKey()
            # (unit or bucket, [packs])
        else:
            grouped = ({"events": packs, "state": states}
                       | "GroupByUnit" >> beam.CoGroupByKey()
                       | "EventsAndState" >> beam.MapTuple(
                           lambda unit, parts: (unit, (parts["events"], parts["state"]))))
            # (unit, ([packs], [saved state])) or (bucket, ([packs], [(unit, saved state)]))
        fn = TruncateBucketsFn if self.columnar else TruncateUnitsFn
        out = grouped | "Truncate" >> beam.ParDo(fn(
            self.problem, self.window, self.diagnostics,
            with_states=self.resume_states is not None,
            public_keys=self.public_keys)).with_outputs(
                DEAD_LETTER, UNIT_STATES, main="deltas")
        return StageOutput(out.deltas, out[DEAD_LETTER], out[UNIT_STATES])


class SumPerKey(beam.PTransform):
    """(key, KeySums wire tuple) -> one (key, ({step: total}, (halt steps))) per key: a total
    is the correctly rounded exact sum of the key's deltas at the step."""

    def expand(self, sums):
        return sums | "ExactSums" >> beam.CombinePerKey(_KeySumsFn()).with_output_types(KEYED)


class KeepPublicKeys(stages.KeepPublicKeys):
    @staticmethod
    def changed_steps(total) -> int:
        values, halts = total
        return len(set(halts).union(s for s, v in values.items() if v != 0))


class ReleaseKeys(beam.PTransform):
    """(key, ({step: total}, halts)) -> one record per public key and step of the window (a
    key without data gets its records too: no output's presence depends on private data,
    except a halt), + the keys' new states + dead letters; totals and saved states of other
    keys are ignored. Each key continues from its saved state (`resume_states`,
    (key, (sealed bytes, halted)) pairs). Exact totals (discrete noise): a key whose step
    total, running total or released value would reach 2^53 in magnitude halts at that step
    (no record for it or later; the halt step is kept in its state) with an "exact totals"
    dead letter. Records carry the event time of their step's end (minus 1 us)."""

    def __init__(self, config: ReleaseConfig, public_keys: Optional[Sequence],
                 window: Optional[StepWindow] = None, resume_states=None):
        super().__init__()
        # None: keys are selected privately (config.selection_threshold; every key with data)
        self.config, self.public_keys = config, public_keys and list(public_keys)
        self.window = window or StepWindow.whole(config.steps)
        self.resume_states = resume_states

    def expand(self, totals):
        pipeline = totals.pipeline
        states = self.resume_states if self.resume_states is not None else empty(
            pipeline, "NoSavedStates")
        keys = [] if self.public_keys is None else self.public_keys
        seeds = (pipeline | "PublicKeys" >> beam.Create(keys, reshuffle=False)
                 | "SeedEveryKey" >> beam.Map(lambda key: (key, None)).with_output_types(KEYED))
        out = ({"totals": totals, "state": states, "seed": seeds}
               | "GroupByKey" >> beam.CoGroupByKey()
               | "Release" >> beam.ParDo(_ReleaseKeysFn(self.config, self.window)).with_outputs(
                   KEY_STATES, DEAD_LETTER, main="records"))
        return StageOutput(out.records, out[DEAD_LETTER], out[KEY_STATES])


def release_bounded(events, problem: Problem, config: ReleaseConfig, public_keys: Sequence,
                    window: StepWindow, unit_states=None, key_states=None,
                    diagnostics: bool = False) -> Released:
    """The bounded composition, stage by stage (the module docstring's shapes)."""
    columnar = problem.columnar
    stepped = events | "AssignSteps" >> stages.AssignSteps(
        problem, config.steps, window, diagnostics, packed=True, columnar=columnar)
    # (unit, [Event tuples]) per unit and bundle, or columnar: (bucket, UnitColumns) per
    # bucket and bundle + dead letters
    truncated = stepped.main | "TruncatePerUnit" >> TruncateUnits(
        problem, window, unit_states, diagnostics, public_keys, columnar)
    # (key, KeySums wire tuple) per key and bundle + unit states + dead letters
    totals = truncated.main | "SumPerKeyAndStep" >> SumPerKey()
    # (key, ({step: exact total}, (halt steps))), one per key
    if public_keys is None:  # keys selected privately: every key with data
        public = totals
    else:
        public = totals | "KeepPublicKeys" >> KeepPublicKeys(public_keys, diagnostics)
    # the same, of public keys only
    released = public | "ReleasePerKey" >> ReleaseKeys(config, public_keys, window, key_states)
    # records, one per public (or selected) key and step + key states (key, (sealed bytes,
    # halt step), selecting: (sealed bytes, halt step, first step with data, selection step))
    return Released(released.main, [stepped.dead_letters, truncated.dead_letters,
                                    released.dead_letters], truncated.states, released.states)

"""Step assignment: a timestamped element -> (unit, Event tuple) or a dead letter.

`AssignStepsFn._assign` is the one per-element rule (horizon, window, `Problem.parse`); the
batched entry (`transforms.arrow_input.AssignBatchStepsFn`) vectorises it and calls it for
every row it does not vectorise. With `packed` (bounded input) events leave packed per unit
and bundle, one shuffled element per unit and bundle.
"""
from __future__ import annotations

from typing import Any, Dict

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.utils.windowed_value import WindowedValue

from transforms.columnar import ColumnPacks
from transforms.messages import (END_OF_GLOBAL, GLOBAL_WINDOWS, KEYED, METRICS, StepWindow,
                                 dead_letter)
from transforms.steps import TimeSteps
from transforms.streams.records import Reason
from transforms.streams.units import Problem


# operator-only metrics: values parsed below min_value, above max_value (`Problem.clamped`)
CLAMPED = ("values_below_min_value", "values_above_max_value")


class PerUnitPacks:
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
            yield WindowedValue((unit, events), END_OF_GLOBAL, GLOBAL_WINDOWS)


@beam.typehints.with_output_types(KEYED)
class AssignStepsFn(ColumnPacks, PerUnitPacks, beam.DoFn):
    """Timestamped element -> (unit, Event tuple), or with `packed` (bounded input) ->
    (unit, [Event tuples]) once per unit and bundle (or per `MAX_EVENTS` buffered events):
    step assignment and the per-unit packing before the shuffle in one DoFn, so an event
    crosses one Beam stage, and the shuffle moves one element per unit and bundle. With
    `columnar` (packed, `Problem.columnar`) -> (bucket, UnitColumns) per bucket and bundle
    (`transforms.columnar`)."""

    columnar = False

    def _start_packs(self):
        if self.columnar:
            self.start_columns()
        else:
            super()._start_packs()

    def _pack(self, unit, event):
        return self.add_event(unit, event) if self.columnar else super()._pack(unit, event)

    def _flush(self):
        return self.flush_columns() if self.columnar else super()._flush()

    def __init__(self, problem: Problem, steps: TimeSteps, window: StepWindow,
                 diagnostics: bool = False, packed: bool = False):
        self.problem, self.steps, self.window = problem, steps, window
        self.diagnostics, self.packed = diagnostics, packed
        # unbounded input (a continued streaming release): an event of a step published before
        # the window is late, a dead letter naming the step; bounded: history, skipped
        self.late_before_window = False

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
            clamped = self.problem.clamped  # values parsed outside [min_value, max_value]
            if clamped is not None and any(clamped):
                for name, count in zip(CLAMPED, clamped):
                    if count:
                        Metrics.counter(METRICS, name).inc(count)
                clamped[:] = [0, 0]
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
            return dead_letter(element, Reason(
                "outside_horizon", f"event time {self.steps.iso(seconds)} is outside the horizon "
                                   f"[{self.steps.iso(self.steps.origin)}, "
                                   f"{self.steps.iso(self.steps.stop)})"))
        if step < self.window.first:
            if self.late_before_window:  # arrived while the stopped job was down
                return dead_letter(element, Reason(
                    "late", f"late: step {step} was already released (before this "
                            f"continuation's first step {self.window.first})"))
            self._released += 1  # released by an earlier run: skipped (the source holds
            return None          # history), not a dead letter each
        if step >= self.window.stop:
            return None  # left for a later run, which reads it again (not lost)
        parsed, reason = self.problem.parse(element)
        if parsed is None:
            return dead_letter(element, reason)
        self._assigned += 1
        return parsed.unit, (step, int(micros), parsed.payload)  # an Event, as a tuple

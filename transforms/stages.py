"""The stages both pipelines share: step assignment and the public-key filter.

The two compositions are `transforms.bounded.release_bounded` (files, scheduled runs) and
`transforms.streaming.release_streaming` (unbounded input); each reads top to bottom as named
stages with the element shape after each. The Beam-free rules they run are in
`transforms.streams` (a problem's `parse`, `advance` / `run`) and `transforms.mechanisms`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from transforms.arrow_input import AssignBatchStepsFn, is_batched
from transforms.assign import AssignStepsFn
from transforms.messages import DEAD_LETTER, KEYED, METRICS, StageOutput, StepWindow
from transforms.steps import TimeSteps
from transforms.streams.units import Problem
from transforms.validation import fail


class AssignSteps(beam.PTransform):
    """Timestamped elements -> (unit, Event tuple) for the steps of `window`; elements outside the
    horizon or malformed -> dead letters with a reason. Elements of steps before the window
    (released by an earlier run) are skipped, those after it are left for a later run.

    The input may also be `EventBatch`es (`transforms.arrow_input.ArrowEvents`, bounded
    input): steps are then assigned with numpy, with the same result event for event. With
    `packed` (bounded input: `bounded.TruncateUnits` takes it) the output is
    (unit, [Event tuples]), one element per unit and bundle."""

    def __init__(self, problem: Problem, steps: TimeSteps, window: Optional[StepWindow] = None,
                 diagnostics: bool = False, packed: bool = False, columnar: bool = False):
        super().__init__()
        self.problem, self.steps = problem, steps
        self.window = window or StepWindow.whole(steps)
        self.diagnostics, self.packed = diagnostics, packed
        # packed events of a `Problem.columnar` problem: (bucket, UnitColumns) out
        self.columnar = columnar

    def expand(self, events):
        if self.packed and not events.is_bounded:
            fail("packed", "False for unbounded input (streaming truncation takes events)",
                 True)
        batched = is_batched(events)
        # steps come from event times, not windows: one global window, whatever the input's
        # windowing (per-window truncation would bound a unit only within each window)
        if not events.windowing.is_default():  # (a WindowInto pass only when needed)
            events = events | "GlobalWindow" >> beam.WindowInto(GlobalWindows())
        if batched:
            if not events.is_bounded:
                fail("input", "bounded when it holds EventBatches (unbounded input: "
                              "timestamped elements)", "unbounded EventBatches")
            fn = AssignBatchStepsFn(self.problem, self.steps, self.window, self.diagnostics,
                                    self.packed)
        else:
            fn = AssignStepsFn(self.problem, self.steps, self.window, self.diagnostics,
                                self.packed)
            fn.late_before_window = not events.is_bounded
        fn.columnar = self.columnar and self.packed and self.problem.columnar
        out = events | "Assign" >> beam.ParDo(fn).with_outputs(DEAD_LETTER, main="events")
        return StageOutput(out.events, out[DEAD_LETTER])


class KeepPublicKeys(beam.PTransform):
    """(key, total) -> the same, of public keys only. Others are dropped: their presence must
    not decide any output (how many steps they changed goes to an operator-only metric with
    `diagnostics`). Each pipeline's subclass says what its totals are (`changed_steps`)."""

    def __init__(self, public_keys: Sequence, diagnostics: bool = False):
        super().__init__()
        self.public_keys, self.diagnostics = list(public_keys), diagnostics

    @staticmethod
    def changed_steps(total) -> int:
        """How many steps a dropped total changes (the operator-only metric counts them)."""
        raise NotImplementedError

    def expand(self, totals):
        public = set(self.public_keys)
        dropped = Metrics.counter(METRICS, "dropped_non_public_keys") \
            if self.diagnostics else None
        kept = Metrics.counter(METRICS, "kept_public_keys") if self.diagnostics else None
        changed_steps = type(self).changed_steps

        def keep(item):
            key, total = item
            if key in public:
                if kept is not None:
                    kept.inc(changed_steps(total))
                yield item
            elif dropped is not None:
                count = changed_steps(total)
                if count:
                    dropped.inc(count)

        return totals | "KeepPublic" >> beam.FlatMap(keep).with_output_types(KEYED)

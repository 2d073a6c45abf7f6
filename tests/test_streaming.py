"""The unbounded pipeline (transforms/streaming.py) when the watermark jumps across several step
ends at once (after a backlog, a restart or an idle source)."""
from __future__ import annotations

import os
import tempfile

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream as BeamTestStream
from apache_beam.transforms.window import TimestampedValue

from tests.support.beam import AppendJson, read_json_lines, run
from transforms import ContinualCount, SecretRef, TimeSteps
from transforms.messages import KEYED
from transforms.stream_truncation import TruncateStreaming
from transforms.streams import ContributionBounds
from transforms.streams.units import CountProblem

ORIGIN = 1_700_000_000.0
STEPS = TimeSteps(ORIGIN, 60.0, 6)
EVENTS = [((f"u{i}", "a" if i % 3 else "b"), ORIGIN + (i % 5) * 60 + 5.0 + i / 100)
          for i in range(30)]  # key "c" never has events; step 5 has none


def count(delay: int):
    return ContinualCount(steps=STEPS, public_keys=["a", "b", "c"], epsilon=1.0,
                          max_contributions=3, secret=SecretRef(literal=b"jumps"),
                          insecure=True, release_delay_steps=delay)


def run_jumping(transform, jump: int, overshoot: int = 0):
    """The events step by step; the watermark advanced to the end of every `jump`-th step
    (`overshoot`: that many step ends further, past events still to come: they are late)."""
    folder = tempfile.mkdtemp(prefix="jumps-")
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    by_step = {}
    for element, ts in EVENTS:
        by_step.setdefault(STEPS.step_of(ts), []).append(TimestampedValue(element, ts))
    with beam.Pipeline(options=options) as pipeline:
        stream, step = BeamTestStream(), 0
        while step < STEPS.horizon:
            stop = min(step + jump, STEPS.horizon)
            for s in range(step, stop):
                if by_step.get(s):
                    stream = stream.add_elements(by_step[s])
            stream = stream.advance_watermark_to(STEPS.end(stop - 1 + overshoot))
            step = stop
        stream = stream.advance_watermark_to(STEPS.end(STEPS.horizon + 3))
        result = pipeline | stream.advance_watermark_to_infinity() | transform
        result.records | "Records" >> beam.ParDo(AppendJson(os.path.join(folder, "r")))
        result.dead_letters | "Dead" >> beam.ParDo(AppendJson(os.path.join(folder, "d")))
    records = sorted(read_json_lines(os.path.join(folder, "r")),
                     key=lambda r: (r["key"], r["step"]))
    return records, read_json_lines(os.path.join(folder, "d"))


@pytest.mark.parametrize("jump", [1, 2, 5, 6])
def test_every_step_is_released_once_in_order_whatever_the_watermark_jumps(jump):
    """Jumps of 1, 2, 5 and all steps at once: every public key gets every step exactly once
    (the local runner repeats a timer firing: the repeat releases nothing). With a release
    delay of at least the jump, the records equal the batch run. On this local runner timer
    output holds no watermark, so with a longer jump a step's contributions can reach the
    release after it (they are `late` dead letters, never a repeated or a wrong step); runners
    that hold the watermark for timer output (Dataflow) do not lose them."""
    records, dead = run_jumping(count(jump), jump)
    assert [(r["key"], r["step"]) for r in records] == [
        (key, step) for key in ("a", "b", "c") for step in range(STEPS.horizon)]
    assert all(d["reason"].startswith("late: ") for d in dead)
    batch, _ = run(count(jump), EVENTS)
    assert records == batch and not dead
    if jump > 1:  # a delay of one step under a longer jump: released once, maybe late data
        delayed, late = run_jumping(count(1), jump)
        assert [(r["key"], r["step"]) for r in delayed] == [
            (key, step) for key in ("a", "b", "c") for step in range(STEPS.horizon)]
        assert all(d["reason"].startswith("late: ") for d in late)


@pytest.mark.parametrize("jump", [1, 2, 6])
def test_a_watermark_past_the_events_and_the_horizon_releases_every_step_once(jump):
    """The watermark jumps one step end beyond the events each time (the last jump past the
    horizon's end): every step is still released once, in order (it used to fail the release
    with "`steps released` must be <= horizon (6); got 7": a repeated timer firing released a
    step early and its repeat stepped past the horizon); events behind the watermark are late
    dead letters naming their step."""
    records, dead = run_jumping(count(1), jump, overshoot=1)
    assert [(r["key"], r["step"]) for r in records] == [
        (key, step) for key in ("a", "b", "c") for step in range(STEPS.horizon)]
    assert dead and all(d["reason"].startswith("late: step ") for d in dead)


def test_no_dofn_of_the_plugin_mixes_yield_and_return_in_process():
    """Beam warns ("Using yield and return in the process method", apache/beam#22969) when a
    process method both yields and returns a value; its check reads the source line by line."""
    import importlib
    import inspect

    # Beam's own check, the one that warns (not public API: it is what decides the warning)
    warns = getattr(importlib.import_module("apache_beam.transforms.core"),
                    "_check_fn_use_yield_and_return")

    import transforms.arrow_input
    import transforms.assign
    import transforms.bounded
    import transforms.mean
    import transforms.sinks
    import transforms.stream_truncation
    import transforms.streaming
    modules = (transforms.arrow_input, transforms.assign, transforms.bounded, transforms.mean,
               transforms.sinks, transforms.stream_truncation, transforms.streaming)
    fns = [cls for module in modules for _, cls in inspect.getmembers(module, inspect.isclass)
           if issubclass(cls, beam.DoFn) and cls.__module__ == module.__name__]
    assert len(fns) >= 8
    assert [cls.__name__ for cls in fns if warns(cls.process)] == []


def test_a_drain_releases_no_step_whose_release_time_is_after_the_wall_clock():
    """A drain (or cancel) moves the watermark to the end of time at once. Steps 0..5 of 60 s
    start 3.5 steps before now: with a release delay of one step, steps 0 and 1 are due on the
    wall clock (step 2 is due 30 s from now, far longer than this test runs) and are the only
    ones released; the later steps are never released with no data (the release ends at step
    1: a timer firing ahead of the wall clock sets no new timer)."""
    import time
    origin = float(int(time.time() - 3.5 * 60))
    steps = TimeSteps(origin, 60.0, 6)
    events = [((f"u{i}", "a"), origin + 60.0 * (i % 3) + i) for i in range(9)]
    folder = tempfile.mkdtemp(prefix="drain-")
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    with beam.Pipeline(options=options) as pipeline:
        stream = BeamTestStream().add_elements([TimestampedValue(e, t) for e, t in events])
        result = pipeline | stream.advance_watermark_to_infinity() | ContinualCount(
            steps=steps, public_keys=["a", "b"], epsilon=1.0, max_contributions=3,
            secret=SecretRef(literal=b"drain"), insecure=True)
        result.records | "Records" >> beam.ParDo(AppendJson(os.path.join(folder, "r")))
    released = sorted((r["key"], r["step"]) for r in read_json_lines(os.path.join(folder, "r")))
    assert time.time() < steps.end(3), "the test ran past step 2's release time"
    assert released == [(key, step) for key in ("a", "b") for step in (0, 1)]


def test_a_release_timer_that_fires_before_the_worker_clock_is_retried_on_it(monkeypatch):
    """A watermark ahead of a worker's clock (publishers stamping ahead, clock skew) fires a
    step's release timer before the worker's clock reaches the release time: the step is held,
    then released on the wall clock (a processing-time retry), and every later step follows.
    It used to stop the key for good (and with it every later step file)."""
    import time
    from transforms import streaming
    steps = TimeSteps(float(int(time.time() - 3600)), 60.0, 4)
    first_release = steps.end(1)

    class Skewed:  # the worker's clock 1 ms behind the release time at the first firing only
        calls = 0

        def time(self):
            Skewed.calls += 1
            return first_release - 0.001 if Skewed.calls == 1 else time.time()

    monkeypatch.setattr(streaming, "time", Skewed())
    folder = tempfile.mkdtemp(prefix="skew-")
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    events = [TimestampedValue((f"u{i}", "ab"[i % 2]), steps.origin + 60 * (i % 4) + 1)
              for i in range(16)]
    stream = BeamTestStream().add_elements(events)
    for step in range(1, 6):
        stream = stream.advance_watermark_to(steps.end(step))
    # the local runner's processing-time clock starts at 0 under TestStream
    stream = stream.advance_processing_time(first_release + 1)
    with beam.Pipeline(options=options) as pipeline:
        result = pipeline | stream | ContinualCount(
            steps=steps, public_keys=["a", "b"], epsilon=1.0, max_contributions=4,
            secret=SecretRef(literal=b"skew"), insecure=True)
        result.records | "Records" >> beam.ParDo(AppendJson(os.path.join(folder, "r")))
    released = sorted((r["key"], r["step"]) for r in read_json_lines(os.path.join(folder, "r")))
    assert released == [(key, step) for key in ("a", "b") for step in range(4)]


def test_the_truncation_stages_deltas_keep_their_typed_coder():
    """((key, step), Delta): typed for Beam's checks and coders (a helper once defined between
    the type hint and the DoFn took the hint, and the deltas fell back to pickled elements)."""
    pipeline = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    events = pipeline | beam.Create([]).with_output_types(KEYED)
    deltas = (events | TruncateStreaming(CountProblem(ContributionBounds(3, 2, 2)),
                                         TimeSteps(0.0, 60.0, 5))).main
    coder = beam.coders.registry.get_coder(deltas.element_type)
    assert repr(coder) == "TupleCoder[TupleCoder[KeyCoder, VarIntCoder], FastPrimitivesCoder]"

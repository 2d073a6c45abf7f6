"""The unbounded truncation stage (transforms/stream_truncation.py), its DoFn called directly
with fake Beam state (`tests.support.fake_state`): per bucket of units, each unit's outputs are
`advance_unit`'s over the events it accepted, bit for bit, whoever shares its bucket."""
from __future__ import annotations

import random
import struct

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.utils.timestamp import Timestamp

from tests.support.fake_state import Cells, fired
from transforms import TimeSteps
from transforms.messages import DEAD_LETTER, KEYED, Delta
from transforms.settle import SETTLE_MICROS, whole_ms
from transforms.stream_truncation import (ByBucket, ResumedTruncateStreamingFn, TruncateStreaming,
                                         TruncateStreamingFn, bucket_count)
from transforms.streams import ContributionBounds, count_distinct
from transforms.streams.columns import bucket_of
from transforms.streams.count import UnitState
from transforms.streams.units import (CountProblem, DegreeProblem, EntityProblem,
                                      TriangleProblem, advance_unit, sorted_payloads,
                                      steps_to_run)

ORIGIN, SIZE, HORIZON = 1_700_000_000.0, 60.0, 9
STEPS = TimeSteps(ORIGIN, SIZE, HORIZON)


def bits(item):
    """An emitted delta as comparable text: key, step, the value's type and float bits, time."""
    (key, step), delta = item[0]
    return (repr(key), step, delta.halt, type(delta.value).__name__,
            struct.pack("<d", delta.value).hex() if delta.value is not None else None, item[1])


def problems():
    return {
        "count": CountProblem(ContributionBounds(3, 2, 2)),
        "count_many": CountProblem(ContributionBounds(50, 7, 5)),
        "sum_fractional": CountProblem(ContributionBounds(5, 3, 2, max_value=2.5),
                                       with_value=True),
        "distinct": EntityProblem(count_distinct(3), max_keys_per_unit=2),
        "degree": DegreeProblem(3),
        "triangles": TriangleProblem(max_degree=3, max_contribution=4),
    }


def element(name, rng):
    key = rng.choice(["a", "b", 3, ("g", 1)])
    if name.startswith("count"):
        return (rng.choice(["u", "v", 7]), key)
    if name.startswith("sum"):
        return (rng.choice(["u", "v"]), key,
                rng.choice([0.1, 0.7, 1.0, 2.4999, 3.7, 1e-17, -1.0, 0.30000000000000004]))
    if name == "distinct":
        return (rng.choice("+-"), rng.choice(["i", "j"]), key)
    a, b = rng.sample(range(5), 2)
    return (rng.choice("++-"), (a, b))


def step_firings(fn, cells: Cells, bucket, limit: int) -> list:
    """Fires the bucket's step-end timer while it is due by `limit` (micros): its outputs."""
    out = []
    while cells.timer.time is not None and cells.timer.time.micros <= limit:
        fire = cells.timer.time
        cells.timer.clear()
        out += list(fn.flush(fire=fire, **cells.bind(fn.flush, key=bucket)) or [])
    return out


@pytest.mark.parametrize("name", sorted(problems()))
@pytest.mark.parametrize("seed,count", [(0, 120), (1, 120), (2, 30), (3, 30), (4, 12)])
@pytest.mark.parametrize("shared", [True, False])
def test_streaming_truncation_equals_advance_unit(name, seed, count, shared):
    """Events arrive out of order (some early, some late), each bucket's step-end timer visits
    every step end as the watermark passes it; the deltas emitted equal `advance_unit`'s over
    each unit's accepted events, bit for bit, and an event of a step already closed is a late
    dead letter (so are a halted unit's later events). `shared`: every unit in one bucket (else
    in its own `bucket_of`): the same events are late either way."""
    rng = random.Random(seed)
    problem = problems()[name]
    fn = TruncateStreamingFn(problem, STEPS, name == "count")  # diagnostics: metrics too
    fn.setup()
    events = []
    for _ in range(count):
        parsed, _ = problem.parse(element(name, rng))
        step = rng.randrange(HORIZON)
        micros = int(round((ORIGIN + step * SIZE) * 1e6)) + rng.choice([0, 0, 7, 999])
        events.append((parsed.unit, (step, micros, parsed.payload)))
    arrivals = {}
    for unit, event in events:
        # up to two steps before its own, or two after it (late)
        arrivals.setdefault(max(0, event[0] - rng.randrange(3) + 2 * (rng.random() < 0.15)),
                            []).append((unit, event))
    # the rule, modelled: round w closes step w; an event arriving after its step closed is
    # late, and so is a unit's event of a step after the unit halted
    halted, accepted, model_late, waiting = set(), {}, [], []
    for watermark in range(HORIZON + 2):
        for unit, event in arrivals.get(watermark, []):
            if event[0] < min(watermark, HORIZON):
                model_late.append((repr((unit, event[2])), event[0]))
            else:
                waiting.append((unit, event))
        closing = [(u, e) for u, e in waiting if e[0] == watermark]
        waiting = [(u, e) for u, e in waiting if e[0] != watermark]
        for unit, event in closing:
            if unit in halted:
                model_late.append((repr((unit, event[2])), event[0]))
            else:
                accepted.setdefault(unit, []).append(event)
        for unit in {u for u, _ in closing}:
            by_step = sorted_payloads(accepted.get(unit, []))
            if by_step and advance_unit(problem, unit, problem.init_state(), by_step,
                                        steps_to_run(problem, by_step, 0, max(by_step) + 1)
                                        ).halt is not None:
                halted.add(unit)
    cells, emitted, late = {}, [], []

    def bucket_cells(bucket):
        if bucket not in cells:  # seeded (at the origin)
            cells[bucket] = Cells()
            assert not list(fn.process((bucket, None), **cells[bucket].bind(fn.process)) or [])
        return cells[bucket]

    def sort_out(items):
        for item in items:
            if not isinstance(item, beam.pvalue.TaggedOutput):
                emitted.append((item.value, item.timestamp.micros))
            elif item.value["code"] == "late":
                late.append((item.value["record"], int(item.value["reason"].split()[2])))
            else:
                assert item.value["code"] == "bound_violation"

    for unit, _ in events:
        bucket_cells(0 if shared else bucket_of(unit))
    for watermark in range(HORIZON + 2):  # the last: the end of input (+inf)
        for unit, event in arrivals.get(watermark, []):
            bucket = 0 if shared else bucket_of(unit)
            sort_out(fn.process((bucket, (unit, event)),
                                **bucket_cells(bucket).bind(fn.process)) or [])
        limit = int(round(STEPS.end(watermark) * 1e6)) if watermark < HORIZON else 1 << 62
        for bucket in sorted(cells):
            sort_out(step_firings(fn, cells[bucket], bucket, limit))
    assert all(not c.cells["bucket_events"].data and c.timer.time is None
               for c in cells.values())
    assert sorted(late) == sorted(model_late)
    assert len(late) > 0 or count < 100
    expected = []
    for unit, unit_events in accepted.items():
        by_step = sorted_payloads(unit_events)
        reference = advance_unit(problem, unit, problem.init_state(), by_step,
                                 steps_to_run(problem, by_step, 0, max(by_step) + 1))
        expected += [(((key, step), Delta(value)), int(round(STEPS.end(step) * 1e6)) - 1)
                     for key, step, value in reference.contributions]
        if reference.halt is not None:
            expected.append((((unit, reference.halt.step), Delta(halt=True)),
                             int(round(STEPS.end(reference.halt.step) * 1e6)) - 1))
    for (_, delta), _ in emitted:
        assert type(delta) is Delta
    assert sorted(map(bits, emitted)) == sorted(map(bits, expected))


def test_a_buckets_timer_visits_every_step_end_whatever_its_data():
    """A seeded bucket fires at every step's armed and due time, with events or without, and
    stops after the last step; a firing before the next step's due time closes nothing."""
    fn = TruncateStreamingFn(CountProblem(ContributionBounds(3, 2, 2)), STEPS, False)
    fn.setup()
    for events in ([], [(4, ("a", 1.0))]):
        cells = Cells()
        assert not list(fn.process((9, None), **cells.bind(fn.process)) or [])
        for step, payload in events:
            micros = int(round(STEPS.start(step) * 1e6))
            assert not list(fn.process((9, ("u", (step, micros, payload))),
                                       **cells.bind(fn.process)) or [])
        times, got = [], []
        while cells.timer.time is not None:
            fire = cells.timer.time
            times.append(fire.micros)
            cells.timer.clear()
            if len(times) == 3:  # a stale firing (step 0's due again): nothing, step 1 kept
                assert list(fn.flush(fire=Timestamp(micros=times[1]),
                                     **cells.bind(fn.flush))) == []
                assert cells.timer.time.micros == times[2]
                cells.timer.clear()
            got += [item.value for item in fn.flush(fire=fire, **cells.bind(fn.flush))]
        due = [whole_ms(int(round(STEPS.end(s) * 1e6))) for s in range(HORIZON)]
        assert times == [t for d in due for t in (d - SETTLE_MICROS, d)]
        assert got == [(("a", 4), Delta(1.0))] * len(events)
        assert cells.cells["closed"].read() == HORIZON - 1


def test_an_event_seen_after_its_steps_first_firing_is_on_time():
    """Beam's Python SDK runs a data-plane message's timers before its data, so a unit's
    step-end firing can come before an on-time event the runner received ahead of it. That
    firing only settles (`transforms.settle`): the event is kept and truncated with its step
    at the second firing, as the same events in order; an event after that one is late."""
    problem = CountProblem(ContributionBounds(3, 2, 2))
    fn = TruncateStreamingFn(problem, STEPS, False)
    fn.setup()
    cells = Cells()
    assert not list(fn.process((5, None), **cells.bind(fn.process)) or [])
    assert list(fired(fn.flush, cells, 5)) == []  # step 0 closes
    at = int(round(STEPS.start(1) * 1e6))
    events = [(1, at, ("a", 1.0)), (1, at + 5, ("b", 1.0))]
    assert not list(fn.process((5, ("u", events[0])), **cells.bind(fn.process)) or [])
    due = cells.timer.time
    assert list(fn.flush(fire=due, **cells.bind(fn.flush))) == []  # the firing first
    assert not list(fn.process((5, ("u", events[1])), **cells.bind(fn.process)) or [])  # data
    got = [item.value for item in fn.flush(fire=cells.timer.time,
                                           **cells.bind(fn.flush))]
    by_step = sorted_payloads(events)
    reference = advance_unit(problem, "u", problem.init_state(), by_step,
                             steps_to_run(problem, by_step, 0, 2))
    assert got == [((key, step), Delta(value)) for key, step, value in reference.contributions]
    assert len(got) == 2
    # an event after it: late at once (its step closed), whoever sends it
    for unit in ("u", "v"):
        late = list(fn.process((5, (unit, (1, at + 9, ("c", 1.0)))), **cells.bind(fn.process)))
        assert len(late) == 1 and late[0].tag == DEAD_LETTER
        assert "late: step 1 was already closed" in late[0].value["reason"]
    assert not cells.cells["bucket_events"].data


@pytest.mark.parametrize("origin,size,horizon,lateness", [
    (ORIGIN, SIZE, HORIZON, 0.0), (0.0, 0.1, 50, 2.0), (1e9 + 0.3, 1 / 3, 40, 0.0107),
    (-5.5, 7e-6, 30, 0.0), (1_700_000_000.123456, 3600.0, 1, 0.5), (2e11, 0.25, 12, 0.0),
    (253_402_000_000.0, 0.0021, 30, 0.001)])
def test_ready_through_is_the_last_step_whose_due_time_the_firing_reached(origin, size,
                                                                           horizon, lateness):
    """The flush's threshold is the last step whose due time (its end + the lateness, whole
    ms: its timer's) is <= the firing, brute force over every step, at due and armed times,
    1 us around them and at random times; every step is ready at its own due time, also where
    floats are 30 us apart (origins past the year 2514)."""
    steps = TimeSteps(origin, size, horizon)
    fn = TruncateStreamingFn(CountProblem(ContributionBounds(3, 2, 2)), steps, False,
                             lateness_seconds=lateness)
    due = [whole_ms(int(round(steps.end(s) * 1e6)) + int(round(lateness * 1e6)))
           for s in range(horizon)]
    rng = random.Random(7)
    times = {at + d for at in due for d in (-SETTLE_MICROS, -2, -1, 0, 1, 2)}
    low, high = int(steps.start(0) * 1e6) - 10 ** 7, due[-1] + 10 ** 7
    times.update(rng.randrange(low, high) for _ in range(300))
    for micros in sorted(times):
        expected = max([s for s in range(horizon) if due[s] <= micros], default=-1)
        for _ in range(2):  # computed, then cached
            assert fn._ready_through(Timestamp(micros=micros)) == expected
    for s in range(horizon):
        assert fn._ready_through(Timestamp(micros=due[s])) >= s




def test_by_bucket_keys_each_event_by_its_units_bucket():
    fn = ByBucket()
    fn.setup()
    for unit in ["u", 7, ("g", 1), "u", 2 ** 40]:
        event = (0, 1, ("a", 1.0))
        assert list(fn.process((unit, event))) == [(bucket_of(unit), (unit, event))]


def test_a_continued_units_first_event_takes_its_checkpointed_state():
    """A continued release from step 4: its buckets' timers start at step 4's end, an event of
    an earlier step is late (also before its bucket's seed), a unit's first event gives it its
    state as of the checkpoint (step 3: 2 of its 3 contributions used, on its 2 keys of 2) and
    the truncation goes on from it (a unit without a seed starts afresh)."""
    problem = CountProblem(ContributionBounds(3, 2, 2))
    fn = ResumedTruncateStreamingFn(problem, STEPS, False, first=4)
    fn.setup()
    seeds = {"u": (3, (2.0, ("a", "b")))}
    cells = Cells()
    at = int(round(STEPS.start(4) * 1e6))
    early = list(fn.process((0, ("w", (2, at, ("a", 1.0)))), seeds, **cells.bind(fn.process)))
    assert [item.value["reason"] for item in early] == ["late: step 2 was already closed"]
    assert not list(fn.process((0, None), seeds, **cells.bind(fn.process)) or [])
    late = list(fn.process((0, ("u", (3, at, ("a", 1.0)))), seeds, **cells.bind(fn.process)))
    assert [item.value["reason"] for item in late] == ["late: step 3 was already closed"]
    for unit, key in [("u", "a"), ("u", "c"), ("w", "c")]:
        assert not list(fn.process((0, (unit, (4, at, (key, 1.0)))), seeds,
                                   **cells.bind(fn.process)) or [])
    assert cells.timer.time.micros == whole_ms(int(round(STEPS.end(4) * 1e6))) - SETTLE_MICROS
    out = fired(fn.flush, cells, 0)
    assert not [item for item in out if isinstance(item, beam.pvalue.TaggedOutput)]
    got = sorted(map(bits, [(item.value, item.timestamp.micros) for item in out]))
    by_step = sorted_payloads([(4, at, ("a", 1.0)), (4, at, ("c", 1.0))])
    after = advance_unit(problem, "u", UnitState(2.0, ("a", "b")), by_step, [4])
    fresh = advance_unit(problem, "w", problem.init_state(), {4: [("c", 1.0)]}, [4])
    stamp = int(round(STEPS.end(4) * 1e6)) - 1
    assert got == sorted(bits((((key, step), Delta(value)), stamp))
                         for key, step, value in after.contributions + fresh.contributions)
    assert after.contributions and len(fresh.contributions) == 1


def test_local_runners_use_16_buckets_and_others_256():
    assert bucket_count(beam.Pipeline(options=PipelineOptions([]))) == 16
    assert bucket_count(beam.Pipeline(runner=FnApiRunner())) == 16
    assert bucket_count(beam.Pipeline(runner=BundleBasedDirectRunner())) == 16
    for runner in ("FlinkRunner", "SparkRunner"):
        assert bucket_count(beam.Pipeline(options=PipelineOptions(["--runner", runner]))) == 256
    fn = ByBucket(16)
    fn.setup()
    for unit in range(300):
        assert list(fn.process((unit, None)))[0][0] == bucket_of(unit) % 16


@pytest.mark.parametrize("size", [60.0, 0.0005])
def test_a_halted_units_later_events_are_dead_letters_also_when_closed_together(size):
    """A unit that violates its bound at step 0 halts; its events of step 1 are late dead
    letters whether step 1 closes at a later firing (60 s steps) or at the same one (steps of
    0.5 ms share a whole-ms due time)."""
    steps = TimeSteps(0.0, size, 6)
    problem = TriangleProblem(max_degree=2, max_contribution=4)
    fn = TruncateStreamingFn(problem, steps, False)
    fn.setup()
    cells = Cells()
    assert not list(fn.process((0, None), **cells.bind(fn.process)) or [])
    edges = [(0, (1, 2)), (0, (1, 3)), (0, (1, 4)), (1, (5, 6)), (1, (7, 8))]
    for i, (step, edge) in enumerate(edges):  # node 1's third edge at step 0: a violation
        parsed, _ = problem.parse(("+", edge))
        event = (step, int(round(steps.start(step) * 1e6)) + i, parsed.payload)
        assert not list(fn.process((0, (parsed.unit, event)), **cells.bind(fn.process)) or [])
    out = []
    while cells.timer.time is not None:
        fire = cells.timer.time
        cells.timer.clear()
        out += list(fn.flush(fire=fire, **cells.bind(fn.flush)) or [])
    codes = sorted(item.value["code"] for item in out
                   if isinstance(item, beam.pvalue.TaggedOutput))
    assert codes == ["bound_violation", "late", "late"]


@pytest.mark.parametrize("args,count", [([], 16), (["--runner", "FlinkRunner"], 256)])
def test_the_truncation_steps_name_holds_its_bucket_count(args, count):
    """A job updated in place under another bucket count fails by step name (its units' states
    are keyed by bucket: moved units would start afresh, unseeded buckets never fire)."""
    pipeline = beam.Pipeline(options=PipelineOptions(args + ["--streaming"]))
    events = pipeline | beam.Create([]).with_output_types(KEYED)
    _ = events | "T" >> TruncateStreaming(CountProblem(ContributionBounds(3, 2, 2)),
                                          TimeSteps(0.0, 60.0, 5))
    labels = []

    class Visit(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            labels.append(node.full_label)

    pipeline.visit(Visit())
    assert f"T/Truncate{count}/ParDo(TruncateStreamingFn)" in labels

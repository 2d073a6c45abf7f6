"""The batched entry (`transforms.arrow_input`: Arrow tables -> EventBatches -> AssignSteps)
gives exactly what the element path gives: the same events (unit, step, micros, payload), the
same dead letters (reason and record), and so the same truncated per-(key, step) sums (the
Beam-free `advance_unit` is the reference) and the same records end to end.
"""
from __future__ import annotations

import collections
import glob
import json
import math
import os
import random

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from transforms import ContinualCount, ContinualCountDistinct, ContinualSum, SecretRef
from transforms.arrow_input import (ArrowEvents, AssignBatchStepsFn, EventBatch, beam_micros,
                                    event_batch, is_batched)
from transforms.assign import AssignStepsFn
from transforms.bounded import KeySums
from transforms.messages import StepWindow
from transforms.streams.units import advance_unit, payloads_by_step, run_unit, sorted_payloads
from transforms.steps import TimeSteps
from transforms.streams import ContributionBounds, count_distinct
from transforms.streams.units import CountProblem, EntityProblem, steps_to_run

ORIGIN = 1_700_000_000.0
STEPS = TimeSteps(ORIGIN, 3600.0, 6)
DIVISOR = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


def problems():
    return {
        "count": CountProblem(ContributionBounds(3, 2, 2)),
        "count_one_key": CountProblem(ContributionBounds(5, None, 1)),
        "sum": CountProblem(ContributionBounds(6, 3, 2, max_value=2.5), with_value=True),
        "sum_grid": CountProblem(ContributionBounds(40, None, 3, max_value=30.0),
                                 with_value=True, value_grid=0.3, max_value=9.0),
        "distinct": EntityProblem(count_distinct(3), max_keys_per_unit=2),
    }


SHAPES = {"count": ("unit", "key"), "sum": ("unit", "key", "value"),
          "distinct": ("op", "item", "key")}


def shape_of(name):
    return SHAPES[name.split("_")[0]]


def random_column(role, rng, n, strings):
    """A column of one Arrow type with the rows the fast checks must send elsewhere: nulls,
    empty strings, non-finite and negative values."""
    if role == "value":
        pool = [0.1, 0.7, 1.0, 2.0, 2.4999, 3.7, 1e-17, -1.0, 0.30000000000000004, -0.0,
                float("nan"), float("inf"), None, 12.0]
        return pa.array([rng.choice(pool) for _ in range(n)], type=pa.float64())
    if role == "op":
        return pa.array([rng.choice(["+", "+", "-", "x", None]) for _ in range(n)])
    if strings:
        pool = ["u", "v", "w", "a'b", 'q"x', "", None, "é"]
        return pa.array([rng.choice(pool) for _ in range(n)], type=pa.string())
    pool = [0, 1, 2, 3, 7, -4, 2 ** 40, None]
    return pa.array([rng.choice(pool) for _ in range(n)], type=pa.int64())


def random_table(name, rng, n, unit="us"):
    """(table, time column values): times around the horizon, some outside it, with ties."""
    columns = {}
    for role in shape_of(name):
        columns[role] = random_column(role, rng, n, strings=rng.random() < 0.5)
    span = int((STEPS.horizon + 2) * 3600 * DIVISOR[unit])
    start = int(ORIGIN * DIVISOR[unit]) - int(3600 * DIVISOR[unit])
    times = [start + rng.choice([rng.randrange(span), 0, span // 3, int(3600 * DIVISOR[unit])])
             for _ in range(n)]
    columns["ts"] = pa.array(times, type=pa.int64())
    return pa.table(columns), times


def element_outputs(problem, table, times, unit, window, shape, packed=False):
    """The element path: TimestampedValue(element, ts / units_per_second) per row."""
    fn = AssignStepsFn(problem, STEPS, window, packed=packed)
    fn.start_bundle()
    out = []
    rows = table.to_pylist()
    for row, ts in zip(rows, times):
        element = tuple(row[role] for role in shape)
        stamp = TimestampedValue(element, ts / DIVISOR[unit]).timestamp
        out.extend(fn.process(element, stamp))
    if packed:
        out.extend(fn.finish_bundle())
    return out, fn


def batch_outputs(problem, table, unit, window, shape, packed):
    fn = AssignBatchStepsFn(problem, STEPS, window, packed=packed)
    fn.start_bundle()
    batch = event_batch(table, {r: r for r in shape}, "ts", unit, shape)
    out = list(fn.process(batch))
    out.extend(fn.finish_bundle())
    return out, fn


def split(outputs):
    """(dead letters, Counter of (unit, event)) of a DoFn's outputs (packed or not)."""
    dead, events = [], collections.Counter()
    for out in outputs:
        if isinstance(out, beam.pvalue.TaggedOutput):
            dead.append(json.dumps(out.value, sort_keys=True))
            continue
        value = out.value if hasattr(out, "windows") else out
        unit, body = value
        for event in (body if isinstance(body, list) else [body]):
            events[repr((unit, event))] += 1
    return sorted(dead), events


@pytest.mark.parametrize("name", sorted(problems()))
@pytest.mark.parametrize("seed", range(8))
def test_batched_assignment_equals_the_element_path(name, seed):
    """Same events and dead letters, packed or not, whole horizon or a resumed window, for
    random columns with invalid rows and times in every unit."""
    rng = random.Random(seed * 31 + len(name))
    problem, shape = problems()[name], shape_of(name)
    unit = rng.choice(["s", "ms", "us", "ns"])
    table, times = random_table(name, rng, rng.randrange(1, 300), unit)
    window = rng.choice([StepWindow.whole(STEPS), StepWindow(2, 5)])
    element, element_fn = element_outputs(problem, table, times, unit, window, shape)
    packed_elements, _ = element_outputs(problem, table, times, unit, window, shape, True)
    assert split(packed_elements) == split(element)  # step assignment and packing, fused
    for packed in (False, True):
        batched, batch_fn = batch_outputs(problem, table, unit, window, shape, packed)
        assert split(batched) == split(element)
        assert (batch_fn._released, batch_fn._assigned) == \
            (element_fn._released, element_fn._assigned)


@pytest.mark.parametrize("name", sorted(problems()))
@pytest.mark.parametrize("seed", range(6))
def test_batched_truncated_sums_equal_the_reference(name, seed):
    """Per-(key, step) truncated sums of the packed batched path (the bounded stage's
    `payloads_by_step` + `run_unit` + `KeySums`) equal the reference `advance_unit` over the
    element path's events in `sorted_payloads` order, bit for bit."""
    rng = random.Random(seed * 7 + len(name))
    problem, shape = problems()[name], shape_of(name)
    table, times = random_table(name, rng, rng.randrange(50, 400), "us")
    window = StepWindow.whole(STEPS)
    element, _ = element_outputs(problem, table, times, "us", window, shape)
    batched, _ = batch_outputs(problem, table, "us", window, shape, packed=True)

    def reference_sums(outputs):
        units = collections.defaultdict(list)
        for out in outputs:
            if not isinstance(out, beam.pvalue.TaggedOutput):
                units[out[0]].append(out[1])
        sums = collections.defaultdict(list)
        for unit_id, events in units.items():
            by_step = sorted_payloads(events)
            run = advance_unit(problem, unit_id, problem.init_state(), by_step,
                               steps_to_run(problem, by_step, 0, STEPS.horizon))
            for key, step, value in run.contributions:
                sums[(key, step)].append(value)
        return {k: math.fsum(v) for k, v in sums.items()}

    def batched_sums(outputs):
        packs = collections.defaultdict(list)
        for out in outputs:
            if not isinstance(out, beam.pvalue.TaggedOutput):
                unit_id, events = out.value
                packs[unit_id].extend(events)
        acc = {}
        for unit_id, events in packs.items():
            rng.shuffle(events)  # bundle order never matters
            by_step = payloads_by_step(events, ordered=problem.ordered)
            run = run_unit(problem, unit_id, problem.init_state(), by_step, 0, STEPS.horizon)
            for key, step, value in run.contributions:
                KeySums.add(acc.setdefault(key, KeySums.new()), step, value)
        return {(key, step): total for key, sums in acc.items()
                for step, total in KeySums.totals(sums).items()}

    expected = reference_sums(element)
    got = batched_sums(batched)
    assert {k: v.hex() for k, v in got.items()} == {k: v.hex() for k, v in expected.items()}


def test_beam_micros_is_beams_timestamp():
    rng = np.random.default_rng(5)
    seconds = np.concatenate([rng.uniform(-6e10, 2.5e11, 20000), [-1.0000005, 1.0000005,
                                                                  -3e-7, 1e-7, 0.0]])
    assert beam_micros(seconds).tolist() == [Timestamp(s).micros for s in seconds.tolist()]


def test_timestamp_columns_and_bad_times():
    """Arrow timestamp columns use their own unit; missing or non-finite times are dead
    letters, not crashes."""
    micros = [int(ORIGIN * 1e6) + 5, None, int(ORIGIN * 1e6) + 3_600_000_007]
    table = pa.table({"u": [1, 2, 3], "k": ["a", "b", "c"],
                      "ts": pa.array(micros, type=pa.timestamp("us", tz="UTC"))})
    batch = event_batch(table, {"unit": "u", "key": "k"}, "ts")
    assert batch.micros.tolist() == [int(ORIGIN * 1e6) + 5, int(ORIGIN * 1e6) + 3_600_000_007]
    assert [r for r, _ in batch.dead] == [(2, "b")]
    floats = pa.table({"u": [1, 2], "k": ["a", "b"], "ts": [float("nan"), ORIGIN]})
    batch = event_batch(floats, {"unit": "u", "key": "k"}, "ts", "s")
    assert len(batch) == 1 and batch.dead[0][0] == (1, "a")
    with pytest.raises(ValueError):
        ArrowEvents({"unit": "u"}, timestamp="ts", timestamp_unit="hours")
    missing = event_batch(floats, {"unit": "nope", "key": "k"}, "ts")
    assert len(missing) == 0 and [reason for _, reason in missing.dead] == \
        ["missing field 'nope'"] * 2
    text = pa.table({"u": [1], "k": ["a"], "ts": ["2026-01-01"]})  # not a number: dead
    assert event_batch(text, {"unit": "u", "key": "k"}, "ts").dead == [
        ((1, "a"), "`ts` must be a finite time within Beam's range; got '2026-01-01'")]
    record_batch = pa.RecordBatch.from_pydict({"u": [1], "k": ["a"], "ts": [ORIGIN]})
    assert event_batch(record_batch, {"unit": "u", "key": "k"}, "ts").elements() == [(1, "a")]


# ----- end to end: the same records and dead letters through Beam -----------------------------
def _run(folder, name, build):
    """(records, dead letters, the operator-only diagnostics counters) of one pipeline."""
    p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    result = build(p)
    (result.records | "Rec" >> beam.Map(lambda r: json.dumps(r, sort_keys=True))
     | "WriteRec" >> beam.io.WriteToText(os.path.join(folder, name + "-records")))
    (result.dead_letters | "Dead" >> beam.Map(lambda r: json.dumps(r, sort_keys=True))
     | "WriteDead" >> beam.io.WriteToText(os.path.join(folder, name + "-dead")))
    run = p.run()
    run.wait_until_finish()
    counters = collections.Counter()
    for counter in run.metrics().query()["counters"]:
        if counter.key.metric.namespace == "continual_release":
            counters[counter.key.metric.name] += counter.committed

    def lines(kind):
        return sorted(line for f in glob.glob(os.path.join(folder, f"{name}-{kind}*"))
                      for line in open(f))
    return lines("records"), lines("dead"), +counters


@pytest.mark.parametrize("case", ["count", "sum", "distinct"])
def test_arrow_entry_gives_the_records_of_the_element_entry(tmp_path, case):
    rng = random.Random(len(case))
    table, _ = random_table({"count": "count", "sum": "sum_grid", "distinct": "distinct"}[case],
                            rng, 1500, "us")
    path = str(tmp_path / "events.parquet")
    pq.write_table(table, path, row_group_size=400)
    shape = shape_of(case)
    common = dict(steps=STEPS, epsilon=1.0, secret=SecretRef(seed=3), insecure=True,
                  release_id="ab" * 16, diagnostics=True)
    keys = sorted({k for k in table.column("key").to_pylist() if k not in (None, "")},
                  key=repr)
    keys = keys[1:]  # the first key (in canonical order) is not public: its sums are dropped

    def transform():
        if case == "count":
            return ContinualCount(public_keys=keys, max_contributions=3,
                                  max_contributions_per_step=2, max_keys_per_unit=2, **common)
        if case == "sum":
            return ContinualSum(public_keys=keys, max_value=2.0, max_contributions=4,
                                max_keys_per_unit=2, **common)
        return ContinualCountDistinct(public_keys=keys, max_flips=3, max_keys_per_unit=2,
                                      **common)

    def by_elements(p):
        return (p | beam.io.ReadFromParquet(path)
                | beam.Map(lambda r: TimestampedValue(tuple(r[x] for x in shape), r["ts"] / 1e6))
                | transform())

    def by_batches(p):
        batches = (p | beam.io.ReadFromParquetBatched(path)
                   | ArrowEvents({r: r for r in shape}, timestamp="ts", timestamp_unit="us"))
        assert is_batched(batches)
        return batches | transform()

    records, dead, counters = _run(str(tmp_path), "elements", by_elements)
    assert len(records) == len(keys) * STEPS.horizon and dead
    assert counters["events_in_window"] and counters["dropped_non_public_keys"]
    assert any(name.startswith("truncated_by_") for name in counters)
    assert _run(str(tmp_path), "batches", by_batches) == (records, dead, counters)


def test_event_batch_elements_and_take():
    table = pa.table({"op": ["+", "-"], "a": [1, 2], "b": [3, 4], "ts": [1.0, 2.0]})
    batch = event_batch(table, {"op": "op", "a": "a", "b": "b"}, "ts", "s",
                        shape=("op", ("a", "b")))
    assert batch.elements() == [("+", (1, 3)), ("-", (2, 4))]
    assert batch.take(np.array([1])).elements() == [("-", (2, 4))]
    assert isinstance(batch, EventBatch) and len(batch) == 2


def test_count_parse_fast_path_equals_the_full_checks():
    """`CountProblem.parse`'s shortcut for plain ids gives what its full checks give."""
    class Text(str):
        pass
    values = [0, 1, -5, 2 ** 70, True, False, "", "a", Text("b"), Text(""), 1.0, None, (1,),
              ("g", 1), ()]
    for problem in (CountProblem(ContributionBounds(3, 2, 2)),
                    CountProblem(ContributionBounds(3, 2, 2, max_value=2.0), with_value=True)):
        for unit in values:
            for key in values:
                for element in ((unit, key), [unit, key], (unit, key, 1.5), (unit,)):
                    assert problem.parse(element) == problem._parse(element), element

"""Private key selection in the transforms (`public_keys` left out; docs/selection.md): batch,
streaming and resumed runs select the same keys; a selected key's records are the public-key
release of its stream from its selection step on; keys start only from kept contributions;
the descriptor names the rule, never the keys.

Fixed seeds throughout. The pipeline tests compare runs of the same noise (deterministic: they
fail only when the code changes); `test_a_key_of_one_unit_is_not_published` holds with
probability >= 1 - 1e-6 over the seed (it is the guarantee itself), and holds for seed 11.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import pickle

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream as BeamTestStream
from apache_beam.transforms.window import TimestampedValue

from tests.support.beam import AppendJson, read_json_lines, run
from transforms import ContinualCount, ContinualCountDistinct, ContinualSum, TimeSteps
from transforms.statistics import ContinualDegreeCount
from transforms.mean import ContinualMean
from transforms.mechanisms import selection
from transforms.messages import StepWindow
from transforms.release import RecordMaker
from transforms.selecting import bucket_of
from transforms.validation import ValidationError

STEPS = TimeSteps(0, 10, 8)
logging.getLogger("transforms").setLevel(logging.ERROR)  # fixed-seed warnings


def events(rng):
    """A key all units share ("big", 60 units from step 0), one whose data start at step 3
    ("later", 40 units), and one of a single unit ("own", one contribution)."""
    out = [((f"u{u}", "big"), round(float(rng.uniform(0, 80)), 2)) for u in range(60)]
    out += [((f"v{u}", "later"), round(float(rng.uniform(30, 80)), 2)) for u in range(40)]
    out.append((("w", "own"), 55.0))
    return out


def count(**kwargs):
    args = dict(steps=STEPS, epsilon=1.0, selection_delta=1e-2, seed=3, insecure=True,
                max_contributions=1, release_id="ab" * 16, allow_large_delta=True)
    args.update(kwargs)
    return ContinualCount(**args)


def by_key(records):
    out = {}
    for r in records:
        out.setdefault(r["key"], []).append(r)
    return out


def test_batch_and_streaming_select_the_same_keys_and_records():
    """Every published key has every step from its selection step on, never before its first
    data; unbounded input (`transforms.selecting`) gives the batch records."""
    records, dead = run(count(), events(np.random.default_rng(1)))
    streamed, streamed_dead = run(count(), events(np.random.default_rng(1)),
                                  mode="streaming", steps=STEPS)
    assert dead == streamed_dead == [] and records == streamed
    keys = by_key(records)
    assert set(keys) == {"big", "later"}
    for rows in keys.values():  # from the selection step on, every step, in order
        first = rows[0]["step"]
        assert [r["step"] for r in rows] == list(range(first, STEPS.horizon))
    assert keys["later"][0]["step"] >= 3  # nothing before its data


def late_stream(with_u: bool, delay: int = 1):
    """The first adversarial review's attack, on unbounded input: u's one event on key "j" at
    step 5; after step 6 is released, 100 other units' events at step 3 (late)."""
    stream = BeamTestStream().add_elements(
        [TimestampedValue((f"b{i}", "big"), 5.0) for i in range(200)])
    for step in range(STEPS.horizon):
        if step == 5 and with_u:
            stream = stream.add_elements([TimestampedValue(("u", "j"), 55.0)])
        stream = stream.advance_watermark_to(STEPS.end(step))
        if step == 6:
            stream = stream.add_elements(
                [TimestampedValue((f"v{i}", "j"), 35.0) for i in range(100)])
    return stream.advance_watermark_to_infinity()


def test_late_data_is_late_for_a_new_key_as_for_a_started_one(tmp_path):
    """Whether other units' late data counts must not depend on whether u started the key
    (a per-key progress would start at the key's first data: u would decide it). The bucket's
    progress is seeded at the origin: the 100 late events are dead letters with or without
    u, and key "j" stays unpublished both ways."""
    options = PipelineOptions([])
    options.view_as(StandardOptions).streaming = True
    for with_u in (False, True):
        paths = {name: tmp_path / f"{name}-{with_u}" for name in ("records", "dead")}
        with beam.Pipeline(options=options) as pipeline:
            result = pipeline | late_stream(with_u) | count(selection_delta=1e-6, seed=7)
            result.records | "R" >> beam.ParDo(Collect(paths["records"]))
            result.dead_letters | "D" >> beam.ParDo(Collect(paths["dead"]))
        records = collected(paths["records"]) if paths["records"].exists() else []
        dead = collected(paths["dead"])
        assert {r["key"] for r in records} == {"big"}
        assert sum(1 for d in dead if d["code"] == "late") == 100


def test_buckets_are_a_stable_function_of_the_typed_key():
    """No Python `hash` (salted per process): the bucket of a key is the same on every worker
    and in every run."""
    assert [bucket_of(k, 7) for k in ("a", "b", 5, "5")] == [
        int.from_bytes(hashlib.sha256(f"{type(k).__name__}:{k!r}".encode()).digest()[:8],
                       "big") % 7 for k in ("a", "b", 5, "5")]


def test_keys_of_another_type_are_never_released():
    """key_type "str" (the default): an int key is dropped with a dead letter whatever its
    data (5 and "5" would be two keys published as "5"); key_type "int" keeps ints only."""
    data = [((f"u{u}", key), 5.0) for u in range(300) for key in ("5", 5)]
    both = dict(selection_delta=1e-6, max_keys_per_unit=2, max_contributions=2)
    for key_type, other in (("str", "int 5"), ("int", "str '5'")):
        records, dead = run(count(key_type=key_type, **both), data)
        assert {r["key"] for r in records} == {"5"} and len(records) == STEPS.horizon
        assert len(dead) == 1 and dead[0]["code"] == "invalid_record"
        assert dead[0]["reason"].startswith(f"key of type {other} is not")
    with pytest.raises(ValidationError, match=r"^`key_type` must be one of 'str', 'int'"):
        count(key_type="float")
    with pytest.raises(ValidationError, match=r"^`key_type` must be None when public_keys"):
        count(public_keys=["a"], selection_delta=None, key_type="str")


def test_a_selected_key_is_its_public_key_release_from_its_selection_step():
    """The selecting release against a public-key release run with the same noise binding
    (release id and descriptor digest): equal records from the selection step on, including
    the step value of the first published step (the previous release, unpublished)."""
    rng_events = events(np.random.default_rng(1))
    selecting = count()
    records, _ = run(selecting, rng_events)
    public = count(public_keys=["big", "later", "own"], selection_delta=None)
    public.config = dataclasses.replace(
        public.config, release_id=selecting.config.release_id,
        descriptor_digest=selecting.config.descriptor_digest)
    reference, _ = run(public, rng_events)
    same = lambda rows: [{k: v for k, v in r.items() if k != "delta"}  # noqa: E731
                         for r in rows]  # the records state the selection's delta too
    mine, theirs = by_key(same(records)), by_key(same(reference))
    for key, rows in mine.items():
        first = rows[0]["step"]
        assert rows == [r for r in theirs[key] if r["step"] >= first]
        # the selection step is the first step from the key's data at or above tau
        tau = selecting.selection["threshold"]
        before = [r["value"] for r in theirs[key] if r["step"] < first]
        start = 3 if key == "later" else 0
        assert all(v < tau for v in before[start:]) and rows[0]["value"] >= tau


def test_a_key_of_one_unit_is_not_published():
    """One unit's key with the maximal contribution, at delta = 1e-6: not published (the
    event has probability <= 1e-6, the selection's guarantee)."""
    records, _ = run(count(selection_delta=1e-6, seed=11),
                     [(("w", "own"), 5.0)] + [((f"u{u}", "big"), 5.0) for u in range(400)])
    assert {r["key"] for r in records} == {"big"}


def test_keys_start_only_from_kept_contributions():
    """A unit that touches five keys with max_keys_per_unit = 1 creates one key state (the
    others' contributions are cut before any key exists), and out-of-horizon or malformed
    events create none."""
    transform = count(max_keys_per_unit=1, selection_delta=1e-6)
    folder_states = []
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        elements = [(("u", f"k{i}"), 1.0 + i) for i in range(5)]
        elements += [(("v", "outside"), 500.0)]
        result = (pipeline | beam.Create(elements)
                  | beam.MapTuple(lambda e, t: TimestampedValue(e, t)) | transform)
        path = f"/tmp/selection-states-{id(folder_states)}.jsonl"
        result.key_states | beam.Map(lambda kv: kv[0]) | beam.ParDo(AppendJson(path))
    assert read_json_lines(path) == ["k0"]


class Collect(beam.DoFn):
    """Appends each element to `path`, pickled (key states hold bytes)."""

    def __init__(self, path):
        self.path = str(path)

    def process(self, element):
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(pickle.dumps(element).hex() + "\n")


def collected(path):
    with open(path, encoding="utf-8") as handle:
        return [pickle.loads(bytes.fromhex(line)) for line in handle]


def test_a_resumed_release_keeps_its_selections(tmp_path):
    """Two windows (0-4, 4-8) with the key states of the first equal one run of all steps:
    a key selected in the first window stays selected, a key first seen in the second starts
    from its stream's state at step 4."""
    rng_events = events(np.random.default_rng(1))
    whole, _ = run(count(), rng_events)
    paths = {name: tmp_path / name for name in ("first", "states", "units", "second")}
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        stream = (pipeline | beam.Create(rng_events)
                  | beam.MapTuple(lambda e, t: TimestampedValue(e, t)))
        first = stream | "First" >> count().resume(StepWindow(0, 4))
        first.records | "R" >> beam.ParDo(Collect(paths["first"]))
        first.key_states | "K" >> beam.ParDo(Collect(paths["states"]))
        first.unit_states | "U" >> beam.ParDo(Collect(paths["units"]))
    states = collected(paths["states"])
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        stream = (pipeline | "Events" >> beam.Create(rng_events)
                  | beam.MapTuple(lambda e, t: TimestampedValue(e, t)))
        unit_states = pipeline | "Units" >> beam.Create(collected(paths["units"]))
        key_states = pipeline | "Keys" >> beam.Create(states)
        second = stream | count().resume(StepWindow(4, 8), unit_states, key_states)
        second.records | "R" >> beam.ParDo(Collect(paths["second"]))
    both = sorted(collected(paths["first"]) + collected(paths["second"]),
                  key=lambda r: (r["key"], r["step"]))
    assert [r["key"] for r in both] and both == whole
    assert {len(s[1]) for s in states} == {4}  # (sealed, halt, first data step, selection)
    assert sorted(s[0] for s in states) == ["big", "later"]  # "own" starts at step 5


def test_the_descriptor_names_the_rule_never_the_keys():
    transform = count(selection_delta=1e-3)
    rule = transform.descriptor["selection"]
    assert transform.descriptor["public_keys"] is None
    maker = RecordMaker(transform.config)
    tau = selection.selection_threshold(maker.mechanism, 1, 1, 1e-3)
    assert rule == {"threshold": tau, "delta": 1e-3, "max_keys_per_unit": 1,
                    "contribution_bound": 1, "key_type": "str",
                    "delta_spent": selection.selection_delta(maker.mechanism, tau, 1, 1)}
    assert transform.config.selection_threshold == tau
    assert transform.budget_spent == {"epsilon": 1.0, "delta": 1e-3}
    assert transform.display_data()["public_keys"] == "selected"


def test_the_threshold_is_in_release_units_of_each_transform():
    """K is the declaration's interval bound: k for counts, the mass in grid units for sums,
    1 (an item's presence) for distinct counts; a larger K never lowers tau."""
    total = ContinualSum(steps=STEPS, epsilon=1.0, selection_delta=1e-3, seed=1,
                         insecure=True, max_value=5.0, max_contributions=20)
    assert total.descriptor["selection"]["contribution_bound"] == 400  # 20 / g, g = 0.05
    distinct = ContinualCountDistinct(steps=STEPS, epsilon=1.0, selection_delta=1e-3, seed=1,
                                      insecure=True, max_flips=4)
    assert distinct.descriptor["selection"]["contribution_bound"] == 1
    low = count(max_contributions=1).selection["threshold"]
    high = count(max_contributions=4).selection["threshold"]
    assert high > low


def test_the_delta_split_of_epsilon_delta_and_zcdp_budgets():
    """(epsilon, delta): half of delta selects by default, the rest converts the key budget;
    a given selection_delta takes its part; under rho, delta is the selection's."""
    split = count(epsilon=1.0, delta=1e-5, selection_delta=None)
    assert split.selection["delta"] == 5e-6 and split.budget.delta == 5e-6
    assert split.budget_spent["delta"] == 1e-5
    given = count(epsilon=1.0, delta=1e-5, selection_delta=2e-6)
    assert given.selection["delta"] == 2e-6 and given.budget.delta == pytest.approx(8e-6)
    zcdp = count(epsilon=None, rho=0.5, delta=1e-6, selection_delta=None)
    assert zcdp.selection["delta"] == 1e-6 and zcdp.budget_spent == {"rho": 0.5,
                                                                    "delta": 1e-6}


@pytest.mark.parametrize("kwargs,message", [
    ({"selection_delta": None}, r"^`selection_delta` must be given when public_keys are not"),
    ({"selection_delta": 1e-3, "public_keys": ["a"]},
     r"^`selection_delta` must be None when public_keys are given"),
    ({"epsilon": 1.0, "delta": 1e-6, "selection_delta": 1e-6},
     r"^`selection_delta` must be below delta"),
    ({"epsilon": None, "rho": 0.5, "selection_delta": None},
     r"^`delta` must be given with `rho` when public_keys are not"),
    ({"checkpoint": "/tmp/x"}, r"^`checkpoint` must be None for a release that selects"),
])
def test_selection_arguments_are_refused_with_the_projects_message(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        count(**kwargs)


@pytest.mark.parametrize("make", [
    lambda: ContinualDegreeCount(steps=STEPS, epsilon=1.0, seed=1, insecure=True,
                                 max_updates=2),
    lambda: ContinualMean(steps=STEPS, epsilon=1.0, seed=1, insecure=True, max_value=5.0),
])
def test_transforms_that_do_not_select_keys_require_them(make):
    with pytest.raises(ValidationError, match=r"^`public_keys` must be a non-empty list of "
                                              r"ids for Continual"):
        make()


@pytest.mark.parametrize("make,events_of", [
    (lambda: ContinualSum(steps=STEPS, epsilon=1.0, selection_delta=1e-2, seed=5,
                          allow_large_delta=True,
                          insecure=True, max_value=5.0, max_contributions=10,
                          release_id="ab" * 16),
     lambda rng: [((f"u{u}", "k" + str(u % 3), float(rng.uniform(0, 5))),
                   round(float(rng.uniform(0, 80)), 2)) for u in range(150)]),
    (lambda: ContinualCountDistinct(steps=STEPS, epsilon=1.0, selection_delta=1e-2, seed=5,
                                    allow_large_delta=True,
                                    insecure=True, max_flips=4, release_id="ab" * 16),
     lambda rng: [(("+", f"item{i}", "s" + str(i % 2)), round(float(rng.uniform(0, 80)), 2))
                  for i in range(120)]),
])
def test_sums_and_distinct_counts_select_alike_in_batch_and_streaming(make, events_of):
    data = events_of(np.random.default_rng(2))
    records, _ = run(make(), data)
    streamed, _ = run(make(), data, mode="streaming", steps=STEPS)
    assert records and records == streamed


def test_unbounded_input_needs_a_release_delay():
    """At release_delay_steps = 0 a step is due at its end, when its totals leave the
    truncation: every total would be late (nothing counted, public keys or selected)."""
    for kwargs in ({}, {"public_keys": ["big"], "selection_delta": None}):
        with pytest.raises(Exception, match=r"`release_delay_steps` must be an integer >= 1 on "
                                            r"unbounded input"):
            run(count(release_delay_steps=0, **kwargs), events(np.random.default_rng(1)),
                mode="streaming", steps=STEPS)

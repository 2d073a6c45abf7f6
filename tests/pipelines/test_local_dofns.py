"""The local streaming runner keeps the project's DoFns between bundles
(pipelines/local_dofns.py): one copy set up once, the same outputs."""
from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to

from pipelines import io, local_dofns

CALLS = {"setup": 0, "start_bundle": 0}


def _count(name):
    def counted(self):
        CALLS[name] += 1
    return counted


def _run(monkeypatch, lines):
    for name in CALLS:
        CALLS[name] = 0
        monkeypatch.setattr(io.ParseJson, name, _count(name), raising=False)
    stream = TestStream()
    for first in range(0, len(lines), 20):  # one bundle of input per batch, at least
        stream = stream.add_elements(lines[first:first + 20]).advance_watermark_to(first + 20)
    options = PipelineOptions(["--runner=BundleBasedDirectRunner", "--streaming"])
    with beam.Pipeline(options=options) as pipeline:
        rows = (pipeline | stream.advance_watermark_to_infinity()
                | beam.ParDo(io.ParseJson()).with_outputs("dead_letters", main="rows"))
        assert_that(rows.rows | beam.Map(lambda row: row["i"]),
                    equal_to(list(range(len(lines)))))
    return dict(CALLS)


def test_a_project_dofn_is_set_up_once_for_all_its_bundles(monkeypatch):
    lines = [json.dumps({"i": i}).encode() for i in range(200)]
    local_dofns.install()
    calls = _run(monkeypatch, lines)
    assert calls["start_bundle"] > 1, calls  # several bundles, so the test can fail
    assert calls["setup"] == 1, calls


def test_without_it_the_runner_sets_a_dofn_up_at_every_bundle(monkeypatch):
    """The cost the module removes (checked on a fresh runner module state): the same
    pipeline sets ParseJson up once per bundle when its DoFns are not kept."""
    from apache_beam.internal import pickler
    from apache_beam.runners import common
    from apache_beam.runners.direct import transform_evaluator as te
    if getattr(te, "_dp_kept_dofns", False):
        monkeypatch.setattr(te, "pickler", pickler)
        monkeypatch.setattr(common, "DoFnSignature", common.DoFnSignature(
            beam.DoFn()).__class__)
    lines = [json.dumps({"i": i}).encode() for i in range(200)]
    calls = _run(monkeypatch, lines)
    assert calls["setup"] == calls["start_bundle"] > 1, calls



def test_a_project_dofns_state_and_timer_specs_are_beams():
    """The specs found once per class are those Beam finds for the DoFn (the release's state
    cell and its two timers)."""
    from apache_beam.transforms import userstate

    from transforms.streaming import ReleaseStreamingFn
    local_dofns.install()
    fn = ReleaseStreamingFn.__new__(ReleaseStreamingFn)
    found = userstate.get_dofn_specs(fn)
    assert {s.name for s in found[0]} == {"release_state"}
    assert {t.name for t in found[1]} == {"ts-release", "ts-retry"}
    assert userstate.get_dofn_specs(fn) == found and userstate.get_dofn_specs(fn)[0] is not \
        found[0]


def _dofns(pipeline) -> list:
    found = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            if isinstance(node.transform, beam.ParDo):
                found.append(node.transform.fn)

    pipeline.visit(Visitor())
    return found


def test_remembered_specs_are_beams_for_every_dofn_of_the_bundled_jobs():
    """`remember_specs` answers as Beam does for every DoFn of three bundled batch jobs (a
    count distinct, a graph statistic, a mean: the project's DoFns, Beam's own, Maps of
    lambdas), at every call; stateful ones among them."""
    from apache_beam.transforms import userstate

    from pipelines import config as job_config, run
    local_dofns.remember_specs()
    remembered, beams = userstate.get_dofn_specs, userstate.get_dofn_specs.beams
    stateful = 0
    for name in ("active_users", "friend_triangles", "mean_seconds"):
        pipeline = beam.Pipeline()
        run.build(pipeline, job_config.load(f"demo:{name}").replace(
            secret=job_config.SecretSpec(seed=7, insecure=True)))
        dofns = _dofns(pipeline)
        assert len(dofns) > 10, name
        for fn in dofns:
            expected = beams(fn)
            assert remembered(fn) == expected and remembered(fn) == expected, (name, fn)
            stateful += bool(expected[0] or expected[1])
    assert stateful >= 1  # (the batch jobs group by key: few stateful DoFns)


class _Stateful(beam.DoFn):
    BAG = beam.transforms.userstate.BagStateSpec("bag", beam.coders.VarIntCoder())

    def process(self, element, bag=beam.DoFn.StateParam(BAG)):
        yield element


def test_a_dofn_given_methods_of_its_own_after_a_lookup_is_looked_up_again():
    """Beam inspects a DoFn's own bound methods too: one given a stateful method after its
    first lookup (a project DoFn or another) answers as Beam does, not as remembered."""
    from apache_beam.transforms import userstate

    from transforms.mean import JoinMeansFn
    local_dofns.remember_specs()
    remembered, beams = userstate.get_dofn_specs, userstate.get_dofn_specs.beams
    for fn in (JoinMeansFn.__new__(JoinMeansFn), beam.DoFn()):
        first = remembered(fn)
        fn.extra = _Stateful().process
        assert remembered(fn) == beams(fn) != first

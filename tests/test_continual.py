"""The Beam plugin end to end on the local runners."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms.window import TimestampedValue

from tests.support.beam import run
from tests.support.noise import ZERO
from transforms import (ContinualCount, ContinualCountDistinct, ContinualDegreeCount,
                        ContinualRelease, ContinualSum, ContinualTriangleCount, SecretRef,
                        TimeSteps)
from transforms.streams import (ContributionBounds, count_distinct_streams, count_streams,
                                degree_streams, triangle_streams)

ORIGIN = 1_700_000_000.0
STEPS = TimeSteps(ORIGIN, 60.0, 6)


def timestamp(rng, step):
    return ORIGIN + step * 60.0 + float(rng.integers(0, 59_000)) / 1000.0


def released_totals(records):
    """Per key, the released values by step. Rounded to 1e-9: with zero noise the discrete
    square root (auto's choice under rho) releases g L~ round(R~ x / g), equal to the running
    total up to float rounding of the post-processing (its exactness is tested elsewhere)."""
    out = {}
    for record in records:
        out.setdefault(record["key"], [None] * STEPS.horizon)[record["step"]] = round(
            record["value"], 9) + 0.0
    return out


def random_count_events(rng, n=120):
    events = []
    for _ in range(n):
        step = int(rng.integers(0, STEPS.horizon))
        events.append(((f"u{rng.integers(8)}", ["eu", "us", "asia"][rng.integers(3)]),
                       timestamp(rng, step)))
    return events


def test_zero_noise_count_equals_reference_and_every_public_key_gets_every_step():
    rng = np.random.default_rng(1)
    events = random_count_events(rng)
    transform = ContinualCount(steps=STEPS, public_keys=["eu", "us", "latam"], rho=0.5,
                               max_contributions=3, max_contributions_per_step=2,
                               max_keys_per_unit=2, **ZERO)
    records, dead = run(transform, events)
    assert len(records) == 3 * STEPS.horizon and not dead
    expected = count_streams([(STEPS.step_of(ts), unit, key) for (unit, key), ts in events],
                             STEPS.horizon, ContributionBounds(3, 2, 2))
    totals = released_totals(records)
    for key in ("eu", "us", "latam"):
        assert totals[key] == np.cumsum(expected.stream(key)).tolist()
    assert totals["latam"] == [0.0] * STEPS.horizon
    record = records[0]
    from transforms.sinks import COLUMNS
    assert set(record) == set(COLUMNS) and COLUMNS == [
        "key", "step", "window_start", "window_end", "value", "stddev", "ci_low", "ci_high",
        "step_value", "step_stddev", "step_ci_low", "step_ci_high", "confidence", "mechanism",
        "mechanism_params", "epsilon", "delta", "rho", "release_id", "private", "noise"]
    for key in ("eu", "us", "latam"):  # zero noise: the step's own value is the step's total
        mine = sorted((r for r in records if r["key"] == key), key=lambda r: r["step"])
        assert [r["step_value"] for r in mine] == pytest.approx(expected.stream(key), abs=1e-9)
    assert record["noise"] == "discrete_gaussian" and record["private"] is False
    assert record["mechanism"] == "sqrt_toeplitz"  # zCDP: the discrete square root
    assert record["rho"] == 0.5 and record["confidence"] == 0.95


def test_zero_noise_sum_count_distinct_degree_triangle_and_release_equal_references():
    rng = np.random.default_rng(2)
    # sums
    sum_events = [((f"u{rng.integers(5)}", "k", float(rng.uniform(-1, 5))),
                   timestamp(rng, int(rng.integers(0, 6)))) for _ in range(60)]
    records, _ = run(ContinualSum(steps=STEPS, public_keys=["k"], epsilon=1.0, max_value=2.0,
                                  max_contributions=4, **ZERO,
                                  noise="float"), sum_events)
    expected = count_streams([(STEPS.step_of(ts), u, k, v) for (u, k, v), ts in sum_events],
                             STEPS.horizon, ContributionBounds(4, None, 1, max_value=2.0))
    np.testing.assert_allclose(released_totals(records)["k"], np.cumsum(expected.stream("k")))
    # count distinct (count semantics: order inside a step does not matter)
    distinct_events = [((["+", "-"][int(rng.random() < 0.4)], f"i{rng.integers(6)}",
                         ["a", "b"][rng.integers(2)]), timestamp(rng, int(rng.integers(0, 6))))
                       for _ in range(80)]
    records, _ = run(ContinualCountDistinct(steps=STEPS, public_keys=["a", "b"], rho=1.0,
                                            max_flips=2, max_keys_per_unit=2,
                                            **ZERO), distinct_events)
    expected = count_distinct_streams(
        [(STEPS.step_of(ts), op, item, key) for (op, item, key), ts in distinct_events],
        STEPS.horizon, 2, max_keys_per_unit=2)
    for key in ("a", "b"):
        assert released_totals(records)[key] == np.cumsum(expected.stream(key)).tolist()
    # degrees and triangles: distinct timestamps, reference fed in event-time order
    edge_events = []
    for _ in range(50):
        a, b = rng.choice(5, 2, replace=False)
        edge_events.append(((["+", "-"][int(rng.random() < 0.3)], (int(a), int(b))),
                            timestamp(rng, int(rng.integers(0, 6)))))
    ordered = sorted(edge_events, key=lambda e: e[1])
    records, _ = run(ContinualDegreeCount(steps=STEPS, public_keys=list(range(5)), rho=1.0,
                                          max_updates=3, **ZERO), edge_events)
    expected = degree_streams([(STEPS.step_of(ts), op, edge) for (op, edge), ts in ordered],
                              STEPS.horizon, 3)
    for node in range(5):
        assert released_totals(records)[repr(node)] == np.cumsum(expected.stream(node)).tolist()
    records, _ = run(ContinualTriangleCount(steps=STEPS, rho=1.0, max_degree=5,
                                            max_contribution=100, **ZERO),
                     edge_events)
    expected = triangle_streams([(STEPS.step_of(ts), op, edge) for (op, edge), ts in ordered],
                                STEPS.horizon, 5, 100)
    assert released_totals(records)["triangles"] == np.cumsum(expected.stream(None)).tolist()
    # generic release of declared difference values
    values = [(("k", float(rng.integers(-2, 3))), timestamp(rng, s)) for s in range(6)]
    records, _ = run(ContinualRelease(steps=STEPS, public_keys=["k"], epsilon=1.0,
                                      max_contributions=2, interval_bound=2,
                                      **ZERO), values)
    assert released_totals(records)["k"] == np.cumsum([v for (_, v), _ in values]).tolist()


RELEASE = "0123456789abcdef0123456789abcdef"  # one release run several ways: the same noise


def noisy_count():
    return ContinualCount(steps=STEPS, public_keys=["eu", "us", "latam"], epsilon=1.0,
                          max_contributions=2, mechanism="kary_subtraction",
                          mechanism_params={"k": 3}, secret=SecretRef(literal=b"test-secret"), insecure=True,
                          release_id=RELEASE)


def test_batch_streaming_and_multiprocess_give_identical_records():
    events = random_count_events(np.random.default_rng(3), n=60)
    batch, _ = run(noisy_count(), events)
    streaming, _ = run(noisy_count(), events, mode="streaming", steps=STEPS)
    multi, _ = run(noisy_count(), events, mode="multi_processing")
    assert len(batch) == 3 * STEPS.horizon
    assert batch == streaming == multi
    assert len({r["value"] for r in batch}) > 6  # real noise, not zeros


def test_bundle_failing_on_its_first_attempt_does_not_change_records(tmp_path, monkeypatch):
    """The streaming direct runner retries a failed bundle (up to 4 attempts). The release
    timer fails once mid-way, after writing its state; the retried bundle must emit exactly
    the records of an undisturbed run (same secret -> same noise, no state leaked)."""
    events = random_count_events(np.random.default_rng(4), n=40)
    undisturbed, _ = run(noisy_count(), events)
    from transforms.release import RecordMaker
    flag = tmp_path / "failed-once"
    original = RecordMaker.record

    def flaky(self, key, step, value, previous):
        if step == 3 and not flag.exists():
            flag.write_text("x")
            raise RuntimeError("injected failure on the first attempt")
        return original(self, key, step, value, previous)

    monkeypatch.setattr(RecordMaker, "record", flaky)
    retried, _ = run(noisy_count(), events, mode="streaming", steps=STEPS)
    assert flag.exists()  # the failure did happen
    assert retried == undisturbed
    rerun, _ = run(noisy_count(), events)  # a restarted job re-derives the same noise
    assert rerun == undisturbed


def test_out_of_horizon_bad_and_late_events_go_to_dead_letters():
    events = [(("u1", "eu"), ORIGIN - 1), (("u1", "eu"), STEPS.stop + 5), (("u1",), ORIGIN + 1),
              ((None, "eu"), ORIGIN + 1), (("u1", "eu"), ORIGIN + 2)]
    records, dead = run(noisy_count(), events)
    reasons = [d["reason"] for d in dead]
    assert sum("outside the horizon" in r for r in reasons) == 2
    assert "record must be (unit, key)" in reasons
    assert "unit id must be a non-empty str or int" in reasons
    assert len(records) == 3 * STEPS.horizon


def test_late_event_in_streaming_goes_to_dead_letters():
    """An element whose step was already processed arrives after the watermark passed it."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms.window import TimestampedValue
    import apache_beam as beam
    import tempfile
    from tests.support.beam import AppendJson, read_json_lines
    folder = tempfile.mkdtemp()
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    stream = (TestStream()
              .add_elements([TimestampedValue(("u1", "eu"), ORIGIN + 1)])
              .advance_watermark_to(STEPS.end(2))
              .add_elements([TimestampedValue(("u1", "eu"), ORIGIN + 2)])
              .advance_watermark_to(STEPS.end(STEPS.horizon + 2))
              .advance_watermark_to_infinity())
    with beam.Pipeline(options=options) as pipeline:
        result = pipeline | stream | noisy_count()
        result.records | "r" >> beam.ParDo(AppendJson(os.path.join(folder, "r.jsonl")))
        result.dead_letters | "d" >> beam.ParDo(AppendJson(os.path.join(folder, "d.jsonl")))
    dead = read_json_lines(os.path.join(folder, "d.jsonl"))
    assert any("late" in d["reason"] for d in dead)
    assert len(read_json_lines(os.path.join(folder, "r.jsonl"))) == 3 * STEPS.horizon


def test_triangle_violation_halts_release_and_reports_it():
    star = [(("+", (0, 1)), ORIGIN + 1), (("+", (0, 2)), ORIGIN + 2),
            (("+", (0, 3)), ORIGIN + 61), (("+", (1, 2)), ORIGIN + 121)]
    records, dead = run(ContinualTriangleCount(steps=STEPS, rho=1.0, max_degree=2,
                                               max_contribution=5, **ZERO),
                        star)
    assert [r["step"] for r in records] == [0]
    assert any("`max_degree` must bound every node's degree" in d["reason"] for d in dead)


@pytest.mark.parametrize("kwargs,message", [
    ({"public_keys": []}, r"^`public_keys` must be a non-empty list"),
    ({"public_keys": ["a", "a"]}, r"^`public_keys` must be free of duplicates"),
    ({"epsilon": -1.0}, r"^`epsilon` must be a positive finite number; got -1\.0\.$"),
    ({"mechanism": "magic"}, r"^`mechanism` must be one of 'auto', 'binary_tree'"),
    ({"confidence": 1.0}, r"^`confidence` must be a number in \(0, 1\); got 1\.0\.$"),
    ({"seed": 3}, r"^`secret` must be given once, as SecretRef\(env="),
    ({"noise_source": None}, r"^`secret` must be given once, as SecretRef\(env=\"DP_SECRET\"\)"),
    ({"seed": 3, "noise_source": None, "insecure": False},
     r"^`secret` must be a secret from `env`, `path` or `gcp_secret` \(a fixed `seed` is public"),
    ({"secret": SecretRef(seed=3), "noise_source": None, "insecure": False},
     r"^`secret` must be a secret"),
    ({"secret": SecretRef(literal=b"in the graph"), "noise_source": None, "insecure": False},
     r"^`secret` must be a secret from `env`, `path` or `gcp_secret` .*; got 'literal'\.$"),
    ({"noise": "exact"}, r"^`noise` must be one of 'discrete', 'float'; got 'exact'\.$"),
    ({"mechanism": "sqrt_toeplitz"}, r"^`noise` must be 'float' for sqrt_toeplitz"),
    ({"release_id": "xyz"}, r"^`release_id` must be 32 lowercase hex digits"),
    ({"max_contributions": 0}, r"^`max_contributions` must be an integer >= 1; got 0\.$"),
    ({"mechanism": "kary_tree", "mechanism_params": {"b": 2}}, r"^`params` must be among"),
    ({"steps": "hourly"}, r"^`steps` must be a TimeSteps"),
])
def test_construction_errors(kwargs, message):
    base = dict(steps=STEPS, public_keys=["a"], epsilon=1.0, **ZERO)
    base.update(kwargs)
    with pytest.raises(ValueError, match=message):
        ContinualCount(**base)


def test_keys_that_print_alike_are_refused_and_never_share_noise():
    """5 and "5" would be indistinguishable in records; shared noise would also reveal the
    exact difference of their true values. Construction fails closed; noise streams differ."""
    from transforms.release import noise_stream
    with pytest.raises(ValueError, match=r"^`public_keys` must be distinct when written as "
                                         r"text"):
        ContinualCount(steps=STEPS, public_keys=[5, "5"], rho=1.0, **ZERO)
    assert noise_stream(5) != noise_stream("5")


def test_display_data_shows_privacy_and_mechanism():
    data = noisy_count().display_data()
    assert data["epsilon"] == 1.0 and data["mechanism"] == "kary_subtraction"
    assert data["horizon"] == 6 and "literal" in data["secret"]
    assert data["release_id"] == RELEASE and data["noise"] == "discrete_laplace"
    assert data["private"] is False  # literal bytes travel in the pickled graph: not private
    auto = ContinualCount(steps=STEPS, public_keys=["a"], rho=0.5, max_contributions=2,
                          **ZERO)
    assert auto.display_data()["mechanism"] == "sqrt_toeplitz"  # discrete, zCDP
    auto_float = ContinualCount(steps=STEPS, public_keys=["a"], rho=0.5, max_contributions=2,
                                **ZERO, noise="float")
    assert auto_float.display_data()["mechanism"] == "sqrt_toeplitz"


def test_time_steps():
    steps = TimeSteps(ORIGIN, 60, 3)
    assert [steps.step_of(ORIGIN + s) for s in (-0.001, 0, 59.9, 60, 179.99, 180)] == [
        None, 0, 0, 1, 2, None]
    with pytest.raises(ValueError, match=r"^`step_size` must be a positive finite number"):
        TimeSteps(ORIGIN, 0, 3)


def _edge_events(rng, n=40):
    events = []
    for _ in range(n):
        a, b = rng.choice(5, 2, replace=False)
        events.append(((["+", "-"][int(rng.random() < 0.3)], (int(a), int(b))),
                       timestamp(rng, int(rng.integers(0, 6)))))
    return events


@pytest.mark.parametrize("name", ["sum", "count_distinct", "degree_count", "triangle_count",
                                  "release"])
def test_every_transform_gives_the_same_records_in_batch_and_streaming(name):
    rng = np.random.default_rng(11)
    secret = SecretRef(literal=b"same")
    same = {"secret": secret, "release_id": RELEASE, "insecure": True}
    if name == "sum":
        transform = lambda: ContinualSum(steps=STEPS, public_keys=["k"], rho=1.0,  # noqa: E731
                                         max_value=2.0, max_contributions=4, **same)
        events = [((f"u{rng.integers(5)}", "k", float(rng.uniform(0, 3))),
                   timestamp(rng, int(rng.integers(0, 6)))) for _ in range(40)]
    elif name == "count_distinct":
        transform = lambda: ContinualCountDistinct(  # noqa: E731
            steps=STEPS, public_keys=["a", "b"], rho=1.0, max_flips=2, **same)
        events = [((["+", "-"][int(rng.random() < 0.4)], f"i{rng.integers(6)}",
                    ["a", "b"][rng.integers(2)]), timestamp(rng, int(rng.integers(0, 6))))
                  for _ in range(50)]
    elif name == "degree_count":
        transform = lambda: ContinualDegreeCount(  # noqa: E731
            steps=STEPS, public_keys=list(range(5)), rho=1.0, max_updates=3, **same)
        events = _edge_events(rng)
    elif name == "triangle_count":
        transform = lambda: ContinualTriangleCount(  # noqa: E731
            steps=STEPS, rho=1.0, max_degree=5, max_contribution=100, **same)
        events = _edge_events(rng)
    else:
        transform = lambda: ContinualRelease(steps=STEPS, public_keys=["k"],  # noqa: E731
                                             epsilon=1.0, **same)
        events = [(("k", float(rng.integers(-1, 2))), timestamp(rng, s)) for s in range(6)]
    batch, _ = run(transform(), events)
    streaming, _ = run(transform(), events, mode="streaming", steps=STEPS)
    assert batch and batch == streaming


def test_sums_with_discrete_noise_are_integer_units_of_the_value_grid():
    """Values are clamped to [0, max_value] and rounded to the grid g; truncation runs in
    units of g (mass cap floor(k / g)); records are exact multiples of g."""
    rng = np.random.default_rng(5)
    events = [((f"u{rng.integers(5)}", "k", float(rng.uniform(-1, 5))),
               timestamp(rng, int(rng.integers(0, 6)))) for _ in range(60)]
    g = 0.25
    records, _ = run(ContinualSum(steps=STEPS, public_keys=["k"], epsilon=1.0, max_value=2.0,
                                  max_contributions=4, value_resolution=g,
                                  **ZERO), events)
    rounded = [(STEPS.step_of(ts), u, k, math.floor(min(max(v, 0.0), 2.0) / g + 0.5))
               for (u, k, v), ts in events]
    expected = count_streams(rounded, STEPS.horizon, ContributionBounds(16, None, 1, 8.0))
    assert released_totals(records)["k"] == (g * np.cumsum(expected.stream("k"))).tolist()
    noisy, _ = run(ContinualSum(steps=STEPS, public_keys=["k"], epsilon=1.0, max_value=2.0,
                                max_contributions=4, value_resolution=g,
                                secret=SecretRef(literal=b"x"), insecure=True), events)
    for record in noisy:
        assert (record["value"] / g) == round(record["value"] / g)
        assert record["noise"] == "discrete_laplace"


def test_signed_sums_clamp_to_min_value_and_cap_the_values_magnitudes():
    """min_value < 0: values are clamped to [min_value, max_value] and rounded to the grid
    (default max(|min_value|, max_value) / 100); each event's mass is |value| (the rule of
    `streams.count`, its reference here), and negative running totals are published as they
    are (no clamping at 0)."""
    rng = np.random.default_rng(6)
    events = [((f"u{rng.integers(5)}", "k", float(rng.uniform(-3, 1))),
               timestamp(rng, int(rng.integers(0, 6)))) for _ in range(60)]
    g = 0.25
    records, _ = run(ContinualSum(steps=STEPS, public_keys=["k"], epsilon=1.0, max_value=1.0,
                                  min_value=-2.0, max_contributions=4, value_resolution=g,
                                  **ZERO), events)
    rounded = [(STEPS.step_of(ts), u, k, math.floor(min(max(v, -2.0), 1.0) / g + 0.5))
               for (u, k, v), ts in events]
    expected = count_streams(rounded, STEPS.horizon,
                             ContributionBounds(16, None, 1, 4.0, min_value=-8.0))
    totals = released_totals(records)["k"]
    assert totals == (g * np.cumsum(expected.stream("k"))).tolist()
    assert min(totals) <= -4.0  # mostly negative values: negative totals, published as is
    grid = ContinualSum(steps=STEPS, public_keys=["k"], epsilon=1.0, max_value=1.0,
                        min_value=-2.0, max_contributions=4, **ZERO).value_scale
    assert grid == 0.02  # max(|-2|, 1) / 100


def test_a_transform_is_one_release_and_applies_once():
    """Applying one transform object to two inputs would give both the same noise: the
    difference of the two outputs would be the exact difference of the data. Refused."""
    import apache_beam as beam
    count = ContinualCount(steps=STEPS, public_keys=["a"], epsilon=1.0,
                           secret=SecretRef(literal=b"s"), insecure=True)
    with pytest.raises(ValueError, match=r"^`transform` must be applied once"):
        with beam.Pipeline() as pipeline:
            first = pipeline | "A" >> beam.Create([("u", "a")])
            second = pipeline | "B" >> beam.Create([("v", "a")])
            _ = first | "R1" >> count
            _ = second | "R2" >> count


def _resume_with_state_of(owner, resumer):
    """Runs `resumer` from step 1 with a key state that `owner`'s release wrote."""
    import apache_beam as beam
    from transforms.release import RecordMaker
    from transforms.messages import StepWindow
    maker = RecordMaker(owner.config)
    _, state = maker.for_key("a").advance(maker.mechanism.init_state(), np.zeros(1))
    saved = ("a", (maker.seal("a", state), None))
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        events = pipeline | "Events" >> beam.Create([("u", "a")]) | beam.Map(
            lambda e: TimestampedValue(e, ORIGIN + 1.5 * STEPS.size))
        units = pipeline | "Units" >> beam.Create([])
        keys = pipeline | "Keys" >> beam.Create([saved])
        _ = events | resumer.resume(StepWindow(1, STEPS.horizon), units, keys)


def test_stored_state_of_another_release_is_refused():
    """A run that continues another release's key state (or the same release under another
    secret) must fail: it would re-draw the noise of published nodes."""
    make_count = lambda release, secret: ContinualCount(  # noqa: E731
        steps=STEPS, public_keys=["a"], epsilon=1.0, secret=SecretRef(literal=secret), insecure=True,
        release_id=release)
    _resume_with_state_of(make_count("1" * 32, b"s"), make_count("1" * 32, b"s"))  # its own
    with pytest.raises(Exception, match=r"`state` must be state of release 2{32} for key 'a'"):
        _resume_with_state_of(make_count("1" * 32, b"s"), make_count("2" * 32, b"s"))
    with pytest.raises(Exception, match=r"`state` must be state of release 1{32} for key 'a'"):
        _resume_with_state_of(make_count("1" * 32, b"s"), make_count("1" * 32, b"t"))


def test_stateful_stages_use_a_deterministic_key_coder(caplog):
    """No "key coder ... may not be deterministic" warning: ids have their own coder."""
    import logging
    caplog.set_level(logging.WARNING, logger="apache_beam")
    events = random_count_events(np.random.default_rng(1), n=10)
    run(noisy_count(), events, mode="streaming", steps=STEPS)
    assert not [r for r in caplog.records if "deterministic" in r.getMessage()]


def test_records_of_a_unit_on_four_keys_carry_the_joint_calibration_stddev():
    """`max_contributions` caps a unit across its keys, so a unit on 4 keys costs no more noise
    than on 1 (joint calibration, tests/test_joint_calibration.py): records' stddev is that of
    the full budget, 4x below the per-key split of epsilon / 4 (2x below rho / 4)."""
    from transforms.mechanisms import ConstantNoiseSource, make
    events = random_count_events(np.random.default_rng(5), n=40)
    for privacy, factor in (({"epsilon": 1.0}, 4.0), ({"rho": 0.5}, 2.0)):
        transform = ContinualCount(steps=STEPS, public_keys=["eu", "us"], max_contributions=3,
                                   max_contributions_per_step=2, max_keys_per_unit=4,
                                   mechanism="binary_tree", noise="float", **privacy, **ZERO)
        assert transform.descriptor["calibration"] == "joint"
        records, _ = run(transform, events)
        (name, value), = privacy.items()
        split = make("binary_tree", STEPS.horizon, **{name: value / 4}, max_contributions=3,
                     interval_bound=3, noise="float",
                     noise_source=ConstantNoiseSource(0.0)).noise_std()
        for record in records:
            assert record["stddev"] == pytest.approx(split[record["step"]] / factor, rel=1e-12)
            assert record[name] == value  # records name the total budget


def test_blt_release_is_the_same_in_batch_and_streaming():
    """BLT keeps its buffers outside the 17-byte state (re-derived from the seam): streaming
    timers on fresh mechanism objects must give the batch records bit for bit."""
    def blt_count():
        return ContinualCount(steps=STEPS, public_keys=["eu", "us"], rho=0.5,
                              max_contributions=2, mechanism="blt",
                              mechanism_params={"buffers": 3}, noise="float",
                              secret=SecretRef(literal=b"blt-secret"), insecure=True, release_id=RELEASE)
    events = random_count_events(np.random.default_rng(8), n=40)
    events = [((unit, key if key in ("eu", "us") else "eu"), ts) for (unit, key), ts in events]
    batch, _ = run(blt_count(), events)
    streaming, _ = run(blt_count(), events, mode="streaming", steps=STEPS)
    assert batch == streaming and len(batch) == 2 * STEPS.horizon
    assert {r["mechanism"] for r in batch} == {"blt"}
    assert len(json.loads(batch[0]["mechanism_params"])["decay_gaps"]) == 3


@pytest.mark.parametrize("version", ["v3", "v4"])
def test_a_release_configuration_without_its_noise_version_is_refused(version):
    """A worker derives the noise version its configuration names (pickled with the pipeline);
    one pickled by code before noise versions names none (found by an attack: it fell back to
    the newest version, a second noise for the release's nodes) and is refused."""
    import pickle
    from transforms import SecretRef, TimeSteps
    from transforms.validation import ValidationError
    transform = ContinualCount(steps=TimeSteps(0.0, 60.0, 8), public_keys=["a"], rho=0.5,
                               mechanism="binary_tree", secret=SecretRef(seed=3),
                               insecure=True, noise_version=version)
    config = pickle.loads(pickle.dumps(transform.config))
    assert config.build().noise_source.version == version
    assert transform.descriptor["noise_derivation"] == f"{version}/binary_tree/1"
    del config.__dict__["noise_version"]  # as unpickled from a configuration without it
    with pytest.raises(ValidationError, match=r"^`noise_version` must be one of 'v3', 'v4' "
                                              r"\(a release configuration built by code "
                                              r"before noise versions has none.*; got None\.$"):
        config.build()


def test_postprocess_nonnegative_clamps_running_totals_and_intervals_only():
    """With every node's noise -3 the small totals release negative values: `nonnegative`
    gives max(value, 0) and the clamped interval, leaves the step's own value as released,
    and is bound to the release (its descriptor)."""
    from transforms.mechanisms import ConstantNoiseSource
    from transforms.release import NoNoise

    class MinusThree(NoNoise):  # every node's noise -3 (picklable: module-level base)
        def noise_source(self, release=b"", version=None):
            return ConstantNoiseSource(-3.0)

    rng = np.random.default_rng(5)
    events = random_count_events(rng, n=30)

    def release(**extra):
        transform = ContinualCount(steps=STEPS, public_keys=["eu", "us", "latam"], epsilon=1.0,
                                   max_contributions=3, noise_source=MinusThree(),
                                   insecure=True, mechanism="binary_tree", **extra)
        records, _ = run(transform, events)
        return transform, {(r["key"], r["step"]): r for r in records}

    plain_transform, plain = release()
    clamped_transform, clamped = release(postprocess="nonnegative")
    assert any(r["value"] < 0 for r in plain.values())  # the case this option exists for
    for at, raw in plain.items():
        mine = clamped[at]
        assert mine["value"] == max(raw["value"], 0)
        assert (mine["ci_low"], mine["ci_high"]) == (max(raw["ci_low"], 0),
                                                     max(raw["ci_high"], 0))
        assert mine["step_value"] == raw["step_value"] and mine["stddev"] == raw["stddev"]
    assert clamped_transform.descriptor["postprocess"] == "nonnegative"
    assert "postprocess" not in plain_transform.descriptor
    assert clamped_transform.descriptor_digest != plain_transform.descriptor_digest
    with pytest.raises(ValueError, match="`postprocess` must be None or 'nonnegative'"):
        ContinualCount(steps=STEPS, public_keys=["eu"], epsilon=1.0, postprocess="clip",
                       **ZERO)
    with pytest.raises(ValueError, match="`postprocess` must be None for ContinualRelease"):
        ContinualRelease(steps=STEPS, public_keys=["eu"], epsilon=1.0,
                         postprocess="nonnegative", **ZERO)


def test_a_delta_above_1e_3_needs_allow_large_delta():
    common = dict(steps=STEPS, public_keys=["a"], **ZERO)
    with pytest.raises(ValueError, match=r"^`delta` must be <= 0\.001 unless allow_large_delta="
                                         r"True \(delta is the probability the guarantee fails "
                                         r"outright\); got 0\.5\.$"):
        ContinualCount(epsilon=1.0, delta=0.5, **common)
    ContinualCount(epsilon=1.0, delta=0.5, allow_large_delta=True, **common)
    ContinualCount(epsilon=1.0, delta=1e-3, **common)
    with pytest.raises(ValueError, match=r"^`selection_delta` must be <= 0\.001 unless "):
        ContinualCount(steps=STEPS, epsilon=1.0, selection_delta=0.01, **ZERO)
    ContinualCount(steps=STEPS, epsilon=1.0, selection_delta=0.01, allow_large_delta=True,
                   **ZERO)
    from transforms.mean import ContinualMean
    with pytest.raises(ValueError, match=r"^`delta` must be <= 0\.001 unless "):
        ContinualMean(epsilon=1.0, delta=0.01, max_value=5.0, **common)
    ContinualMean(epsilon=1.0, delta=0.01, max_value=5.0, allow_large_delta=True, **common)


def test_with_no_horizon_bounded_input_needs_a_window():
    """Steps with no horizon on bounded input: without `resume(window)` the whole reach (2^20
    steps, all but the data's noise only) would be released at once, and the release end."""
    from transforms.messages import StepWindow  # (this test's only)
    free = TimeSteps(ORIGIN, 60.0, "unbounded")
    events = [(("u1", "a"), ORIGIN + 1.0)]
    with pytest.raises(ValueError, match=r"^`window` must be given with `resume` for steps "
                                         r"with no horizon on bounded input"):
        run(ContinualCount(steps=free, public_keys=["a"], rho=0.5, **ZERO), events)
    counted = ContinualCount(steps=free, public_keys=["a"], rho=0.5, **ZERO)
    counted.resume(StepWindow(0, 3))
    records, _ = run(counted, events)
    assert [(r["step"], r["value"]) for r in records] == [(0, 1.0), (1, 1.0), (2, 1.0)]

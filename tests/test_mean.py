"""ContinualMean end to end: the composed release (two parts, one release id) on the local
runners. The pipelines' config, Parquet and scheduler paths are in tests/pipelines."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.support.beam import run
from tests.support.noise import ZERO
from transforms import SecretRef, TimeSteps
from transforms.mean import ContinualMean

ORIGIN = 1_700_000_000.0
STEPS = TimeSteps(ORIGIN, 60.0, 6)
MAX_VALUE = 10.0


def events_of(rng, units=16, keys=("a", "b", "c"), n=160, steps=STEPS):
    return [((f"u{rng.integers(units)}", keys[rng.integers(len(keys))],
              float(rng.uniform(-2.0, 14.0))),
             steps.origin + int(rng.integers(0, steps.horizon)) * steps.size
             + float(rng.integers(0, 59_000)) / 1000.0) for _ in range(n)]


def reference_means(events, steps, k, per_step, max_keys, grid):
    """The exact truncated running mean per key, written independently of the product: each
    unit admits keys first come (ties in key order) up to `max_keys`, then takes its step's
    events of admitted keys in (key, value) order while under both caps; a kept value is
    clamped to [0, MAX_VALUE] and rounded to the grid. -> {key: [(sum, count) per step]}."""
    by_unit = {}
    for (unit, key, value), ts in events:
        grid_units = math.floor(min(max(value, 0.0), MAX_VALUE) / grid + 0.5)
        by_unit.setdefault(unit, {}).setdefault(steps.step_of(ts), []).append((key, grid_units))
    sums = {}
    for unit, by_step in by_unit.items():
        admitted, used = [], 0
        for step in sorted(by_step):
            for key in sorted({key for key, _ in by_step[step]}):
                if key not in admitted and len(admitted) < max_keys:
                    admitted.append(key)
            taken = 0
            for key, value in sorted(by_step[step]):
                if key in admitted and taken < per_step and used < k:
                    taken, used = taken + 1, used + 1
                    total = sums.setdefault(key, [[0, 0] for _ in range(steps.horizon)])
                    total[step][0] += value
                    total[step][1] += 1
    out = {}
    for key, per in sums.items():
        s = np.cumsum([x[0] for x in per]) * grid
        c = np.cumsum([x[1] for x in per])
        out[key] = list(zip(s.tolist(), c.tolist()))
    return out


@pytest.mark.parametrize("max_keys,per_step", [(1, None), (2, 2)])
def test_zero_noise_mean_is_the_exact_truncated_running_mean(max_keys, per_step):
    rng = np.random.default_rng(7 + max_keys)
    events = events_of(rng)
    transform = ContinualMean(steps=STEPS, public_keys=["a", "b", "c", "none"], epsilon=1.0,
                              max_value=MAX_VALUE, max_contributions=3,
                              max_contributions_per_step=per_step, max_keys_per_unit=max_keys,
                              **ZERO)
    records, dead = run(transform, events)
    assert not dead and len(records) == 4 * STEPS.horizon  # every public key, every step
    expected = reference_means(events, STEPS, 3, per_step or 3, max_keys, MAX_VALUE / 100)
    checked = 0
    for record in records:
        s, c = expected.get(record["key"], [(0.0, 0)] * STEPS.horizon)[record["step"]]
        if c == 0:  # no kept event: the mean is undefined, the release says the midpoint
            assert record["value"] == MAX_VALUE / 2 and record["ci_low"] == 0.0
            continue
        assert record["value"] == pytest.approx(min(s / c, MAX_VALUE), rel=1e-12)
        checked += 1
    assert checked >= 3 * STEPS.horizon - 3


def test_the_two_parts_have_one_release_id_and_never_share_noise():
    mean = ContinualMean(steps=STEPS, public_keys=["a"], epsilon=1.0, max_value=MAX_VALUE,
                         max_contributions=2, seed=5, insecure=True)
    parts = mean.parts
    assert parts["sum"].release_id == parts["count"].release_id == mean.release_id
    bindings = {p.config.release_binding for p in parts.values()}
    assert len(bindings) == 2 and all(b.startswith(bytes.fromhex(mean.release_id))
                                      for b in bindings)
    draws = {name: p.config.secret.noise_source(p.config.release_binding,
                                                p.config.noise_version)
             for name, p in parts.items()}
    assert draws["sum"] is not draws["count"]
    # the budget: the parts compose to the total (sequential composition), 1/2 each by default
    assert parts["sum"].budget.epsilon + parts["count"].budget.epsilon <= 1.0
    assert parts["sum"].budget.epsilon == 0.5 and mean.descriptor["sum_share"] == 0.5
    # what a continuation is built with, and refuses to change
    names, params = mean.resolved_mechanism
    assert set(names) == set(params) == {"sum", "count"}
    again = ContinualMean(steps=STEPS, public_keys=["a"], epsilon=1.0, max_value=MAX_VALUE,
                          max_contributions=2, seed=5, insecure=True, mechanism=names,
                          mechanism_params=params)
    assert again.descriptor == mean.descriptor and again.release_id == mean.release_id


def test_the_noise_of_the_two_parts_is_independent():
    """Noisy minus exact records of each part (run alone), over 200 keys and 2 steps: the sum
    part's and the count part's noises are uncorrelated (shared or derived noise would
    correlate them)."""
    keys = [f"k{i}" for i in range(200)]
    steps = TimeSteps(ORIGIN, 60.0, 2)
    rng = np.random.default_rng(3)
    events = [((f"u{i}", keys[i % 200], float(rng.uniform(0, 10))), ORIGIN + 1.0)
              for i in range(400)]
    common = dict(steps=steps, public_keys=keys, epsilon=1.0, max_value=MAX_VALUE,
                  mechanism="binary_tree")
    sum_noise, count_noise = [], []
    for part in ("sum", "count"):
        part_records, _ = run(ContinualMean(**common, seed=11, insecure=True).parts[part],
                              events)
        zero_records, _ = run(ContinualMean(**common, **ZERO).parts[part], events)
        out = sum_noise if part == "sum" else count_noise
        out += [a["value"] - b["value"] for a, b in zip(part_records, zero_records)]
    assert len(sum_noise) == len(count_noise) == 400
    correlation = np.corrcoef(sum_noise, count_noise)[0, 1]
    assert abs(correlation) < 0.2  # |r| of 400 independent pairs: < 0.2 with prob. 1 - 6e-5


@pytest.mark.parametrize("noise,budget", [  # the laws alone: tests/mechanisms/test_ratio.py
    pytest.param("float", {"epsilon": 1.0}, marks=pytest.mark.slow),
    pytest.param("float", {"rho": 0.5}, marks=pytest.mark.slow),
    ("discrete", {"epsilon": 1.0})])
def test_the_mean_interval_covers_the_truth_at_its_nominal_level(noise, budget):
    """1,600 key-steps (800 keys with independent noise, 2 steps each): the nominal 95 %
    interval covers the exact truncated mean in [0.93, 0.97] of them. Laplace and Gaussian
    laws are exact (coverage 0.95 up to the hull), discrete Laplace approximate (small node
    scales here: where the approximation is worst). With 800
    independent keys the coverage estimate has sd <= 0.0077 (two correlated steps per key):
    a correct interval fails the band with probability < 1 % (fixed seeds: deterministic)."""
    keys = [f"k{i}" for i in range(800)]
    steps = TimeSteps(ORIGIN, 60.0, 2)
    rng = np.random.default_rng(17)
    events = []
    for i, key in enumerate(keys):
        for j in range(int(rng.integers(20, 60))):
            events.append(((f"u{i}-{j}", key, float(rng.uniform(0, 10))),
                           ORIGIN + float(rng.integers(0, 2)) * 60.0 + 1.0))
    common = dict(steps=steps, public_keys=keys, max_value=MAX_VALUE, noise=noise,
                  mechanism="binary_tree", **budget)
    records, _ = run(ContinualMean(**common, seed=23, insecure=True), events)
    truth, _ = run(ContinualMean(**common, **ZERO), events)
    assert len(records) == len(truth) == 1600
    covered = [r["ci_low"] <= t["value"] <= r["ci_high"] for r, t in zip(records, truth)]
    rate = sum(covered) / len(covered)
    assert 0.93 <= rate <= 0.97, rate
    quality = {json.loads(r["mechanism_params"])["interval"] for r in records}
    assert quality == {"fieller (exact)" if noise == "float" else "fieller (approximate)"}


def test_batch_and_streaming_give_the_same_mean_records():
    rng = np.random.default_rng(29)
    events = events_of(rng, n=80)
    same = dict(secret=SecretRef(literal=b"same"), insecure=True)

    def mean():
        return ContinualMean(steps=STEPS, public_keys=["a", "b"], rho=1.0,
                             max_value=MAX_VALUE, max_contributions=4, **same)
    batch, _ = run(mean(), events)
    streaming, _ = run(mean(), events, mode="streaming", steps=STEPS)
    assert len(batch) == 2 * STEPS.horizon and batch == streaming


@pytest.mark.parametrize("kwargs,message", [
    ({"sum_share": 1.0}, r"^`sum_share` must be a number in \(0, 1\)"),
    ({"max_value": 0}, r"^`max_value` must be a positive finite number"),
    ({"mechanism": {"sum": "binary_tree"}}, r"^`mechanism` must be one value for both parts"),
    ({"mechanism": {"sum": "binary_tree", "count": "nope"}}, r"^`mechanism.count` must be one"),
    ({"value_resolution": 20.0}, r"^`value_resolution` must be <= max_value"),
])
def test_construction_errors(kwargs, message):
    base = dict(steps=STEPS, public_keys=["a"], epsilon=1.0, max_value=MAX_VALUE, **ZERO)
    base.update(kwargs)
    with pytest.raises(ValueError, match=message):
        ContinualMean(**base)


def test_a_private_mean_needs_claims_like_any_release(tmp_path, monkeypatch):
    import apache_beam as beam
    monkeypatch.setenv("DP_MEAN_SECRET", "ab" * 32)
    mean = ContinualMean(steps=STEPS, public_keys=["a"], epsilon=1.0, max_value=MAX_VALUE,
                         secret=SecretRef(env="DP_MEAN_SECRET"))
    assert mean.private
    with pytest.raises(ValueError, match=r"^`claims` must be a folder"):
        with beam.Pipeline(runner="FnApiRunner") as pipeline:
            _ = pipeline | beam.Create([]) | mean


def test_a_part_is_never_applied_on_its_own_unclaimed(monkeypatch):
    """A private mean's part applied alone (its composite's id, no claim) would publish the
    mean's noise on other data: refused like any unclaimed private release (a part exists only
    with its composite's id: `_MeanPart` binds the mean's)."""
    import apache_beam as beam
    monkeypatch.setenv("DP_MEAN_SECRET", "cd" * 32)
    mean = ContinualMean(steps=STEPS, public_keys=["a"], epsilon=1.0, max_value=MAX_VALUE,
                         secret=SecretRef(env="DP_MEAN_SECRET"))
    for part in mean.parts.values():
        with pytest.raises(ValueError, match=r"^`claims` must be a folder"):
            with beam.Pipeline(runner="FnApiRunner") as pipeline:
                _ = pipeline | beam.Create([]) | part
    assert {p.release_id for p in mean.parts.values()} == {mean.release_id}


def test_a_keys_two_states_share_the_state_budget():
    mean = ContinualMean(steps=TimeSteps(ORIGIN, 60.0, 4096), public_keys=["a"], rho=1.0,
                         max_value=MAX_VALUE, max_state_bytes_per_key=20_000, **ZERO)
    assert mean.state_bytes_per_key <= 20_000
    assert all(p.max_state_bytes_per_key == 10_000 for p in mean.parts.values())
    with pytest.raises(ValueError, match=r"^`max_state_bytes_per_key` must be an integer >= "
                                         r"66 for a mean"):
        ContinualMean(steps=STEPS, public_keys=["a"], rho=1.0, max_value=MAX_VALUE,
                      max_state_bytes_per_key=40, **ZERO)


def test_a_private_mean_resumes_through_the_api_with_its_claims(tmp_path, monkeypatch):
    """Steps 0 -> 3, then 3 -> 6 from the first window's unit and key states (the census of
    the unit states checked before the second window is claimed, the parts handed the mean's
    claim): every step released once; replaying the second window is refused."""
    import apache_beam as beam
    from transforms.messages import StepWindow
    from tests.support.beam import AppendJson, read_json_lines
    from transforms.streams import codec
    monkeypatch.setenv("DP_MEAN_SECRET", "ef" * 32)
    claims = str(tmp_path / "claims")
    events = events_of(np.random.default_rng(41), n=60)

    def mean(**kwargs):
        return ContinualMean(steps=STEPS, public_keys=["a", "b"], epsilon=1.0,
                             max_value=MAX_VALUE, max_contributions=3,
                             secret=SecretRef(env="DP_MEAN_SECRET"), claims=claims, **kwargs)

    def apply(transform, name, units=None, keys=None):
        out = str(tmp_path / name)
        with beam.Pipeline(runner="FnApiRunner") as pipeline:
            timed = (pipeline | f"{name}Events" >> beam.Create(events)
                     | f"{name}Time" >> beam.Map(
                         lambda e: beam.window.TimestampedValue(e[0], e[1])))
            if units is not None:
                transform.resume(StepWindow(3, 6),
                                 pipeline | "Units" >> beam.Create(units),
                                 pipeline | "Keys" >> beam.Create(keys))
            result = timed | transform
            result.records | "R" >> beam.ParDo(AppendJson(out + "-records"))
            result.unit_states | "UC" >> beam.Map(codec.dumps) | "U" >> beam.ParDo(
                AppendJson(out + "-units"))
            result.key_states | "KC" >> beam.Map(codec.dumps) | "K" >> beam.ParDo(
                AppendJson(out + "-keys"))
        return (read_json_lines(out + "-records"),
                [codec.loads(line) for line in read_json_lines(out + "-units")],
                [codec.loads(line) for line in read_json_lines(out + "-keys")])

    first = mean()
    first.resume(StepWindow(0, 3))
    records, units, keys = apply(first, "first")
    assert sorted({r["step"] for r in records}) == [0, 1, 2]
    second = mean(release_id=first.release_id)
    later, _, _ = apply(second, "second", units, keys)
    assert sorted({r["step"] for r in later}) == [3, 4, 5] and len(later) == 2 * 3
    with pytest.raises(Exception, match=r"`claim` must be new"):
        apply(mean(release_id=first.release_id), "replay", units, keys)

"""The running mean's interval (Fieller / test inversion) and budget split (mechanisms/ratio.py).

Statistical tests use fixed seeds; each states its false-failure rate (for a correct
implementation, over the randomness of the seed)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from transforms.mechanisms import make, pivot, ratio
from transforms.validation import ValidationError

KEYS = 2000


def simulate(name, privacy, noise, min_value, max_value, steps, seed, horizon=16,
             max_contributions=2, grid_units=None):
    """Release a running sum and count for KEYS keys with the real mechanisms (each key its own
    noise stream), split as `best_split` says; returns per step the (S^, C^, true mean) arrays
    and the two step laws, in value units. Sum: values / M through a count-calibrated mechanism
    (each contribution moves it by <= 1, as a count), times M; with `grid_units` U the values
    are integers on the grid M / U (discrete noise) and the sum mechanism runs in grid units
    with max_contributions x U."""
    kind = "laplace" if "epsilon" in privacy and "delta" not in privacy else "gaussian"
    split = ratio.best_split(min_value, max_value, kind)
    budget_key = "epsilon" if kind == "laplace" else "rho"
    total = privacy[budget_key]
    bound = max(abs(min_value), abs(max_value))
    unit = bound if grid_units is None else bound / grid_units
    sum_contributions = max_contributions * (1 if grid_units is None else grid_units)
    count_mech = make(name, horizon, **{budget_key: split.count_share * total}, noise=noise,
                      max_contributions=max_contributions, seed=seed)
    sum_mech = make(name, horizon, **{budget_key: split.sum_share * total}, noise=noise,
                    max_contributions=sum_contributions, seed=seed + 1)
    rng = np.random.default_rng(seed)
    rates = rng.choice([0.3, 1.0, 3.0, 10.0, 40.0], size=KEYS)
    counts = rng.poisson(rates[:, None], size=(KEYS, horizon)).astype(np.float64)
    counts[:, 0] += 1  # C >= 1 from step 1: the mean is in range
    sums = np.zeros((KEYS, horizon))
    centre = rng.uniform(min_value, max_value, size=KEYS)
    for i in range(KEYS):
        for t in range(horizon):
            n = int(counts[i, t])
            values = np.clip(centre[i] + rng.normal(0, 0.3 * (max_value - min_value), n),
                             min_value, max_value)
            if grid_units is not None:
                values = np.rint(values / unit)
            else:
                values = values / unit
            sums[i, t] = values.sum()
    sum_release = np.empty((KEYS, horizon))
    count_release = np.empty((KEYS, horizon))
    for i in range(KEYS):
        stream = f"key-{i}"
        sum_release[i] = unit * sum_mech.for_stream(stream).release(sums[i])
        count_release[i] = count_mech.for_stream(stream).release(counts[i])
    true_sum = unit * np.cumsum(sums, axis=1)
    true_count = np.cumsum(counts, axis=1)
    out = []
    for t in steps:
        out.append((sum_release[:, t - 1], count_release[:, t - 1],
                    true_sum[:, t - 1] / true_count[:, t - 1],
                    ratio.step_noise(sum_mech, t).scaled(unit), ratio.step_noise(count_mech, t)))
    return out


def coverage(name, privacy, noise, min_value, max_value, steps, seed, **kwargs):
    """Per key, the fraction of `steps` whose nominal-95% interval holds the true mean; returns
    the mean over keys (a mean of KEYS independent per-key averages: its sd is at most that of
    KEYS independent indicators, sqrt(0.95 x 0.05 / 2000) = 0.0049) and per-step coverages."""
    hits = np.zeros(KEYS)
    per_step = []
    for s, c, mean, sum_noise, count_noise in simulate(name, privacy, noise, min_value,
                                                       max_value, steps, seed, **kwargs):
        r = ratio.ratio_interval(s, c, sum_noise, count_noise, min_value, max_value, 0.95)
        inside = (r.low <= mean) & (mean <= r.high)
        assert np.all(r.low <= r.high)
        hits += inside
        per_step.append(float(np.mean(inside)))
    return float(np.mean(hits / len(steps))), per_step


# ----- coverage with the real mechanisms ---------------------------------------------------------
def test_gaussian_coverage_binary_tree():
    """2000 keys x steps 3, 8, 13 of a float-Gaussian binary tree (rho = 1 split by best_split):
    pooled coverage of the 95% interval in [0.93, 0.97]. The pooled mean has sd <= 0.0049, so
    the band is >= 4.1 sd wide each side: false-failure rate < 1e-4 (normal approximation)."""
    pooled, per_step = coverage("binary_tree", {"rho": 1.0}, "float", 0.0, 5.0, (3, 8, 13),
                                seed=101)
    print("gaussian coverage", pooled, per_step)
    assert 0.93 <= pooled <= 0.97, (pooled, per_step)


def test_laplace_coverage_binary_tree():
    """The same for a float-Laplace binary tree (epsilon = 2 split by best_split), values in
    [-2, 10], steps 1, 3, 7, 16 (1, 2, 3, 1 nodes each): the exact Gil-Pelaez quantiles give
    pooled coverage in [0.93, 0.97] (false-failure rate < 1e-4, as above)."""
    pooled, per_step = coverage("binary_tree", {"epsilon": 2.0}, "float", -2.0, 10.0,
                                (1, 3, 7, 16), seed=202)
    print("laplace coverage", pooled, per_step)
    assert 0.93 <= pooled <= 0.97, (pooled, per_step)


def test_discrete_laplace_coverage():
    """Default discrete noise (discrete Laplace, values on a grid of 10 units; the Laplace law
    of the exact variance): pooled coverage in [0.93, 0.97] (false-failure rate < 1e-4 if it
    were exact)."""
    pooled, per_step = coverage("binary_tree", {"epsilon": 2.0}, "discrete", 0.0, 10.0,
                                (3, 7, 16), seed=303, grid_units=10)
    print("discrete laplace coverage", pooled, per_step)
    assert 0.93 <= pooled <= 0.97, (pooled, per_step)


def test_discrete_gaussian_coverage():
    """Discrete Gaussian noise (the normal approximation at the exact variances): pooled
    coverage in [0.93, 0.97] (false-failure rate < 1e-4 if it were exact)."""
    pooled, per_step = coverage("binary_tree", {"rho": 1.0}, "discrete", 0.0, 10.0,
                                (3, 7, 16), seed=404, grid_units=10)
    print("discrete gaussian coverage", pooled, per_step)
    assert 0.93 <= pooled <= 0.97, (pooled, per_step)


# ----- the interval against closed forms ----------------------------------------------------------
def _hull_in_range(pieces, low, high):
    inside = [(max(a, low), min(b, high)) for a, b in pieces if max(a, low) <= min(b, high)]
    if not inside:
        return None
    return min(a for a, _ in inside), max(b for _, b in inside)


def test_gaussian_interval_is_the_closed_form_fieller_hull():
    """For Gaussian noise the interval contains the closed-form Fieller set within the range,
    and equals its hull (to 1e-9 of the range), over well- and ill-determined counts."""
    rng = np.random.default_rng(5)
    low, high = -3.0, 7.0
    for _ in range(300):
        vs, vc = rng.uniform(0.5, 400.0), rng.uniform(0.5, 50.0)
        count = rng.choice([0.5, 3.0, 20.0, 500.0]) + rng.normal(0, math.sqrt(vc))
        mean = rng.uniform(low, high)
        total = mean * count + rng.normal(0, math.sqrt(vs))
        s = ratio.StepNoise.of("gaussian", math.sqrt(vs), [1.0])
        c = ratio.StepNoise.of("gaussian", math.sqrt(vc), [1.0])
        r = ratio.ratio_interval(total, count, s, c, low, high)
        hull = _hull_in_range(ratio.fieller_interval(total, count, vs, vc), low, high)
        if hull is None:
            assert r.empty and low <= r.low == r.high <= high
            continue
        assert not r.empty
        tol = 1e-9 * (high - low)
        assert r.low <= hull[0] + tol and r.high >= hull[1] - tol
        assert r.low == pytest.approx(hull[0], abs=tol) and r.high == pytest.approx(hull[1],
                                                                                   abs=tol)


def test_fieller_pieces():
    """The four shapes of Fieller's set."""
    (piece,) = ratio.fieller_interval(500.0, 100.0, 9.0, 1.0)
    assert piece[0] < 5.0 < piece[1]
    assert ratio.fieller_interval(5.0, 1.0, 9.0, 1.0) == ((-math.inf, math.inf),)
    rays = ratio.fieller_interval(30.0, 1.0, 9.0, 1.0)  # C^2 < z^2 Vc, S^ far from 0
    assert len(rays) == 2 and rays[0][0] == -math.inf and rays[1][1] == math.inf
    assert ratio.fieller_interval(30.0, 1.0, 1e4, 1.0) == ((-math.inf, math.inf),)
    assert ratio.fieller_interval(30.0, 10.0, 1e-6, 1e-12) == ((pytest.approx(3.0, abs=1e-3),
                                                                pytest.approx(3.0, abs=1e-3)),)


def test_unverified_curve_polishes_with_exact_quantiles(monkeypatch):
    """When the interpolant does not verify, boundaries are re-found with exact q(m): the same
    interval as the verified interpolant's (to 1e-8 of the range)."""
    s = ratio.StepNoise.of("laplace", 30.0, [1.0] * 2)
    c = ratio.StepNoise.of("laplace", 3.0, [1.0] * 3)
    releases = (np.array([500.0, 90.0, 1000.0]), np.array([100.0, 12.0, 101.0]))
    good = ratio.ratio_interval(*releases, s, c, -2.0, 10.0)
    monkeypatch.setattr(pivot, "_INTERPOLATION_TOLERANCE", 0.0)
    curve = ratio.QuantileCurve(s, c, -2.0, 10.0)
    assert not curve.verified
    polished = ratio.ratio_interval(*releases, s, c, -2.0, 10.0, curve=curve)
    np.testing.assert_allclose(polished.low, good.low, atol=1e-8 * 12)
    np.testing.assert_allclose(polished.high, good.high, atol=1e-8 * 12)
    for i, bound in enumerate(polished.high):
        if bound < 10.0:  # an interior boundary: |S^ - m C^| = q(m) there
            gap = curve.exact(bound) - abs(releases[0][i] - bound * releases[1][i])
            assert abs(gap) < 1e-6 * curve.exact(bound)


# ----- estimate, standard error and degenerate cases ---------------------------------------------
LAP_S = ratio.StepNoise.of("laplace", 20.0, [1.0, 1.0])
LAP_C = ratio.StepNoise.of("laplace", 2.0, [1.0, 1.0])


def test_estimate_and_std_error():
    r = ratio.ratio_interval(500.0, 100.0, LAP_S, LAP_C, 0.0, 10.0)
    assert r.estimate == 5.0
    assert r.std_error == pytest.approx(math.sqrt(LAP_S.variance + 25 * LAP_C.variance) / 100)
    assert r.low < 5.0 < r.high and not r.whole and not r.empty and r.quality == "exact"
    # vectorised equals scalar
    many = ratio.ratio_interval([500.0, 40.0], [100.0, 2.0], LAP_S, LAP_C, 0.0, 10.0)
    one = ratio.ratio_interval(40.0, 2.0, LAP_S, LAP_C, 0.0, 10.0)
    assert many.low[1] == one.low and many.high[1] == one.high and many.low[0] == r.low


def test_nonpositive_noisy_count():
    """C^ <= 0: estimate = midpoint, std_error = half the range; the interval stays in range."""
    for count in (0.0, -3.0):
        r = ratio.ratio_interval(12.0, count, LAP_S, LAP_C, 0.0, 10.0)
        assert r.estimate == 5.0 and r.std_error == 5.0
        assert 0.0 <= r.low <= r.high <= 10.0
    r = ratio.ratio_interval(0.0, 0.0, LAP_S, LAP_C, 0.0, 10.0)
    assert r.whole  # nothing known: the whole range
    assert ratio.ratio_estimate(np.array([1.0, 5.0]), np.array([-1.0, 0.0]), 2.0, 4.0).tolist() \
        == [3.0, 3.0]


def test_small_count_gives_whole_range():
    r = ratio.ratio_interval(8.0, 1.0, LAP_S, LAP_C, 0.0, 10.0)
    assert r.whole and (r.low, r.high) == (0.0, 10.0)


def test_single_value_range():
    r = ratio.ratio_interval(123.0, -4.0, LAP_S, LAP_C, 3.0, 3.0)
    assert (r.estimate, r.low, r.high, r.std_error, r.whole) == (3.0, 3.0, 3.0, 0.0, True)


def test_sum_outside_range():
    """S^ / C^ above max_value: the estimate clamps; the interval ends at max_value or is the
    least-rejected point (flagged empty) when the data contradict every mean in range."""
    r = ratio.ratio_interval(1500.0, 100.0, LAP_S, LAP_C, 0.0, 10.0)  # 15 > 10
    assert r.estimate == 10.0 and r.empty and r.low == r.high == 10.0
    r = ratio.ratio_interval(1030.0, 100.0, LAP_S, LAP_C, 0.0, 10.0)  # 10.3: within noise
    assert r.estimate == 10.0 and not r.empty and r.high == 10.0 and r.low < 10.0
    r = ratio.ratio_interval(-300.0, 100.0, LAP_S, LAP_C, 0.0, 10.0)
    assert r.estimate == 0.0 and r.empty and r.low == r.high == 0.0


def test_step_noise_reads_the_mechanisms():
    tree = make("binary_tree", 16, epsilon=1.0, seed=1, noise="float")
    for t in (1, 7, 15, 16):
        law = ratio.step_noise(tree, t)
        assert law.law == "laplace" and law.weights == (1.0,)
        assert law.counts == (bin(t).count("1"),)
        assert law.variance == tree.noise_variance()[t - 1]
    sqrt = make("sqrt_toeplitz", 16, rho=0.5, seed=1, noise="float")
    law = ratio.step_noise(sqrt, 5)
    assert sum(law.counts) == 5
    assert 2 * 0 + sqrt.node_variance * sum(
        n * w * w for w, n in zip(law.weights, law.counts)) == pytest.approx(law.variance)
    discrete = make("binary_tree", 16, epsilon=1.0, seed=1)
    law = ratio.step_noise(discrete, 7)
    assert law.law == "discrete_laplace" and law.quality == "approximate"
    assert law.variance == pytest.approx(3 * discrete.node_variance)
    scaled = law.scaled(0.5)
    assert scaled.weights == (0.5,) and scaled.variance == pytest.approx(law.variance / 4)


# ----- the budget split ---------------------------------------------------------------------------
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_best_split_against_grid_search(noise):
    grid = np.linspace(1e-4, 1 - 1e-4, 99_999)
    for low, high, mean, ds in ((0.0, 10.0, None, None), (0.0, 10.0, 3.0, None),
                                (-5.0, 1.0, -0.5, None), (0.0, 1.0, 0.8, 7.0),
                                (2.0, 100.0, 50.0, 40.0)):
        split = ratio.best_split(low, high, noise, reference_mean=mean, sum_sensitivity=ds)
        m = split.reference_mean
        values = [ratio.split_variance(w, noise, split.sum_sensitivity, 1.0, m) for w in grid]
        best = grid[int(np.argmin(values))]
        assert split.sum_share == pytest.approx(best, abs=2e-4)
        assert split.objective <= min(values) * (1 + 1e-12)
        assert split.count_share == pytest.approx(1 - split.sum_share)


def test_best_split_defaults_and_closed_forms():
    assert ratio.best_split(0.0, 10.0, "laplace").sum_share == pytest.approx(0.5)
    assert ratio.best_split(-20.0, 10.0, "gaussian").sum_share == pytest.approx(0.5)
    split = ratio.best_split(0.0, 10.0, "laplace", reference_mean=5.0)  # a = 100, b = 25
    assert split.sum_share == pytest.approx(4 ** (1 / 3) / (4 ** (1 / 3) + 1))
    assert split.objective == pytest.approx((100 ** (1 / 3) + 25 ** (1 / 3)) ** 3)
    split = ratio.best_split(0.0, 10.0, "gaussian", reference_mean=5.0)
    assert split.sum_share == pytest.approx(2 / 3)
    assert "sqrt" in split.describe()["formula"]


# ----- validation -----------------------------------------------------------------------------
def test_errors_read_name_condition_value():
    with pytest.raises(ValidationError, match=r"^`max_value` must be >= min_value \(2.0\); "
                                              r"got 1.0\.$"):
        ratio.ratio_interval(1.0, 1.0, LAP_S, LAP_C, 2.0, 1.0)
    with pytest.raises(ValidationError, match="^`level` must be a number in"):
        ratio.ratio_interval(1.0, 1.0, LAP_S, LAP_C, 0.0, 1.0, level=1.5)
    with pytest.raises(ValidationError, match="^`sum_noise` must be a StepNoise"):
        ratio.ratio_interval(1.0, 1.0, 3.0, LAP_C, 0.0, 1.0)
    with pytest.raises(ValidationError, match="^`noise` must be one of"):
        ratio.best_split(0.0, 1.0, "cauchy")
    with pytest.raises(ValidationError, match="^`reference_mean` must be a nonzero"):
        ratio.best_split(0.0, 1.0, "laplace", reference_mean=0.0)
    with pytest.raises(ValidationError, match="^`min_value` must be a finite number"):
        ratio.best_split(math.nan, 1.0, "laplace")
    with pytest.raises(ValidationError, match="^`step` must be <= horizon"):
        ratio.step_noise(make("binary_tree", 4, epsilon=1.0, seed=1), 5)
    with pytest.raises(ValidationError, match="^`law` must be one of"):
        ratio.StepNoise.of("uniform", 1.0, [1.0])

"""Square-root and naive factorizations against Fichtenberger et al. 2023; Andersson et al. 2026 and
NOTES.md."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from transforms.mechanisms import ConstantNoiseSource
from transforms.mechanisms import make as make_mechanism
from transforms.mechanisms.toeplitz import convolve, exact_convolution, sqrt_coefficients


def make(*args, **kwargs):
    """These tests check the papers' continuous-noise formulas: float noise unless asked."""
    kwargs.setdefault("noise", "float")
    return make_mechanism(*args, **kwargs)


def exact_sqrt_coefficients(n):
    f = [Fraction(1)]
    for j in range(1, n):
        f.append(f[-1] * Fraction(2 * j - 1, 2 * j))
    return f


def test_sqrt_coefficients_square_to_the_all_ones_sequence_exactly():
    exact = exact_sqrt_coefficients(200)
    for j in range(200):  # (f * f)(j) = 1: T(f)^2 = A in exact arithmetic
        assert sum(exact[i] * exact[j - i] for i in range(j + 1)) == 1
    np.testing.assert_allclose(sqrt_coefficients(200), [float(v) for v in exact], rtol=1e-14)
    assert float(exact[10]) == pytest.approx(math.comb(20, 10) / 4 ** 10, rel=1e-15)


@pytest.mark.parametrize("horizon", [1, 10, 11, 1000, 4096])
def test_max_squared_row_norm_is_sum_of_f_squared(horizon):
    """Fichtenberger et al. 2023: ||L||^2_{2->inf} = sum_{j<T} f(j)^2, and rows grow with t."""
    mechanism = make("sqrt_toeplitz", horizon, rho=0.5, seed=0)
    exact = float(sum(v * v for v in exact_sqrt_coefficients(horizon)))
    weights = mechanism._squared_weights()
    assert weights[-1] == pytest.approx(exact, rel=1e-13)
    assert np.all(np.diff(weights) > 0)
    assert mechanism.sensitivity == pytest.approx(math.sqrt(exact), rel=1e-13)


def test_notes_limit_and_valid_bound_replace_seed_003_psi():
    """NOTES.md: sum f^2 - ln(T)/pi -> 1.066276; 1 + (gamma + ln T)/pi is a valid bound."""
    gamma = 0.5772156649015329
    for horizon in (11, 100, 10 ** 4, 10 ** 6):
        total = float(np.sum(sqrt_coefficients(horizon) ** 2))
        assert total <= 1 + (gamma + math.log(horizon)) / math.pi
    total = float(np.sum(sqrt_coefficients(10 ** 6) ** 2))
    assert total - math.log(10 ** 6) / math.pi == pytest.approx(1.066276, abs=2e-6)


def test_notes_table_T_1000_square_root_and_naive():
    cases = [("sqrt_toeplitz", 91.1712, 86.6262, 3.2650, 3.1022),
             ("naive_composition", 1414.2136, 1414.2136, 31.6228, 31.6228)]
    for name, lap_max, lap_mean, gau_max, gau_mean in cases:
        laplace = make(name, 1000, epsilon=1.0, seed=0)
        gauss = make(name, 1000, rho=0.5, seed=0)
        got = (laplace.max_se(), laplace.mean_se(), gauss.max_se(), gauss.mean_se())
        assert got == pytest.approx((lap_max, lap_mean, gau_max, gau_mean), abs=6e-5), name


def test_input_perturbation_variance_is_t_node_variances():
    mechanism = make("input_perturbation", 50, epsilon=2.0, seed=0)
    assert mechanism.sensitivity == 1.0
    np.testing.assert_allclose(mechanism.noise_variance(), 2 * 0.5 ** 2 * np.arange(1, 51))


def test_fft_noise_vector_equals_direct_convolution():
    mechanism = make("sqrt_toeplitz", 777, rho=1.0, seed=4)
    z = mechanism.noise_source.unit_noise("gaussian", mechanism.stream, 0, 0, 777)
    direct = np.convolve(sqrt_coefficients(777), z)[:777]
    np.testing.assert_allclose(mechanism._unit_noise(0, 777), direct, rtol=0, atol=1e-11)


@pytest.mark.parametrize("size", [2, 64, 1 << 17])
def test_convolve_in_reused_buffers_is_numpys_own_transform_bits(size):
    """`convolve` (transforms written into buffers kept per thread) gives the bits of numpy's
    irfft(rfft(v, size) * s, size), whatever the buffers held before (another size, an exact
    convolution's blocks)."""
    rng = np.random.default_rng(size)
    values = rng.integers(-50, 50, size // 2).astype(np.float64)
    frequencies = np.fft.rfft(values, size)
    for stop in (size, size // 2):
        spectrum = rng.normal(size=size // 2 + 1) + 1j * rng.normal(size=size // 2 + 1)
        want = np.fft.irfft(frequencies * spectrum, size)[:stop]
        assert convolve(spectrum, values, size, stop).tobytes() == want.tobytes()
        convolve(np.ones(2, complex), values[:1], 2, 1)  # another size's
        exact_convolution(np.arange(70, 0, -1), np.arange(70))


@pytest.mark.parametrize("n", [1, 2, 9, 64, 3000])
@pytest.mark.parametrize("bound", [2, 1 << 30])  # one signed product; the 12-bit limbs
def test_exact_convolution_is_the_integer_convolution(n, bound):
    """Blocks of a power of two, the last one partial, against Python integers."""
    rng = np.random.default_rng(bound + n)
    fixed = np.rint(sqrt_coefficients(n) * 65536).astype(np.int64)
    values = rng.integers(-bound, bound, n)
    rows = range(0, n, max(1, n // 40))
    want = [sum(int(fixed[t - s]) * int(values[s]) for s in range(t + 1)) for t in rows]
    assert exact_convolution(fixed, values)[list(rows)].tolist() == want
    assert exact_convolution(fixed, values).shape == (n,)


# ----- the discrete square root (zCDP) -------------------------------------------------------
def discrete_sqrt(horizon, **kwargs):
    return make_mechanism("sqrt_toeplitz", horizon, rho=0.5, **kwargs)


def test_discrete_sqrt_streaming_equals_batch_and_resumes_from_bytes():
    from transforms.mechanisms.base import state_from_bytes
    x = np.random.default_rng(4).integers(-3, 6, 300)
    mechanism = discrete_sqrt(300, seed=3, stream="k")
    batch = mechanism.release(x)
    state, outs = mechanism.init_state(), []
    for value in x:
        out, state = mechanism.step(state, value)
        outs.append(out)
    assert np.array_equal(np.array(outs), batch)
    state, chunks = mechanism.init_state(), []
    for chunk in np.array_split(x, [1, 50, 51, 200]):
        fresh = discrete_sqrt(300, seed=3, stream="k")  # a new process: only bytes survive
        released, state = fresh.advance(state_from_bytes(state.to_bytes()), chunk)
        chunks.append(released)
    assert np.array_equal(np.concatenate(chunks), batch)
    assert len(state.to_bytes()) == 9 + 16 * 300  # O(T): x and round(R x / g) per step


def test_discrete_sqrt_output_is_a_function_of_an_integer_vector_only():
    """release = g L~ y with y integer: R~ release / g recovers integers (to float rounding of
    the post-processing), and L~ R~ = A, so zero noise gives the running total up to the
    grid's rounding."""
    mechanism = discrete_sqrt(1000, seed=8)
    x = np.random.default_rng(5).integers(0, 7, 1000)
    released = mechanism.release(x)
    left, right = mechanism.dense_factors()
    y = right @ released / mechanism.grid
    assert np.max(np.abs(y - np.round(y))) < 1e-6
    np.testing.assert_allclose(left @ right, np.tril(np.ones((1000, 1000))), atol=1e-9)
    zero = discrete_sqrt(1000, noise_source=ConstantNoiseSource(0.0))
    assert np.max(np.abs(zero.release(x) - np.cumsum(x))) < 0.05
    # accuracy: within 1 % of the real-valued square root's MaxSE
    assert mechanism.max_se() <= 1.01 * make("sqrt_toeplitz", 1000, rho=0.5).max_se()


def test_discrete_sqrt_sensitivity_covers_rounding_by_brute_force():
    """max over v in S_{D,k} and random x of ||round(R~ (x + v) / g) - round(R~ x / g)||_2
    never exceeds the claimed sensitivity of y (T = 8, D = 1, k = 2 and D = 2, k = 3)."""
    from tests.support.brute_force import brute_sensitivity, sensitivity_set
    rng = np.random.default_rng(6)
    for d, k in ((1, 2), (2, 3)):
        mechanism = discrete_sqrt(8, seed=1, max_contributions=k, interval_bound=d)
        _, right = mechanism.dense_factors()
        scale = 2.0 ** mechanism.grid_bits
        vectors = sensitivity_set(8, d, k).astype(np.float64)
        worst = 0.0
        for _ in range(30):
            x = rng.integers(-50, 50, 8).astype(np.float64)
            base = np.floor(right @ x * scale + 0.5)
            moved = np.floor((x + vectors) @ right.T * scale + 0.5)
            worst = max(worst, float(np.max(np.linalg.norm(moved - base, axis=1))))
        assert worst <= mechanism.sensitivity
        # the rounding moves each coordinate by less than 1 around the exact image
        assert worst >= brute_sensitivity(right, d, k, 2) * scale - math.sqrt(8)


def test_discrete_sqrt_variance_and_coverage():
    """Empirical noise variance against the analytic one (z-tests, false failure ~1e-5) and
    per-step coverage within Z_CHECK binomial sd of the level on both sides (the interval is
    exact to two grid units: `tails`; false failure ~1e-5 per step)."""
    from tests.support.contract import Z_CHECK, variance_check
    mechanism = discrete_sqrt(64, seed=12)
    z_pooled, z_steps = variance_check(mechanism, streams=500, steps=64)
    assert abs(z_pooled) < Z_CHECK and np.max(np.abs(z_steps)) < 5.0
    noise = np.array([mechanism.for_stream(s).release(np.zeros(64)) for s in range(500)])
    coverage = np.mean(np.abs(noise) <= mechanism.confidence_half_width(0.9), axis=0)
    assert np.all(coverage >= 0.9 - Z_CHECK * math.sqrt(0.09 / 500))
    assert np.all(coverage <= 0.9 + Z_CHECK * math.sqrt(0.09 / 500))


def test_discrete_sqrt_refuses_pure_dp_and_huge_streams_without_revealing_them():
    with pytest.raises(ValueError, match=r"^`noise` must be 'float' for sqrt_toeplitz under "
                                         r"pure DP"):
        make_mechanism("sqrt_toeplitz", 10, epsilon=1.0)
    mechanism = discrete_sqrt(4, seed=1)
    with pytest.raises(ValueError, match=r"^`values` must be a stream with sum \|x\| < 2\^46 "
                                         r".*; got 'a larger stream'\.$"):
        mechanism.release([2.0 ** 47, 0, 0, 0])


def test_discrete_sqrt_whose_noise_exceeds_its_table_is_refused_up_front_and_not_chosen():
    """Small rho at long horizons: the grid-unit noise would not fit the sampling table. The
    mechanism fails at construction (not on the worker after reading data) and auto skips it."""
    from transforms.mechanisms.choose import choose
    with pytest.raises(ValueError, match=r"^`rho` must be large enough for the discrete "
                                         r"sqrt_toeplitz at horizon 65536"):
        make_mechanism("sqrt_toeplitz", 1 << 16, rho=0.01)
    best, rows = choose(1 << 16, {"rho": 0.01}, 1)
    assert best.mechanism != "sqrt_toeplitz"
    assert "sqrt_toeplitz" not in {r.mechanism for r in rows}
    assert choose(1 << 16, {"rho": 0.01}, 1, noise="float")[0].mechanism == "sqrt_toeplitz"

"""`ContinualMechanism.confidence_half_width` against the mechanisms' real noise (acceptance).

Every mechanism of the registry, both noise families (float: Laplace under pure DP, Gaussian
under zCDP; discrete: discrete Laplace / discrete Gaussian where the mechanism has it),
T in {100, 1000}, levels {0.9, 0.95, 0.99}, steps t in {1, 2, 10, T/2, T}:

(i) coverage: the number of >= 20,000 noise draws beyond the half-width lies in its two-sided
    binomial acceptance region around the exact tail (alpha for continuous sums, where the
    interval is exact to 2e-10; the lattice tail at c for integer sums, where c is also checked
    to be the smallest covering integer; [P(|S'| > c + a), alpha] for the discrete square
    root, exact to two grid units);
(ii) width: the empirical quantile of |noise_t| is within 1 % of the half-width, with as many
    draws as make that check's false-failure rate <= FF (computed from the exact tails at
    0.99 c and 1.01 c); in CI on the continuous laws that changed (float Laplace, discrete
    square root) at T = 100 and the steps where draws are cheap, all of them with `-m slow`.

Every check has false-failure rate <= FF = 1e-7 (exact binomial); the module makes about
4,300 checks in CI (so <= 5e-4 in all, Bonferroni), 5,900 with `-m slow` (<= 6e-4). The draws
are the mechanism's own: node noise from its keyed sampler (`_draw_nodes`: the real float or
discrete sampler, i.i.d. over nodes), combined as its left factor combines them (the tree's
signed nodes of `_step_nodes`, the Toeplitz coefficients), which `test_draws_are_the_release`
checks against `release`. Where the draws are many (width checks) the coverage checks use
them all.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from transforms.mechanisms import make, tails

MECHANISMS = [("binary_tree", {}), ("kary_tree", {"k": 4}), ("kary_subtraction", {}),
              ("smooth_binary", {}), ("sqrt_toeplitz", {}), ("blt", {}),
              ("naive_composition", {}), ("input_perturbation", {})]
FAMILIES = [("float", {"epsilon": 1.0}), ("float", {"rho": 0.5}),
            ("discrete", {"epsilon": 1.0}), ("discrete", {"rho": 0.5})]
LEVELS = (0.9, 0.95, 0.99)
HORIZONS = (100, 1000)
FF = 1e-7
DRAWS = 20_000
WIDTH_DRAWS = (20_000, 50_000, 100_000, 200_000, 400_000, 800_000, 1_600_000, 3_200_000)
CI_NODE_BUDGET = 2e7   # nodes a CI width check may draw (per configuration)


def configurations():
    out = []
    for name, params in MECHANISMS:
        for noise, privacy in FAMILIES:
            try:
                make(name, 4, noise=noise, seed=0, **privacy, **params)
            except ValueError:  # sqrt_toeplitz has no discrete pure-DP noise, blt no discrete
                continue
            label = f"{name}-{noise}-{next(iter(privacy))}"
            out.append(pytest.param(name, params, noise, privacy, id=label))
    return out


def build(name, params, noise, privacy, horizon):
    return make(name, horizon, noise=noise, seed=11, **privacy, **params)


# ----- the noise, drawn as the mechanism draws it ---------------------------------------------
def factor(mechanism) -> float:
    """What multiplies the combined node noise in the release."""
    if mechanism.discrete:
        return mechanism._noise_node()[1]
    return mechanism.node_scale


def signed_nodes(mechanism, step):
    """(+1 nodes, -1 nodes) of a tree's step (its rule `_step_nodes`, pruned nodes left out),
    as (level, index) pairs."""
    plus, minus = [], []
    for negative, nodes in mechanism._step_nodes(step):
        for level, index, pruned in nodes:
            if not pruned:
                (minus if negative else plus).append((level, index))
    return plus, minus


def draws(mechanism, steps, count, stream="acceptance"):
    """count x len(steps) draws of the noise at `steps` (1-based), in chunks of rows."""
    source = mechanism.for_stream(stream)
    out = np.empty((count, len(steps)))
    offset = 0
    for first in range(0, count, 4000):
        rows = min(4000, count - first)
        if hasattr(mechanism, "_step_nodes"):  # trees: signed sums of distinct i.i.d. nodes
            for i, t in enumerate(steps):
                plus, minus = signed_nodes(mechanism, t)
                n = len(plus) + len(minus)
                z = source._draw_nodes(0, offset, rows * n).reshape(rows, n)
                offset += rows * n
                out[first:first + rows, i] = (z[:, :len(plus)].sum(axis=1)
                                              - z[:, len(plus):].sum(axis=1))
            continue
        # Toeplitz L: step t is sum_j l_j z_{t-1-j} over the nonzero l_j
        left = mechanism.left_coefficients()
        used = sorted({t - 1 - j for t in steps for j in np.nonzero(left[:t])[0]})
        z = source._draw_nodes(0, offset, rows * len(used)).reshape(rows, len(used))
        offset += rows * len(used)
        column = {c: k for k, c in enumerate(used)}
        for i, t in enumerate(steps):
            if np.count_nonzero(left[:t]) == t:  # every node: one matrix product
                index = [column[c] for c in range(t)]
                out[first:first + rows, i] = z[:, index] @ left[:t][::-1]
            else:
                out[first:first + rows, i] = sum(left[j] * z[:, column[t - 1 - j]]
                                                 for j in np.nonzero(left[:t])[0])
    return factor(mechanism) * out


def release_formula(mechanism, stream, horizon):
    """The noise of `stream` at every step by the same formula as `draws`, from that stream's
    own node noise (the mechanism's `_draw`)."""
    source = mechanism.for_stream(stream)
    if hasattr(mechanism, "_step_nodes"):
        out = []
        for t in range(1, horizon + 1):
            plus, minus = signed_nodes(mechanism, t)
            total = sum(float(source._draw(level, index, 1)[0]) for level, index in plus)
            total -= sum(float(source._draw(level, index, 1)[0]) for level, index in minus)
            out.append(total)
        return factor(mechanism) * np.array(out)
    z = source._draw(0, 0, horizon)
    left = mechanism.left_coefficients()
    return factor(mechanism) * np.array([left[:t][::-1] @ z[:t]
                                         for t in range(1, horizon + 1)])


# ----- exact tails for the expected counts ----------------------------------------------------
def exact_tail(mechanism, step, x):
    """P(|noise_step| > x) from `tails` (continuous: to 1e-10; integer sums: exact at the
    lattice; discrete square root: the smoothed law, see `tail_range`)."""
    node, scale = mechanism._noise_node()
    rows = mechanism._noise_rows()
    if "counts" in rows:
        return float(tails.step_tails(node, np.floor(x / scale + 1e-9) if node.lattice
                                      else x / scale, counts=[rows["counts"][step - 1]])[0])
    return float(tails.step_tails(node, x / scale,
                                  coefficients=rows["coefficients"][:step])[-1])


def smoothed(mechanism) -> bool:
    return mechanism.discrete and "coefficients" in mechanism._noise_rows()


def tail_range(mechanism, step, x):
    """(low, high) bounds on P(|noise_step| > x)."""
    if smoothed(mechanism) and step > 1:  # P(|S'| > x + a) <= P(|S| > x) <= P(|S'| > x - a)
        a = mechanism._noise_node()[1] * float(np.max(np.abs(
            mechanism.left_coefficients()[:step])))
        return exact_tail(mechanism, step, x + a), exact_tail(mechanism, step, max(x - a, 0))
    p = exact_tail(mechanism, step, x)
    return p, p


def band(count, low, high):
    """Two-sided binomial acceptance region for `count` draws, false failure <= FF."""
    return (stats.binom.ppf(FF / 2, count, low), stats.binom.isf(FF / 2, count, high))


def width_draws(mechanism, step, half, alpha):
    """The fewest draws (of WIDTH_DRAWS) making the 1 % width check's false-failure rate
    <= FF, from the exact tails at 0.99 c and 1.01 c (or None)."""
    narrow = tail_range(mechanism, step, 0.99 * half)[0]
    wide = tail_range(mechanism, step, 1.01 * half)[1]
    for n in WIDTH_DRAWS:
        k = math.floor(n * alpha)
        rate = stats.binom.cdf(k, n, narrow) + stats.binom.sf(k, n, wide)
        if rate <= FF:
            return n
    return None


def check_configuration(name, params, noise, privacy, horizon, width_budget):
    mechanism = build(name, params, noise, privacy, horizon)
    steps = [1, 2, 10, horizon // 2, horizon]
    # the noise's quantile: the half-width less the release's rounding bound (the discrete
    # square root's; 0 elsewhere), which covers what the draws of L z do not hold
    halves = {level: mechanism.confidence_half_width(level) - mechanism.rounding_bound()
              for level in LEVELS}
    continuous = not mechanism.discrete or smoothed(mechanism)
    # the draws the width checks need, where affordable
    nodes_per_draw = sum(len(signed_nodes(mechanism, t)[0]) + len(signed_nodes(mechanism,
                         t)[1]) for t in steps) if hasattr(mechanism, "_step_nodes") else None
    plans = {}
    for level in LEVELS:
        for i, t in enumerate(steps):
            n = width_draws(mechanism, t, halves[level][t - 1], 1 - level) if continuous \
                else None
            if n is None:
                continue
            cost = n * (nodes_per_draw if nodes_per_draw is not None else
                        (t if name != "naive_composition" else 1))
            if cost <= width_budget:
                plans[(level, t)] = n
    count = max([DRAWS] + list(plans.values()))
    if hasattr(mechanism, "_step_nodes") or name == "naive_composition":
        noise_draws = draws(mechanism, steps, count)
        width_steps = {t for (_, t) in plans}
    else:  # every node of the step: the many draws only for the cheap (early) steps
        noise_draws = draws(mechanism, steps, DRAWS)
        cheap = [t for t in steps if any(key[1] == t for key in plans)]
        extra = draws(mechanism, cheap, count, stream="width") if cheap else None
        width_steps = set(cheap)
    checks = widths = 0
    for level in LEVELS:
        alpha = 1 - level
        half = halves[level]
        for i, t in enumerate(steps):
            sample = np.abs(noise_draws[:, i])
            c = half[t - 1]
            # (i) coverage
            if mechanism.discrete:
                low, high = tail_range(mechanism, t, c)
            else:
                low, high = alpha - 2e-10, alpha
            assert high <= alpha + 1e-12, (level, t, high)
            if smoothed(mechanism) and t > 1:
                # c - 2a does not cover: c is within two grid units of the exact quantile
                assert high >= alpha - 1e-9, (level, t, high)
            beyond = int(np.sum(sample > c))
            lo, hi = band(sample.shape[0], low, high)
            assert lo <= beyond <= hi, (horizon, level, t, beyond / sample.shape[0], low, high)
            checks += 1
            if mechanism.discrete and not smoothed(mechanism) and c >= 1:
                # c is the smallest covering integer: one less does not cover
                below = exact_tail(mechanism, t, c - 1)
                assert below > alpha, (level, t, below)
                lo, hi = band(sample.shape[0], below, below)
                assert lo <= int(np.sum(sample > c - 1)) <= hi, (level, t)
                checks += 1
            # (ii) width
            n = plans.get((level, t))
            if n is None or t not in width_steps:
                continue
            if hasattr(mechanism, "_step_nodes") or name == "naive_composition":
                wide_sample = np.abs(noise_draws[:n, i])
            else:
                wide_sample = np.abs(extra[:n, cheap.index(t)])
            k = math.floor(n * alpha)
            assert np.sum(wide_sample > 0.99 * c) > k, (level, t)   # narrower under-covers
            assert np.sum(wide_sample > 1.01 * c) <= k, (level, t)  # wider over-covers
            q = np.quantile(wide_sample, level)
            assert 0.99 * c <= q <= 1.01 * c, (level, t, q / c)
            widths += 1
    return checks, widths


# ----- the tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("name,params,noise,privacy", configurations())
def test_draws_are_the_release(name, params, noise, privacy):
    """The acceptance draws use the release's own formula: on three streams, release(0) equals
    the signed node sums / coefficient products of their node noise (exactly for integer sums,
    to 1e-9 relative for float sums, convolutions and recurrences)."""
    for horizon in (1, 100):
        mechanism = build(name, params, noise, privacy, horizon)
        for stream in ("s0", 7, b"x"):
            released = mechanism.for_stream(stream).release(np.zeros(horizon))
            formula = release_formula(mechanism, stream, horizon)
            if mechanism.discrete and not smoothed(mechanism):
                assert np.array_equal(released, formula)
            else:
                np.testing.assert_allclose(released, formula, rtol=1e-9,
                                           atol=1e-9 * np.max(np.abs(formula)))


@pytest.mark.parametrize("name,params,noise,privacy", configurations())
def test_half_widths_are_the_exact_quantiles_of_the_noise(name, params, noise, privacy):
    """(i) coverage in its binomial band at every level and step, for T = 100 and 1000;
    (ii) the empirical quantile within 1 % where the draws are cheap (module docstring)."""
    changed = (noise == "float" and "epsilon" in privacy) or (
        name == "sqrt_toeplitz" and noise == "discrete")
    for horizon in HORIZONS:  # width checks at T = 100 (steps 1, 2, 10 have the same law)
        budget = CI_NODE_BUDGET if changed and horizon == 100 else 0
        check_configuration(name, params, noise, privacy, horizon, budget)


@pytest.mark.slow
@pytest.mark.parametrize("name,params,noise,privacy", configurations())
def test_half_widths_are_within_one_percent_everywhere(name, params, noise, privacy):
    """(ii) on every continuous law and step whose draws cost <= 2e8 nodes (up to 3.2 million
    draws; with (i) again on those draws)."""
    for horizon in HORIZONS:
        check_configuration(name, params, noise, privacy, horizon, 2e8)


@pytest.mark.parametrize("name,params,noise,privacy", configurations())
def test_coverage_on_changing_data(name, params, noise, privacy):
    """Release changing counts (x_t ~ Poisson(20 + 15 sin(t / 7)), fixed seed) on 600 keyed
    streams at T = 100 and level 0.9, with |released - truth| <= c_t: per step, the number of
    covered streams is in its binomial band around the exact coverage P(|noise_t| <= c_t)
    (false failure FF each; integer sums: c_t - 1 would not cover); pooled over steps, the
    fraction covered is within 5.33 standard errors of the mean exact coverage (steps within a
    stream are dependent: the error is estimated across streams; false failure ~1e-7)."""
    horizon, streams, level = 100, 600, 0.9
    mechanism = build(name, params, noise, privacy, horizon)
    half = mechanism.confidence_half_width(level)
    rng = np.random.default_rng(2024)
    covered = np.empty((streams, horizon), dtype=bool)
    for s in range(streams):
        x = rng.poisson(20 + 15 * np.sin(np.arange(horizon) / 7.0)).astype(np.float64)
        released = mechanism.for_stream(s).release(x)
        covered[s] = np.abs(released - np.cumsum(x)) <= half
    if mechanism.discrete:
        # the release is off by its noise plus at most r (the rounding bound: 0 but for the
        # discrete square root), so it misses half when the noise exceeds half + r, and only
        # when it exceeds half - r
        r = mechanism.rounding_bound()
        ranges = np.array([(tail_range(mechanism, t, half[t - 1] + r[t - 1])[0],
                            tail_range(mechanism, t, half[t - 1] - r[t - 1])[1])
                           for t in range(1, horizon + 1)])
        if not smoothed(mechanism):  # integer sums: each c_t is the smallest covering integer
            assert all(exact_tail(mechanism, t, half[t - 1] - 1) > 1 - level
                       for t in range(1, horizon + 1) if half[t - 1] >= 1)
    else:
        ranges = np.tile([1 - level - 2e-10, 1 - level], (horizon, 1))
    assert np.all(ranges[:, 1] <= 1 - level + 1e-12)
    for t in range(horizon):
        lo, hi = band(streams, ranges[t, 0], ranges[t, 1])
        assert lo <= streams - covered[:, t].sum() <= hi, (t + 1, covered[:, t].mean())
    per_stream = covered.mean(axis=1)
    expected_low, expected_high = 1 - ranges[:, 1].mean(), 1 - ranges[:, 0].mean()
    error = per_stream.std(ddof=1) / math.sqrt(streams)
    assert expected_low - 5.33 * error <= per_stream.mean() <= expected_high + 5.33 * error, (
        per_stream.mean(), expected_low, expected_high, error)


def test_no_step_falls_back_to_a_chernoff_bound():
    """Every mechanism's every step is inverted exactly (or in closed form) at T = 8760,
    the hourly year, for both noise families and a tight level."""
    for name, params in MECHANISMS + [("kary_tree", {"k": 19})]:
        for noise, privacy in FAMILIES:
            try:
                mechanism = build(name, params, noise, privacy, 8760)
            except ValueError:
                continue
            node, _ = mechanism._noise_node()
            _, how = tails._quantiles(node, 0.001, **mechanism._noise_rows())
            assert not np.any(how == tails.CHERNOFF), (name, noise, privacy)


def test_half_widths_are_cached_copies():
    mechanism = build("sqrt_toeplitz", {}, "float", {"epsilon": 1.0}, 500)
    first = mechanism.confidence_half_width(0.9)
    first[:] = -1.0
    again = mechanism.confidence_half_width(0.9)
    assert np.all(again > 0)
    assert mechanism.for_stream("other").confidence_half_width(0.9).tolist() == again.tolist()
    together = mechanism.confidence_half_width(0.9, simultaneous=True)
    assert np.all(together > again)

"""Private key selection (`transforms.mechanisms.selection`, docs/selection.md): the threshold's
tail bounds against exact laws, the privacy of selection by brute force over every output
(hockey-stick divergence at small T), an empirical audit on the bundled job's bounds, and the
release of a selected key against the public-key release of the same stream.

Every test uses fixed seeds. The brute-force and exact tests are deterministic computations
(false-failure rate 0: only a change of the code can make them fail); the statistical tests
state their false-failure rate over the choice of seed in their docstrings.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from scipy import stats

from transforms.mechanisms import NoiseSource, discrete, make, selection
from transforms.mechanisms.discrete import BitStream
from transforms.validation import ValidationError

DELTA = 0.05     # the brute force's delta: large, so that selection events have visible mass
MU = 1e-6        # target truncated mass of the brute force's node grid


# ----- exact laws by enumeration ------------------------------------------------------------
class Indicator(NoiseSource):
    """Node noise 1 at one node (level, index), 0 elsewhere; records every node read."""

    def __init__(self, node=None):
        self.node, self.read = node, set()

    def _values(self, level, start, count):
        self.read.update((level, i) for i in range(start, start + count))
        out = np.zeros(max(count, 0))
        if self.node is not None and self.node[0] == level and 0 <= self.node[1] - start < count:
            out[self.node[1] - start] = 1.0
        return out

    def unit_noise(self, distribution, stream, level, start, count):
        return self._values(level, start, count)

    def discrete_noise(self, sampler, stream, level, start, count):
        return self._values(level, start, count)


def real_left(name, horizon, **kwargs):
    """(L, nodes): the release noise is L z over the listed (level, index) nodes, L read off the
    mechanism itself (its release of zeros with noise 1 at one node of those it reads)."""
    recorder = Indicator()
    base = make(name, horizon, noise_source=recorder, **kwargs)
    base.release(np.zeros(horizon))
    columns, nodes = [], []
    for node in sorted(recorder.read):
        probe = make(name, horizon, noise_source=Indicator(node), **kwargs)
        probe._cache["sensitivity"] = base.sensitivity  # the same (computed once)
        column = probe.release(np.zeros(horizon))
        if np.any(column):
            columns.append(column)
            nodes.append(node)
    return np.array(columns).T.astype(np.int64), nodes


def counts_mechanism(name, horizon, contributions, epsilon=1.0, **params):
    """(a count key's mechanism, discrete noise, seed 3; its left factor and nodes)."""
    kwargs = dict(epsilon=epsilon, max_contributions=contributions,
                  interval_bound=contributions, **params)
    left, nodes = real_left(name, horizon, **kwargs)
    return make(name, horizon, seed=3, **kwargs), left, nodes


_GRIDS = {}


def cached_grid(mechanism, left, mu=MU):
    """`noise_grid`, computed once per law (sampler and left factor) in this process."""
    key = (mechanism.sampler.parameter, left.tobytes(), left.shape, mu)
    if key not in _GRIDS:
        _GRIDS.clear()  # one grid held at a time (the longer horizons' are large)
        _GRIDS[key] = noise_grid(mechanism, left, mu)
    return _GRIDS[key]


def noise_grid(mechanism, left, mu=MU):
    """Every node vector z in [-Z, Z]^N with its probability (discrete Laplace of the
    mechanism's sampler), as (n = L z per vector, probabilities, mu): the vectors left out have
    total probability <= mu = N P(|z| > Z) (union bound)."""
    assert mechanism.sampler.kind == discrete.DISCRETE_LAPLACE
    q = math.exp(-1.0 / mechanism.sampler.parameter)
    nodes = left.shape[1]
    z_max = 1
    while nodes * 2.0 * q ** (z_max + 1) / (1.0 + q) > mu:
        z_max += 1
    missing = nodes * 2.0 * q ** (z_max + 1) / (1.0 + q)
    z = np.arange(-z_max, z_max + 1)
    pmf = (1.0 - q) / (1.0 + q) * q ** np.abs(z)
    grids = np.meshgrid(*([z] * nodes), indexing="ij")
    vectors = np.stack([g.reshape(-1) for g in grids], axis=1)
    weights = np.ones(vectors.shape[0])
    for j in range(nodes):
        weights *= pmf[vectors[:, j] + z_max]
    return vectors @ left.T, weights, missing


WIDTH, LOW = 1024, -500  # value codes: y - LOW + 1 in [1, WIDTH); 0 = not published


def output_law(grid, totals, start, tau):
    """The law of one key's output (selection step, values published from it on; or nothing)
    over the grid: (sorted output codes, probabilities). The key has state from `start` (its
    first step with data); its running totals are `totals`."""
    n, weights, _ = grid
    horizon = n.shape[1]
    y = n + np.asarray(totals, dtype=np.int64)[None, :]
    hit = (y >= tau) & (np.arange(horizon)[None, :] >= start)
    selected = np.nonzero(hit.any(axis=1))[0]  # the other vectors publish nothing
    y, step = y[selected], np.argmax(hit[selected], axis=1)
    code = step.astype(np.int64)
    for t in range(horizon):
        value = np.where(step <= t, y[:, t] - LOW + 1, 0)
        assert value.min() >= 0 and value.max() < WIDTH
        code = code * WIDTH + value
    codes, inverse = np.unique(code, return_inverse=True)
    mass = np.bincount(inverse, weights=weights[selected], minlength=codes.shape[0])
    silent = float(np.sum(weights)) - float(np.sum(weights[selected]))
    none = nothing(horizon)[0]
    return np.append(codes, none), np.append(mass, silent)  # none sorts last (step = T)


def nothing(horizon):
    """The output law of a key with no data: nothing published, with probability 1."""
    return np.array([horizon * WIDTH ** horizon], dtype=np.int64), np.array([1.0])


def aligned(law_p, law_q):
    codes = np.union1d(law_p[0], law_q[0])
    p, q = np.zeros(codes.shape[0]), np.zeros(codes.shape[0])
    p[np.searchsorted(codes, law_p[0])] = law_p[1]
    q[np.searchsorted(codes, law_q[0])] = law_q[1]
    return p, q


def hockey_stick(pairs, epsilon):
    """sum_o max(0, P(o) - e^epsilon Q(o)) for the product over keys of independent (P_i, Q_i)
    (aligned arrays): one key directly; two keys through the loss of the first,
    sum_o1 p1 H2(epsilon - L1(o1)) with H2(a) = sum_o2 max(0, p2 - e^a q2) from the second's
    outputs sorted by their loss."""
    if len(pairs) == 1:
        p, q = pairs[0]
        return float(np.sum(np.maximum(0.0, p - math.exp(epsilon) * q)))
    (p1, q1), (p2, q2) = pairs
    keep = p2 > 0
    p2, q2 = p2[keep], q2[keep]
    with np.errstate(divide="ignore"):
        loss2 = np.where(q2 > 0, np.log(p2) - np.log(np.where(q2 > 0, q2, 1.0)), np.inf)
    order = np.argsort(-loss2, kind="stable")
    loss2, p2, q2 = loss2[order], p2[order], q2[order]
    cp, cq = np.concatenate(([0.0], np.cumsum(p2))), np.concatenate(([0.0], np.cumsum(q2)))
    keep = p1 > 0
    p1, q1 = p1[keep], q1[keep]
    with np.errstate(divide="ignore"):
        a = np.where(q1 > 0, epsilon - np.log(p1) + np.log(np.where(q1 > 0, q1, 1.0)), -np.inf)
    count = np.searchsorted(-loss2, -a, side="left")  # outputs o2 with L2(o2) > a
    with np.errstate(over="ignore", invalid="ignore"):
        inner = np.where(count > 0, cp[count] - np.exp(a) * cq[count], 0.0)
    return float(np.sum(p1 * np.maximum(inner, 0.0)))


def test_the_product_hockey_stick_equals_the_sum_over_all_output_pairs():
    """The two-key formula against the outer product on random laws (with zeros on both
    sides)."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        laws = []
        for _ in range(2):
            p, q = rng.random(30), rng.random(30)
            p[rng.random(30) < 0.2] = 0.0
            q[rng.random(30) < 0.2] = 0.0
            laws.append((p / p.sum(), q / q.sum()))
        eps = float(rng.uniform(0.0, 2.0))
        (p1, q1), (p2, q2) = laws
        direct = np.sum(np.maximum(0.0, np.outer(p1, p2) - math.exp(eps) * np.outer(q1, q2)))
        assert hockey_stick(laws, eps) == pytest.approx(direct, rel=1e-12, abs=1e-15)


class Key:
    """One key of a neighbouring pair: the unit u's contributions and the other units'."""

    def __init__(self, horizon, unit, others=None):
        self.unit = np.asarray(unit, dtype=np.int64)
        self.others = (np.zeros(horizon, dtype=np.int64) if others is None
                       else np.asarray(others, dtype=np.int64))

    @staticmethod
    def start(x):
        nonzero = np.nonzero(x)[0]
        return int(nonzero[0]) if nonzero.shape[0] else None

    def laws(self, grid, tau):
        """(law under D = with u, law under D' = without u)."""
        horizon = grid[0].shape[1]
        with_u = self.unit + self.others
        law_d = output_law(grid, np.cumsum(with_u), self.start(with_u), tau)
        start = self.start(self.others)
        law_d2 = (nothing(horizon) if start is None
                  else output_law(grid, np.cumsum(self.others), start, tau))
        return aligned(law_d, law_d2)


def divergences(mechanism, left, keys, tau, epsilon, mu=MU):
    """(HS(D || D'), HS(D' || D), truncated mass) of the whole output over `keys` (each key
    its own noise: independent)."""
    grid = cached_grid(mechanism, left, mu)
    pairs = [key.laws(grid, tau) for key in keys]
    forward = hockey_stick(pairs, epsilon)
    backward = hockey_stick([(q, p) for p, q in pairs], epsilon)
    return forward, backward, len(keys) * grid[2]


# (name, key mechanism, m, K, keys): u's contributions and the other units' per key, T steps.
# Counts calibrate jointly (`calibration.calibrate`): each key has the full epsilon with
# S_{k,k}, and u's k contributions over its keys cost epsilon in all.
T3 = 3
CASES = {
    # a key carried by u alone: in D' it does not exist
    "unit_only_k1": ("binary_tree", 1, 1, [Key(T3, [1, 0, 0])]),
    "unit_only_k2": ("binary_tree", 2, 1, [Key(T3, [2, 0, 0])]),
    "unit_only_k2_spread": ("binary_tree", 2, 1, [Key(T3, [1, 0, 1])]),
    # a key shared with another unit from the start: pure post-processing
    "shared": ("binary_tree", 1, 1, [Key(T3, [1, 0, 0], [1, 0, 0])]),
    # shared, but the other unit's data start at step 2: the key's state starts earlier in D
    # (u's window [0, 2)), so the selection is not a post-processing of the public release
    "shared_late": ("binary_tree", 1, 1, [Key(T3, [1, 0, 0], [0, 0, 1])]),
    # m = 2: a shared key with a window and a key of u's own
    "m2_shared_late_and_unit_only": ("binary_tree", 2, 2,
                                     [Key(T3, [1, 0, 0], [0, 0, 2]), Key(T3, [1, 0, 0])]),
    # m = 2: two keys of u's own, and two shared keys with windows
    "m2_unit_only": ("binary_tree", 2, 2, [Key(T3, [1, 0, 0]), Key(T3, [0, 1, 0])]),
    "m2_shared_late": ("binary_tree", 2, 2,
                       [Key(T3, [1, 0, 0], [0, 1, 0]), Key(T3, [1, 0, 0], [0, 0, 1])]),
    # T = 4: the subtraction tree (4 nodes)
    "kary_unit_only_T4": ("kary_subtraction", 1, 1, [Key(4, [1, 0, 0, 0])]),
    "kary_shared_late_T4": ("kary_subtraction", 1, 1, [Key(4, [0, 1, 0, 0], [0, 0, 0, 1])]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_selection_is_epsilon_delta_private_by_brute_force(case):
    """For neighbouring inputs (u added / removed), every output set S has
    P(out in S) <= e^eps P(out' in S) + delta: the hockey-stick divergence of the exact output
    laws (selection steps and every published value of every key, over all node noise vectors
    of the grid) is <= delta in both directions, and within the lemma's own bound
    delta(tau) = m sum_t P(n_t >= tau - K). The grid leaves out mass mu (<= 1e-6 per key),
    which can raise a divergence by at most mu: it is added before comparing. Deterministic."""
    name, k, m, keys = CASES[case]
    horizon = keys[0].unit.shape[0]
    mechanism, left, _ = counts_mechanism(name, horizon, k)
    tau = selection.selection_threshold(mechanism, m, k, DELTA)
    bound = selection.selection_delta(mechanism, tau, m, k)
    forward, backward, mu = divergences(mechanism, left, keys, tau, 1.0)
    assert bound <= DELTA
    assert forward + mu <= bound, (case, tau, forward, bound)
    assert backward + mu <= bound, (case, tau, backward, bound)
    if case == "shared":
        assert forward + backward <= 1e-6  # post-processing: no delta at all
    if case == "shared_late" or case.startswith("unit_only"):
        assert forward > 1e-4  # the window's delta is real (the bound is not vacuous)


@pytest.mark.parametrize("case", ["unit_only_k1", "unit_only_k2", "shared_late",
                                  "m2_shared_late_and_unit_only"])
def test_the_brute_force_catches_a_halved_threshold(case):
    """The same divergence with tau / 2: at least delta even after removing the truncated mass
    (a divergence computed on the grid exceeds the true one by at most e^eps mu).
    Deterministic."""
    name, k, m, keys = CASES[case]
    mechanism, left, _ = counts_mechanism(name, keys[0].unit.shape[0], k)
    tau = selection.selection_threshold(mechanism, m, k, DELTA)
    forward, _, mu = divergences(mechanism, left, keys, math.floor(tau / 2), 1.0)
    assert forward - math.e * mu > DELTA, (case, forward)


def test_unit_only_divergence_is_the_selection_probability_and_the_lemma_bounds_it():
    """For a key of u's own, HS(D || D') is exactly P(the key is ever published) (D' publishes
    nothing), and that probability is at most delta(tau) at every threshold (the union bound
    over the steps). Deterministic."""
    mechanism, left, _ = counts_mechanism("binary_tree", T3, 2)
    grid = cached_grid(mechanism, left)
    for tau in (11, 19):
        p, q = Key(T3, [2, 0, 0]).laws(grid, tau)
        published = float(np.sum(p[q == 0]))
        assert hockey_stick([(p, q)], 1.0) == pytest.approx(published, abs=1e-12)
    highest = np.max(grid[0], axis=1) + 2  # u's running total is 2 at every step
    for tau in range(3, 40):
        published = float(np.sum(grid[1][highest >= tau])) + grid[2]
        assert published <= selection.selection_delta(mechanism, tau, 1, 2), tau


@pytest.mark.slow
@pytest.mark.parametrize("name,horizon,k", [("kary_subtraction", 5, 1),
                                            ("input_perturbation", 5, 1),
                                            ("binary_tree", 4, 1),
                                            ("kary_subtraction", 4, 2)])
def test_brute_force_at_longer_horizons(name, horizon, k):
    """As the brute force above at T = 4, 5 (grids leaving out mu <= 1e-4, added as above):
    a key of u's own, and a shared key whose other data start at the last step (u's window is
    every step before). Deterministic; about a minute and 1 GB of memory."""
    mechanism, left, _ = counts_mechanism(name, horizon, k)
    tau = selection.selection_threshold(mechanism, 1, k, DELTA)
    bound = selection.selection_delta(mechanism, tau, 1, k)
    unit = [k] + [0] * (horizon - 1)
    for keys in ([Key(horizon, unit)], [Key(horizon, unit, [0] * (horizon - 1) + [1])]):
        forward, backward, mu = divergences(mechanism, left, keys, tau, 1.0, mu=1e-4)
        assert forward + mu <= bound and backward + mu <= bound, (forward, backward, bound)


# ----- the bounds behind the threshold ------------------------------------------------------
def exact_upper_tails(mechanism, left, c):
    """Per step, P(n_t >= c) for a tree with discrete Laplace nodes (+-1 weights, the rows of
    its left factor): the convolution of the node pmf over the row's nodes (the pmf cut at
    1e-22: lower by at most 1e-21)."""
    assert set(np.unique(left)) <= {-1, 0, 1}
    base = mechanism.sampler.pmf(1e-22)
    out = []
    for count in np.count_nonzero(left, axis=1):  # nodes per step
        law = np.array([1.0])
        for _ in range(count):
            law = np.convolve(law, base)
        center = (law.shape[0] - 1) // 2
        out.append(float(np.sum(law[center + c:])) if c <= center else 0.0)
    return np.array(out)


@pytest.mark.parametrize("name,params", [("binary_tree", {}), ("kary_subtraction", {"k": 3}),
                                         ("smooth_binary", {})])
def test_the_bound_is_the_exact_tail_plus_at_most_its_stated_error(name, params):
    """Per step, the bound on P(n_t >= c) is never below the exact convolution, and above it by
    at most the tails' error (1e-10 two-sided, so 0.5e-10) plus rounding; selection_delta
    (m = 1, K = 0) is their sum. Deterministic."""
    mechanism, left, _ = counts_mechanism(name, 20, 2, **params)
    noise = selection._noise(mechanism)
    for c in (1, 5, 17, 40, 80, 160):
        exact = exact_upper_tails(mechanism, left, c)
        bound = selection._upper(noise, np.full(20, float(c)))
        assert np.all(exact * (1 - 1e-12) <= bound), c
        assert np.all(bound <= exact + 0.5e-10 + 1e-12), (c, np.max(bound - exact))
        if np.sum(bound) < 1:
            assert selection.selection_delta(mechanism, c, 1, 0) == pytest.approx(
                np.sum(bound), rel=1e-8)


def test_continuous_bounds_match_the_closed_forms():
    """Float Laplace (input perturbation at T = 1: one node, P(n >= c) = e^(-c/b) / 2) and
    float Gaussian (erfc) steps: the bound is the exact tail, to rounding. Deterministic."""
    laplace = make("naive_composition", 1, epsilon=0.5, seed=1, noise="float")
    b = laplace.node_scale
    for c in (0.5, 3.0, 10.0):
        assert selection.selection_delta(laplace, c, 1, 0) == pytest.approx(
            0.5 * math.exp(-c / b), rel=1e-8)
    gaussian = make("naive_composition", 4, rho=0.5, seed=1, noise="float")
    sd = gaussian.noise_std()
    for c in (5.0, 10.0, 20.0):
        exact = sum(0.5 * math.erfc(c / (s * math.sqrt(2.0))) for s in sd)
        assert selection.selection_delta(gaussian, c, 1, 0) == pytest.approx(exact, rel=1e-8)


def test_below_the_tails_accuracy_the_chernoff_bound_takes_over():
    """At delta far below T x 1e-10 the threshold is still finite and valid: it meets the
    Chernoff bound, and the exact tail (convolution) at it is below delta. Deterministic."""
    mechanism, left, _ = counts_mechanism("binary_tree", 16, 1)
    tau = selection.selection_threshold(mechanism, 3, 1, 1e-15)
    assert selection.selection_delta(mechanism, tau, 3, 1) <= 1e-15
    assert 3 * float(np.sum(exact_upper_tails(mechanism, left, int(tau) - 1))) <= 1e-15


@pytest.mark.parametrize("name,privacy,noise", [
    ("binary_tree", {"epsilon": 1.0}, "discrete"), ("kary_subtraction", {"rho": 0.5}, "discrete"),
    ("sqrt_toeplitz", {"rho": 0.5}, "discrete"), ("sqrt_toeplitz", {"rho": 0.5}, "float"),
    ("blt", {"rho": 0.5}, "float"), ("smooth_binary", {"epsilon": 1.0}, "float")])
def test_the_threshold_is_the_smallest_that_meets_delta(name, privacy, noise):
    """delta(tau) <= delta, and one grid unit less (integer releases) or 1e-6 less (continuous)
    does not meet it; tau grows with m and K. Deterministic."""
    mechanism = make(name, 48, max_contributions=6, interval_bound=6, seed=2, noise=noise,
                     **privacy)
    tau = selection.selection_threshold(mechanism, 2, 6, 1e-6)
    assert selection.selection_delta(mechanism, tau, 2, 6) <= 1e-6
    below = tau - 1.0 if mechanism.integer_release else tau * (1 - 1e-6)
    assert selection.selection_delta(mechanism, below, 2, 6) > 1e-6
    if mechanism.integer_release:
        assert tau == int(tau)
    assert selection.selection_threshold(mechanism, 4, 6, 1e-6) > tau
    assert selection.selection_threshold(mechanism, 2, 12, 1e-6) > tau


# ----- the audit --------------------------------------------------------------------------------
def vectorised_noise(mechanism, left, count, seed):
    """count independent draws of the mechanism's release noise (n_1..n_T) as the mechanism
    makes them: node values from its own sampler (`DiscreteSampler.sample` on uniform 64-bit
    words and sign bits, here from a seeded PCG64 instead of SHAKE-128; the rare exact-tail
    bits from SHAKE-128 of a seeded salt), combined by its left factor (`real_left`)."""
    rng = np.random.default_rng(seed)
    size = count * left.shape[1]
    top = rng.integers(0, np.iinfo(np.uint64).max, size=size, dtype=np.uint64, endpoint=True)
    negative = rng.integers(0, 2, size=size).astype(bool)
    salt = rng.bytes(16)

    def node_bits(i):
        return BitStream(lambda n: hashlib.shake_128(salt + int(i).to_bytes(8, "little"))
                         .digest(n))

    z = mechanism.sampler.sample(top, negative, node_bits).astype(np.float64)
    return z.reshape(count, left.shape[1]) @ left.T.astype(np.float64)


def clopper_pearson(hits, n, alpha=1e-4):
    low = stats.beta.ppf(alpha, hits, n - hits + 1) if hits else 0.0
    high = stats.beta.ppf(1 - alpha, hits + 1, n - hits) if hits < n else 1.0
    return low, high


ACTIVE_USERS = dict(epsilon=1.0, max_contributions=6, interval_bound=6, k=11, sparsify=True,
                    prune=True)


def active_users_mechanism():
    """The bundled job's key mechanism (configs/active_users.yaml: T = 48, epsilon = 1, k = 6,
    m = 1) as `auto` chooses it (the subtraction tree, k = 11), with its left factor."""
    left, nodes = real_left("kary_subtraction", 48, **ACTIVE_USERS)
    return make("kary_subtraction", 48, seed=11, **ACTIVE_USERS), left, nodes


def test_vectorised_noise_is_the_mechanisms_noise():
    """The audit's n = L z reproduces `release` bit for bit on real streams (z: the nodes'
    values read from the mechanism's own keyed source), and its vectorised draws have the
    per-step variance of `noise_variance`: 200,000 draws, relative error <= 2 % (the sample
    variance's relative sd is ~0.35 %: false-failure rate < 1e-8)."""
    mechanism, left, nodes = active_users_mechanism()
    x = np.zeros(48)
    x[[0, 3, 17]] = [2, 2, 2]
    for key in ("eu-west", "nobody-listed", 7):
        stream = mechanism.for_stream(key)
        z = np.array([stream._draw(level, j, 1)[0] for level, j in nodes])
        assert np.array_equal(stream.release(x), np.cumsum(x) + left @ z)
    noise = vectorised_noise(mechanism, left, 200_000, 1)
    assert np.all(noise == np.round(noise))
    assert np.allclose(noise.var(axis=0), mechanism.noise_variance(), rtol=0.02)


def audit(mechanism, left, tau, contribution, releases, seed):
    """(hits, Clopper-Pearson bounds): releases in which a key carried by one unit alone, with
    running total `contribution` from step 0 (its maximum at every step), is published."""
    hits, done, chunk = 0, 0, 100_000
    while done < releases:
        n = vectorised_noise(mechanism, left, min(chunk, releases - done), seed + done)
        hits += int(np.sum(np.any(n + contribution >= tau, axis=1)))
        done += n.shape[0]
    return hits, clopper_pearson(hits, releases)


def test_audit_a_key_of_one_unit_is_published_at_most_delta_often():
    """200,000 releases of the bundled job's bounds (active_users: T = 48, epsilon = 1, k = 6,
    m = 1) with delta = 1e-2 and the real threshold (tau = 174): a key that one unit alone
    carries with its maximal contribution (6 from step 0) is published at a rate whose
    Clopper-Pearson upper bound (one-sided 1e-4) is <= 1.05 delta; the same test with tau / 2
    is flagged (its lower bound is above delta).
    False-failure rate: the true rate is ~5.1e-3 (2.2 million draws: 11,239 hits), half of the
    union bound delta(tau) = 9.8e-3; the upper bound exceeds 1.05e-2 only with >= ~1,950 hits
    of an expected ~1,020 (sd 32): probability < 1e-100. The control's rate is ~0.29 (58,000
    hits): its lower bound falls below 1e-2 with probability < 1e-100."""
    mechanism, left, _ = active_users_mechanism()
    delta, releases = 1e-2, 200_000
    tau = selection.selection_threshold(mechanism, 1, 6, delta)
    assert tau == 174.0
    hits, (_, upper) = audit(mechanism, left, tau, 6, releases, seed=2026)
    assert upper <= 1.05 * delta, (hits, upper)
    halved, (low, high) = audit(mechanism, left, tau / 2, 6, releases, seed=2026)
    assert not high <= 1.05 * delta and low > delta, (halved, low)


@pytest.mark.slow
@pytest.mark.parametrize("name,privacy", [("binary_tree", {"epsilon": 1.0}),
                                          ("kary_subtraction", {"rho": 0.5, "k": 5}),
                                          ("smooth_binary", {"epsilon": 1.0})])
def test_audit_other_mechanisms_at_two_keys(name, privacy):
    """As the audit, 1,000,000 releases, m = 2 (delta = 1e-2 for both of the unit's keys: each
    key's rate is held to the bound m sum_t P(n_t >= tau - K) / m <= delta / 2).
    False-failure rate: the rates measured are 3.3e-3, 3.5e-3 and 4.0e-3 (<= 0.8 delta / 2);
    the one-sided 1e-4 upper bound passes 1.05 delta / 2 only with >= ~5,100 hits of an expected
    <= 3,960 (sd 63): probability < 1e-50. The controls' rates are 0.26-0.43."""
    kwargs = dict(max_contributions=6, interval_bound=6, **privacy)
    mechanism = make(name, 48, seed=5, **kwargs)
    left, _ = real_left(name, 48, **kwargs)
    tau = selection.selection_threshold(mechanism, 2, 6, 1e-2)
    hits, (_, upper) = audit(mechanism, left, tau, 6, 1_000_000, seed=77)
    assert upper <= 1.05 * 0.5e-2, (hits, upper)
    _, (low, _) = audit(mechanism, left, tau / 2, 6, 200_000, seed=78)
    assert low > 0.5e-2


# ----- a selected key is a public key from its selection step on ----------------------------
SHARED = [("binary_tree", {"epsilon": 1.0}, "discrete"),
          ("kary_subtraction", {"epsilon": 1.0, "k": 19}, "discrete"),
          ("smooth_binary", {"epsilon": 1.0}, "discrete"),
          ("kary_tree", {"rho": 0.5, "k": 3}, "discrete"),
          ("sqrt_toeplitz", {"rho": 0.5}, "discrete"),
          ("sqrt_toeplitz", {"epsilon": 1.0}, "float"),
          ("blt", {"rho": 0.5}, "float"),
          ("input_perturbation", {"epsilon": 1.0}, "float")]


@pytest.mark.parametrize("name,privacy,noise", SHARED)
def test_a_selected_key_releases_what_its_public_key_release_does(name, privacy, noise):
    """A key all units share, selected without public keys (state from its first data, one
    step at a time, `select_key`), publishes from its selection step on exactly the values of
    the public-key release of its stream (`release(x)` of a separately built mechanism with
    the same secret): same noise, bit for bit; the selection step is the first step from the
    key's first data at or above tau. Deterministic."""
    horizon = 40
    rng = np.random.default_rng(9)
    for key, first in (("eu-west", 0), ("apac", 7), (3, 21)):
        x = np.zeros(horizon)
        x[first:] = rng.integers(20, 40, size=horizon - first)
        selecting = make(name, horizon, max_contributions=2, interval_bound=2, seed=4,
                         noise=noise, **privacy).for_stream(key)
        public = make(name, horizon, max_contributions=2, interval_bound=2, seed=4,
                      noise=noise, **privacy).for_stream(key).release(x)
        tau = selection.selection_threshold(selecting, 1, 2, 1e-6)
        step, published = selection.select_key(selecting, x, tau)
        assert step is not None and step == selection.first_selected(public, tau, start=first)
        assert step > first or public[first] >= tau
        assert np.array_equal(published, public[step:])


def test_a_key_without_data_has_no_records_and_nothing_before_its_data_counts():
    """No data: nothing published. A key whose noise alone would reach tau before its first
    data is not selected there (it has no state): selection starts at its first data.
    Deterministic."""
    mechanism = make("binary_tree", 16, epsilon=1.0, seed=4).for_stream("k")
    assert selection.select_key(mechanism, np.zeros(16), 0.0) == (None, pytest.approx([]))
    x = np.zeros(16)
    x[5] = 1
    public = mechanism.release(x)
    tau = float(np.max(public[:5]))  # reached before step 5 by noise alone
    step, _ = selection.select_key(mechanism, x, tau)
    assert step == selection.first_selected(public, tau, start=5)
    assert selection.first_selected(public, tau) < 5


def test_expected_selection_step_is_reached_with_the_stated_probability():
    """The key whose total grows by `rate` is selected by the returned step with probability
    >= 1/2 (and >= 0.9 for probability = 0.9), measured on 20,000 vectorised releases; at 1/2
    the step is no later than where the total alone reaches tau.
    False-failure rate: the measured fractions are 0.70, 0.56 and 0.94 (a first selection can
    come before the step that bounds it); with 20,000 draws (sd <= 0.0036) each is >= 16 sd
    above its target: probability < 1e-50."""
    mechanism, left, _ = active_users_mechanism()
    tau = selection.selection_threshold(mechanism, 1, 6, 1e-6)
    noise = vectorised_noise(mechanism, left, 20_000, 3)
    for rate, probability in ((10.0, 0.5), (25.0, 0.5), (25.0, 0.9)):
        step = selection.expected_selection_step(mechanism, tau, rate, probability)
        assert step is not None
        if probability == 0.5:  # the total alone reaches tau there: P(n >= 0) >= 1/2
            assert step <= math.ceil(tau / rate) - 1
        totals = rate * np.arange(1, 49)
        selected = np.any((noise + totals)[:, :step + 1] >= tau, axis=1).mean()
        assert selected >= probability, (rate, step, selected)
    assert selection.expected_selection_step(mechanism, tau, 1.0) is None


# ----- arguments ----------------------------------------------------------------------------
def test_arguments_are_refused_with_the_projects_message():
    mechanism = make("binary_tree", 8, epsilon=1.0, seed=1)
    refused = [
        (lambda: selection.selection_threshold(mechanism, 0, 1, 1e-6),
         "`max_keys_per_unit` must be an integer >= 1; got 0."),
        (lambda: selection.selection_threshold(mechanism, 1, 1, 1.5),
         "`delta` must be a number in (0, 1); got 1.5."),
        (lambda: selection.selection_threshold(mechanism, 1, 1.5, 1e-6),
         "`contribution_bound` must be an integer for an integer release (grid units for "
         "sums); got 1.5."),
        (lambda: selection.selection_threshold(mechanism, 1, -1, 1e-6),
         "`contribution_bound` must be a finite number >= 0; got -1."),
        (lambda: selection.selection_threshold("binary_tree", 1, 1, 1e-6),
         "`mechanism` must be a ContinualMechanism; got 'binary_tree'."),
        (lambda: selection.first_selected([1.0], math.nan),
         "`tau` must be a finite number; got nan."),
        (lambda: selection.first_selected([1.0], 1.0, start=-1),
         "`start` must be an integer >= 0; got -1."),
        (lambda: selection.expected_selection_step(mechanism, 10.0, 0.0),
         "`rate` must be a positive finite number; got 0.0."),
    ]
    for call, text in refused:
        with pytest.raises(ValidationError) as caught:
            call()
        assert str(caught.value) == text



"""Tree mechanisms against the papers: literal algorithms, golden node counts, closed forms."""
from __future__ import annotations

import copy
import functools
import itertools
import math

import numpy as np
import pytest

from transforms.mechanisms import ConstantNoiseSource, CounterState, make as make_mechanism
from transforms.mechanisms.noise import KeyedNoiseSource, seed_secret
from transforms.mechanisms.trees import EXACT_SENSITIVITY_LIMIT


def make(*args, **kwargs):
    """These tests check the papers' continuous-noise formulas: float noise unless asked."""
    kwargs.setdefault("noise", "float")
    return make_mechanism(*args, **kwargs)


LAPLACE_1 = {"epsilon": 1.0}
ZCDP_HALF = {"rho": 0.5}


def paper_tree(name, horizon, privacy=LAPLACE_1, **params):
    """Noise on every node the paper's algorithm uses (no R-hat, no pruning)."""
    return make(name, horizon, **privacy, sparsify=False, prune=False,
                noise_source=ConstantNoiseSource(1.0), **params)


def left_rows_as_intervals(mechanism):
    """Per step, {(first leaf, last leaf) 1-based: sign} read off the dense left factor."""
    left, _ = mechanism.dense_factors()
    nodes = mechanism.dense_nodes()
    k = mechanism.arity
    rows = []
    for t in range(mechanism.horizon):
        row = {}
        for column in np.nonzero(left[t])[0]:
            level, j = nodes[column]
            row[(j * k ** level + 1, (j + 1) * k ** level)] = int(left[t, column])
        rows.append(row)
    return rows


# ----- literal transcriptions of the papers' pseudo-code (independent of the implementation) ----
def algorithm1_intervals(t, k, h):
    """Andersson & Pagh 2023a Alg. 1, lines 7-14: digits of t in base k, left-most children from the
    top."""
    digits = [(t // k ** i) % k for i in range(h)]
    p, out = 0, {}
    for level in range(h, 0, -1):
        for _ in range(digits[level - 1]):
            out[(p + 1, p + k ** (level - 1))] = 1
            p += k ** (level - 1)
    return out


def offset_representation(k, h, low):
    """All h-digit vectors with digits in [low, low + k - 1], by value (Def. 7 / Def. 21)."""
    table = {}
    for digits in itertools.product(range(low, low + k), repeat=h):
        value = sum(d * k ** i for i, d in enumerate(digits))
        assert value not in table
        table[value] = digits
    return table


def algorithm3_intervals(t, k, h, representation):
    """Andersson & Pagh 2023a Alg. 3 with line 15 as corrected in NOTES.md: subtract [p - k^(l-1) +
    1, p]."""
    digits = representation[t]
    p, out = 0, {}
    for level in range(h, 0, -1):
        size = k ** (level - 1)
        for _ in range(abs(digits[level - 1])):
            if digits[level - 1] > 0:
                out[(p + 1, p + size)] = 1
                p += size
            else:
                out[(p - size + 1, p)] = -1
                p -= size
    assert p == t
    return out


def smooth_intervals(t, h, balanced):
    """Andersson & Pagh 2023b Alg. 2 on s = bin(m(t+1)), m 0-based (NOTES.md); leaves 1-based."""
    s = balanced[t]  # m(t + 1) is the t-th (0-based) balanced integer
    a, b, out = 1, 2 ** h, {}
    for i in range(h - 1, -1, -1):
        d = (a + b) // 2
        if (s >> i) & 1:
            out[(a, d)] = 1
            a = d + 1
        else:
            b = d
    return out


@pytest.mark.parametrize("k", [2, 3, 4, 7])
def test_kary_tree_left_factor_is_algorithm_1(k):
    for horizon in (1, 5, k ** 3 - 1, k ** 3, 200):
        mechanism = paper_tree("kary_tree", horizon, k=k)
        h = mechanism.height
        assert h == math.ceil(math.log(horizon + 1, k) - 1e-12)
        rows = left_rows_as_intervals(mechanism)
        for t in range(1, horizon + 1):
            assert rows[t - 1] == algorithm1_intervals(t, k, h), (k, horizon, t)


@pytest.mark.parametrize("k", [3, 4, 5, 6, 9])
def test_subtraction_left_factor_is_algorithm_3(k):
    for horizon in (1, 2, 3, 40, 150):
        mechanism = paper_tree("kary_subtraction", horizon, k=k)
        h = mechanism.height
        if k % 2:
            assert h == math.ceil(math.log(2 * horizon, k) - 1e-12)
        else:
            assert h == min(g for g in range(1, 20) if k * (k ** g - 1) / (2 * (k - 1)) >= horizon)
        table = offset_representation(k, h, mechanism.digit_low)
        rows = left_rows_as_intervals(mechanism)
        for t in range(1, horizon + 1):
            expected = algorithm3_intervals(t, k, h, table)
            assert rows[t - 1] == expected, (k, horizon, t)
            # golden count: |rep^(t)|_1 nodes, signed by the digit signs
            assert len(expected) == sum(abs(d) for d in table[t])


def test_subtraction_uses_the_corrected_subtracted_node():
    """The literal (typo) reading of Alg. 3 line 15 outputs 0 at t = 2 for k = 3; ours counts 2."""
    mechanism = make("kary_subtraction", 5, epsilon=1.0, k=3, noise_source=ConstantNoiseSource(0))
    assert mechanism.release([1, 1, 0, 0, 0])[1] == 2.0
    assert left_rows_as_intervals(paper_tree("kary_subtraction", 5, k=3))[1] == {
        (1, 3): 1, (3, 3): -1}


def test_smooth_binary_left_factor_is_algorithm_2_with_h_over_2_nodes():
    for horizon in (1, 2, 5, 19, 69, 200):
        mechanism = paper_tree("smooth_binary", horizon)
        h = mechanism.height
        assert h % 2 == 0 and math.comb(h, h // 2) >= horizon + 1
        assert h == 2 or math.comb(h - 2, h // 2 - 1) < horizon + 1
        balanced = sorted(v for v in range(2 ** h) if bin(v).count("1") == h // 2)
        rows = left_rows_as_intervals(mechanism)
        for t in range(1, horizon + 1):
            expected = smooth_intervals(t, h, balanced)
            assert rows[t - 1] == expected and len(expected) == h // 2, (horizon, t)
        np.testing.assert_array_equal(mechanism.data_leaf(np.arange(1, horizon + 1)),
                                      balanced[:horizon])


def test_golden_counts_with_constant_noise():
    """Constant node noise 1 (TF-Privacy style): output(t) - count(t) = scale * signed node sum."""
    k, horizon = 3, 100
    for name, expected in (("kary_tree", lambda t: sum(int(c) for c in np.base_repr(t, 3))),
                           ("binary_tree", lambda t: bin(t).count("1"))):
        params = {"k": k} if name == "kary_tree" else {}
        mechanism = paper_tree(name, horizon, **params)
        noise = mechanism.release(np.zeros(horizon)) / mechanism.node_scale
        assert noise.tolist() == [expected(t) for t in range(1, horizon + 1)]
    mechanism = paper_tree("kary_subtraction", horizon, k=3)
    table = offset_representation(3, mechanism.height, -1)
    noise = mechanism.release(np.zeros(horizon)) / mechanism.node_scale
    assert noise.tolist() == [sum(table[t]) for t in range(1, horizon + 1)]  # signed digits
    counts = mechanism.node_counts()
    assert counts.tolist() == [sum(abs(d) for d in table[t]) for t in range(1, horizon + 1)]


# ----- closed forms ----------------------------------------------------------------------------
@pytest.mark.parametrize("k,h", [(2, 5), (2, 10), (3, 6), (5, 4), (17, 3)])
def test_lemma_5_kary_mse(k, h):
    horizon = k ** h - 1
    mechanism = paper_tree("kary_tree", horizon, k=k)
    lemma5 = (k - 1) * h ** 3 / (1.0 - k ** -h)  # epsilon = 1
    assert mechanism.mean_se() ** 2 == pytest.approx(lemma5, rel=1e-12)


@pytest.mark.parametrize("k,h", [(3, 5), (3, 8), (5, 4), (7, 3), (19, 3)])
def test_lemma_11_subtraction_mse(k, h):
    horizon = (k ** h - 1) // 2
    mechanism = paper_tree("kary_subtraction", horizon, k=k)
    lemma11 = k * (1 - 1 / k ** 2) * h ** 3 / (2 * (1.0 - k ** -h))
    assert mechanism.mean_se() ** 2 == pytest.approx(lemma11, rel=1e-12)


@pytest.mark.parametrize("b,h", [(2, 8), (3, 6), (5, 4), (9, 3)])
def test_seed004_lemma_9_1(b, h):
    counts = paper_tree("kary_tree", b ** h, k=b).node_counts()
    assert counts.max() == (b - 1) * h
    assert counts.mean() == pytest.approx((b - 1) * h / 2 + b ** -h, rel=1e-12)


@pytest.mark.parametrize("b,h", [(3, 5), (5, 4), (7, 3), (11, 2)])
def test_seed004_lemma_9_3(b, h):
    horizon = b ** h
    counts = paper_tree("kary_subtraction", horizon, k=b).node_counts()
    assert counts.max() == 1 + h * (b - 1) / 2
    mean = (b * (1 - 1 / b ** 2) * h + 2 * (1 + b ** -h)) / 4
    assert counts.mean() == pytest.approx(mean, rel=1e-12)
    # NOTES.md: the maximum first occurs at t = (T-1)/2 (0-indexed), not at t = T-2.
    assert int(np.argmax(counts)) == (horizon - 1) // 2


@pytest.mark.parametrize("h", [2, 4, 6, 8, 10, 12, 14])
def test_smooth_variance_is_h_minus_k_times_k_over_2rho_at_every_step(h):
    horizon = math.comb(h, h // 2) - 1  # a full tree: every balanced leaf but the last holds data
    mechanism = make("smooth_binary", horizon, rho=0.5, seed=0)
    assert mechanism.height == h
    k = h // 2
    np.testing.assert_allclose(mechanism.noise_variance(), (h - k) * k / (2 * 0.5), rtol=1e-12)


def test_notes_table_T_1000():
    """Reference values of NOTES.md (noise on every node the paper's algorithm uses)."""
    table = [("binary_tree", {}, 42.4264, 31.4261, 9.4868, 7.0271),
             ("kary_tree", {"k": 3}, 34.2929, 24.1961, 9.1652, 6.4667),
             ("kary_subtraction", {"k": 3}, 26.1916, 21.1905, 7.0000, 5.6634),
             ("kary_subtraction", {"k": 19}, 19.4422, 14.1210, 7.9373, 5.7649)]
    for name, params, lap_max, lap_mean, gau_max, gau_mean in table:
        laplace = paper_tree(name, 1000, LAPLACE_1, **params)
        gauss = paper_tree(name, 1000, ZCDP_HALF, **params)
        got = (laplace.max_se(), laplace.mean_se(), gauss.max_se(), gauss.mean_se())
        assert got == pytest.approx((lap_max, lap_mean, gau_max, gau_mean), abs=6e-5), name
    # Smooth binary (h = 14): the paper calibrates to its structural R-hat (left children only):
    # sensitivity^p = h/2 = 7, every step combines 7 nodes.
    smooth = make("smooth_binary", 1000, epsilon=1.0, seed=0)
    assert smooth.height == 14 and smooth._structural_column_count() == 7
    assert set(smooth.node_counts()) == {7}
    assert math.sqrt(7 * 2 * 7 ** 2) == pytest.approx(26.1916, abs=6e-5)
    assert math.sqrt(7 * 7 / (2 * 0.5)) == pytest.approx(7.0, abs=6e-5)
    # ... and truncation to T = 1000 leaves only 6 used left children above any data leaf,
    # so our default R-hat does better than the paper at the same node count.
    assert smooth.sensitivity == 6.0
    assert smooth.max_se() == pytest.approx(math.sqrt(7 * 2 * 36))


def test_defaults_never_worse_than_paper_factors_and_pruning_example():
    """NOTES.md: subtraction, b = 5, T = 100, Laplace: MaxSE 14.97 -> 13.86 by pruning."""
    paper = paper_tree("kary_subtraction", 100, k=5)
    assert paper.max_se() == pytest.approx(14.97, abs=5e-3)
    pruned = make("kary_subtraction", 100, epsilon=1.0, k=5, sparsify=False, seed=0)
    assert pruned.max_se() == pytest.approx(13.86, abs=5e-3)
    for name, params in (("binary_tree", {}), ("kary_tree", {"k": 5}),
                         ("kary_subtraction", {"k": 3}), ("kary_subtraction", {"k": 19}),
                         ("smooth_binary", {})):
        for horizon in (7, 100, 1000, 4000):
            for privacy in (LAPLACE_1, ZCDP_HALF):
                default = make(name, horizon, **privacy, **params, seed=0)
                plain = paper_tree(name, horizon, privacy, **params)
                assert default.max_se() <= plain.max_se() + 1e-12
                assert default.mean_se() <= plain.mean_se() + 1e-12


def test_leading_constants():
    """Limits of the exact errors above, minimised over the arity (Andersson & Pagh 2023a Cor. 12,
    App. A.3;
    Andersson et al. 2026 Thm 9.15 / 9.16, with NOTES.md's correction of Thm 9.16)."""
    log2 = math.log2
    cor12 = {k: k * (1 - 1 / k ** 2) / (2 * log2(k) ** 3) for k in range(3, 60, 2)}
    assert min(cor12, key=cor12.get) == 19 and cor12[19] == pytest.approx(0.123591, abs=5e-7)
    even = {k: k / (2 * log2(k) ** 3) for k in range(4, 60, 2)}
    assert min(even, key=even.get) == 20 and even[20] == pytest.approx(0.123870, abs=5e-7)
    thm6 = {k: (k - 1) / log2(k) ** 3 for k in range(2, 60)}
    assert min(thm6, key=thm6.get) == 17 and thm6[17] == pytest.approx(0.234293, abs=5e-7)
    odd = range(3, 61, 2)
    zmax = {b: math.sqrt(b - 1) / (math.sqrt(2) * log2(b)) for b in odd}
    zmean = {b: math.sqrt(b * (1 - 1 / b ** 2)) / (2 * log2(b)) for b in odd}
    pmax = {b: math.sqrt((b - 1) / (2 * log2(b) ** 3)) for b in odd}
    pmean = {b: math.sqrt(b * (1 - 1 / b ** 2) / (4 * log2(b) ** 3)) for b in odd}
    for table, best, value in ((zmax, 5, 0.609069), (zmean, 7, 0.466385),
                               (pmax, 17, 0.342266), (pmean, 19, 0.248587)):
        assert min(table, key=table.get) == best and table[best] == pytest.approx(value, abs=5e-7)
    # The mechanism's exact MSE tends to the Cor. 12 constant: MSE / log2(T)^3 at
    # T = (19^h - 1)/2 equals Lemma 11 / log2(T)^3 and decreases towards 0.1236.
    ratios = []
    for h in (2, 3, 4):
        horizon = (19 ** h - 1) // 2
        mse = paper_tree("kary_subtraction", horizon, k=19).mean_se() ** 2
        ratios.append(mse / math.log2(2 * horizon + 1) ** 3)
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] > cor12[19]
    assert ratios[-1] == pytest.approx(cor12[19] / (1 - 19.0 ** -4), rel=1e-9)


# ----- state size and large horizons -----------------------------------------------------------
@pytest.mark.parametrize("name,params", [("binary_tree", {}), ("kary_tree", {"k": 4}),
                                         ("kary_subtraction", {"k": 19}),
                                         ("kary_subtraction", {"k": 3}), ("smooth_binary", {})])
def test_state_is_O_log_T_and_large_horizons_step_without_running_all_steps(name, params):
    for exponent in (10, 20, 30):
        horizon = 2 ** exponent
        mechanism = make(name, horizon, rho=0.5, seed=3, **params)
        state = CounterState(horizon - 3, 12345.0)  # resumed near the end
        outs = []
        for _ in range(3):
            out, state = mechanism.step(state, 1.0)
            outs.append(out)
        assert state.steps == horizon and state.running_total == 12348.0
        assert len(state.to_bytes()) <= 2 * exponent  # O(log T); it is in fact 17 bytes
        # batch over the same three steps agrees with the steps
        released, _ = mechanism.advance(CounterState(horizon - 3, 12345.0), np.ones(3))
        assert np.array_equal(np.array(outs), released)
        if horizon > EXACT_SENSITIVITY_LIMIT:  # structural sensitivity: still a valid bound
            assert mechanism.sensitivity ** 2 == pytest.approx(mechanism._structural_column_count())


def test_exact_sparsified_sensitivity_never_exceeds_structural_bound():
    for name, params in (("binary_tree", {}), ("kary_tree", {"k": 3}),
                         ("kary_subtraction", {"k": 5}), ("smooth_binary", {})):
        for horizon in (1, 10, 100, 999, 5000):
            mechanism = make(name, horizon, epsilon=1.0, seed=0, **params)
            assert mechanism.column_counts().max() <= mechanism._structural_column_count()


@pytest.mark.parametrize("bad,message", [
    ({"k": 1}, r"^`k` must be an integer >= 2; got 1\.$"),
    ({"k": 2.5}, r"^`k` must be an integer >= 2; got 2\.5\.$"),
    ({"sparsify": "yes"}, r"^`sparsify` must be True or False; got 'yes'\.$"),
    ({"prune": 1}, r"^`prune` must be True or False; got 1\.$"),
])
def test_tree_parameter_errors(bad, message):
    with pytest.raises(ValueError, match=message):
        make("kary_tree", 10, epsilon=1.0, seed=0, **bad)


def test_subtraction_needs_k_at_least_3():
    with pytest.raises(ValueError, match=r"^`k` must be an integer >= 3; got 2\.$"):
        make("kary_subtraction", 10, epsilon=1.0, seed=0, k=2)


# ----- smooth binary: compact node indexing and the batch fast path -------------------------------
@functools.lru_cache(maxsize=None)
def balanced_numbers(h):
    """All h-bit integers with h/2 ones, increasing (brute force)."""
    everything = np.arange(1 << h, dtype=np.int64)
    ones = np.zeros(everything.shape, dtype=np.int64)
    for bit in range(h):
        ones += (everything >> bit) & 1
    return everything[ones == h // 2]


def usable_parents(mechanism, level):
    """All parents p whose left child at `level` some balanced leaf can use, by brute force:
    bit `level` of a balanced h-bit m is 1 and p = m >> (level + 1); sorted."""
    ms = balanced_numbers(mechanism.height)
    return np.unique(ms[((ms >> level) & 1) == 1] >> (level + 1))


def reference_smooth_unit_noise(mechanism, start, count):
    """Independent of the fast path: per step t, m = the t-th balanced number (brute force);
    from the top level down, total = total + (value of node 2 (m >> (l + 1)) if bit l of m is 1,
    else 0.0), where that node's noise is read at its rank among the level's usable parents
    (brute force) and multiplied by 0.0 / 1.0 by the generic `data_free` when pruning."""
    h = mechanism.height
    ranks, noise = [], []
    for level in range(h):
        parents = usable_parents(mechanism, level)
        values = mechanism._draw(level, 0, parents.shape[0])
        if mechanism.prune:
            free = mechanism.data_free(level, 2 * parents)
            values = values * np.where(free, 0.0, 1.0)
        ranks.append({int(p): i for i, p in enumerate(parents)})
        noise.append(values.tolist())
    out = []
    for m in balanced_numbers(h)[start + 1:start + count + 1].tolist():
        total = 0.0
        for level in range(h - 1, -1, -1):
            contribution = 0.0
            if (m >> level) & 1:
                contribution = noise[level][ranks[level][m >> (level + 1)]]
            total = total + contribution
        out.append(total)
    return np.array(out, dtype=np.float64)


def test_smooth_compact_index_is_the_rank_among_usable_parents():
    rng = np.random.default_rng(4)
    for horizon in (1, 5, 69, 1000, 5000):
        mechanism = make("smooth_binary", horizon, epsilon=1.0, seed=0)
        for level in range(mechanism.height):
            bits = mechanism.height - level - 1
            parents = usable_parents(mechanism, level)
            everything = np.arange(1 << bits, dtype=np.int64)
            if everything.shape[0] > 4096:
                everything = np.unique(np.concatenate([everything[:1000], everything[-1000:],
                                                       rng.choice(everything, 2000)]))
            below = np.searchsorted(parents, everything)  # usable parents < p, for every p
            assert [mechanism.compact_index(level, int(p)) for p in everything] == below.tolist()
            assert np.array_equal(mechanism.compact_indices(level, everything), below)
    # tall trees (no enumeration): scalar == vectorised, and consecutive usable parents get
    # consecutive indices (found by scanning up from random parents)
    for horizon in (10 ** 6, 2 ** 40):
        mechanism = make("smooth_binary", horizon, epsilon=1.0, seed=0)
        h = mechanism.height
        for level in (0, 1, 5, h // 2, h - 3, h - 1):
            bits, least, most = mechanism._compact_bounds(level)
            starts = rng.integers(0, 1 << bits, 40) if bits else np.zeros(1, dtype=np.int64)
            got = mechanism.compact_indices(level, starts)
            assert got.tolist() == [mechanism.compact_index(level, int(p)) for p in starts]
            for p in starts.tolist():
                usable = [q for q in range(p, min(p + 400, 1 << bits))
                          if least <= bin(q).count("1") <= most]
                assert [mechanism.compact_index(level, q) for q in usable] == list(
                    range(mechanism.compact_index(level, p), mechanism.compact_index(level, p)
                          + len(usable)))


def test_smooth_noise_derivation_names_compact_indexing():
    mechanism = make_mechanism("smooth_binary", 100, epsilon=1.0, seed=0)
    assert mechanism.node_indexing == 2 and mechanism.noise_derivation.endswith(
        "/smooth_binary/2")
    assert make_mechanism("binary_tree", 100, epsilon=1.0, seed=0).node_indexing == 1


@pytest.mark.parametrize("horizon", [1000, 3433, 2 ** 16 + 17])
def test_smooth_batch_reads_only_used_nodes_in_dense_ranges(horizon):
    """One read per level of exactly the used nodes' compact indices, which are contiguous:
    about 2 nodes per step instead of the ~6 of parent indexing (T = 2^20)."""
    reads = []
    mechanism = make_mechanism("smooth_binary", horizon, epsilon=1.0, seed=0)

    def recording(level, start, count):
        reads.append((level, start, count))
        return np.ones(count)
    mechanism._node_noise = recording  # what the batch path reads, before any block cache
    mechanism.release(np.zeros(horizon))
    used = mechanism.used_nodes()
    assert sorted(level for level, _, _ in reads) == sorted(
        level for level in range(mechanism.height) if used[level].any())
    for level, start, count in reads:
        nodes = np.flatnonzero(used[level])  # left children 2p of used parents p
        assert (nodes % 2 == 0).all() and count == nodes.shape[0]
        assert mechanism.compact_indices(level, nodes // 2).tolist() == list(
            range(start, start + count))
    assert sum(count for _, _, count in reads) <= 2.2 * horizon


@pytest.mark.parametrize("noise", ["discrete", "float"])
@pytest.mark.parametrize("prune,sparsify", [(False, True), (True, True), (False, False),
                                            (True, False)])
def test_smooth_batch_streaming_and_chunks_equal_the_reference(noise, prune, sparsify):
    rng = np.random.default_rng(14)
    for horizon in (1, 2, 3, 19, 64, 69, 500, 1000, 4097):
        for seed, privacy in ((0, LAPLACE_1), (5, ZCDP_HALF)):
            mechanism = make_mechanism("smooth_binary", horizon, seed=seed, noise=noise,
                                       prune=prune, sparsify=sparsify, **privacy)
            reference = reference_smooth_unit_noise(mechanism, 0, horizon)
            new = mechanism._unit_noise(0, horizon)
            assert np.array_equal(new, reference) and not np.signbit(new[new == 0]).any()
            x = rng.integers(0, 3, horizon).astype(np.float64)
            released = mechanism.release(x)
            scale = 1.0 if noise == "discrete" else mechanism.node_scale
            assert np.array_equal(released, np.cumsum(x) + scale * reference)
            # chunked resume from states, with random cut points
            cuts = sorted(set(rng.integers(0, horizon + 1, 4).tolist()) | {0, horizon})
            state, parts = mechanism.init_state(), []
            for first, last in zip(cuts[:-1], cuts[1:]):
                assert np.array_equal(mechanism._unit_noise(first, last - first),
                                      reference[first:last])
                out, state = mechanism.advance(state, x[first:last])
                parts.append(out)
            assert np.array_equal(np.concatenate(parts), released)
            # step by step (all steps for small horizons, a random sample otherwise)
            steps = range(horizon) if horizon <= 100 else rng.integers(0, horizon, 40)
            for i in steps:
                assert mechanism._unit_noise_one(int(i) + 1) == reference[i]
            if horizon <= 100:
                state, outs = mechanism.init_state(), []
                for value in x:
                    out, state = mechanism.step(state, value)
                    outs.append(out)
                assert np.array_equal(np.array(outs), released)


def test_smooth_slices_and_node_counts_through_the_fast_path():
    for prune in (False, True):
        mechanism = make_mechanism("smooth_binary", 3000, seed=2, prune=prune, epsilon=1.0)
        reference = reference_smooth_unit_noise(mechanism, 0, 3000)
        for start, count in ((0, 3000), (7, 1), (7, 2), (1234, 2), (999, 1500), (2999, 1)):
            assert np.array_equal(mechanism._unit_noise(start, count),
                                  reference[start:start + count])
        # the rule's nodes (`_step_nodes`; pruned ones not counted)
        expected = [sum(not pruned for _, nodes in mechanism._step_nodes(t)
                        for _, _, pruned in nodes) for t in range(1, 3001)]
        assert mechanism.node_counts().tolist() == expected
        counts = mechanism.node_counts()  # h = 14: h/2 = 7 nodes, fewer when pruning
        assert (counts.max() <= 7 and counts.min() >= 1) if prune else set(counts) == {7}


def test_smooth_streams_share_the_kept_batch_plan_with_a_fresh_mechanisms_values():
    """The batch plan depends on the steps only: a stream released with the plan another
    stream left (and after a streaming step's prefetch replaced it) equals its release by a
    mechanism that finds the plan afresh."""
    x = np.random.default_rng(2).integers(0, 3, 5000).astype(np.float64)
    for prune in (False, True):
        mechanism = make_mechanism("smooth_binary", 5000, seed=4, prune=prune, rho=0.5)
        mechanism.for_stream("a").release(x)
        kept = mechanism.for_stream("b").release(x)
        mechanism.for_stream("c").step(mechanism.init_state(), 1.0)  # prefetches a short run
        again = mechanism.for_stream("b").release(x)
        fresh = make_mechanism("smooth_binary", 5000, seed=4, prune=prune, rho=0.5,
                               stream="b").release(x)
        assert kept.tobytes() == fresh.tobytes() == again.tobytes()


def test_smooth_noise_law_per_step_is_unchanged_by_indexing():
    """Every step still sums h/2 distinct i.i.d. nodes: the empirical variance over many streams
    matches the exact one (z-test, false-failure rate ~1e-5)."""
    mechanism = make_mechanism("smooth_binary", 200, rho=0.5, seed=3, noise="float")
    draws = np.array([mechanism.for_stream(s).release(np.zeros(200)) for s in range(400)])
    ratio = (draws ** 2 / mechanism.noise_variance()).mean(axis=1)
    z = (ratio.mean() - 1.0) / (ratio.std(ddof=1) / math.sqrt(ratio.shape[0]))
    assert abs(z) < 4.42


def test_smooth_used_nodes_match_the_generic_computation():
    from transforms.mechanisms.trees import TreeMechanism
    for horizon in (1, 2, 19, 69, 924, 1000, 5000):
        mechanism = make("smooth_binary", horizon, epsilon=1.0, seed=0)
        reference = copy.copy(mechanism)
        reference.balanced = reference._balanced_bitwise
        expected = TreeMechanism._used_nodes(reference)
        got = mechanism._used_nodes()
        assert len(got) == len(expected) == mechanism.height
        for a, b in zip(got, expected):
            assert a.dtype == b.dtype and np.array_equal(a, b)


def test_smooth_noise_of_each_node_is_unchanged():
    """Golden discrete noise (exact integers) of node indexing 2 (compact), pinned when it was
    introduced and checked against `reference_smooth_unit_noise`: the same node keeps its noise
    (indexing 1's values are pinned by test_noise_derivation's GOLDEN)."""
    import hashlib
    for horizon, seed, privacy, prune, digest, head in (
            (1000, 0, {"epsilon": 1.0}, False, "6f65ca51f41e99f8", [3, -16, 42, 46, 9, 22]),
            (5000, 1, {"rho": 0.5}, True, "b77782249313d46b", [-2, -1, 2, 4, 2, -3]),
            (777, 2, {"epsilon": 0.5}, True, "149a23c51145f002", [-15, -9, -10, -45, -24, -32])):
        mechanism = make_mechanism("smooth_binary", horizon, prune=prune, **privacy,
                                   noise_source=KeyedNoiseSource(seed_secret(seed),
                                                                 version="v3"))
        assert mechanism.noise_derivation == "v3/smooth_binary/2"
        noise = mechanism.for_stream("golden").release(np.zeros(horizon))
        assert noise[:6].astype(int).tolist() == head
        assert hashlib.sha256(noise.astype("<i8").tobytes()).hexdigest()[:16] == digest


def test_smooth_balanced_tables_match_bitwise_and_pruning_rule():
    rng = np.random.default_rng(3)
    for horizon in (1, 5, 69, 1000, 10 ** 5, 2 ** 30, 2 ** 40):
        mechanism = make("smooth_binary", horizon, epsilon=1.0, seed=0)
        h = mechanism.height
        total = math.comb(h, h // 2)
        ranks = np.unique(np.concatenate([rng.integers(0, total, 2000), [0, total - 1]]))
        expected = mechanism._balanced_bitwise(ranks)
        assert np.array_equal(mechanism.balanced(ranks), expected)
        assert [mechanism._balanced_one(int(r)) for r in ranks[:50]] == expected[:50].tolist()
        for first in (0, int(ranks[len(ranks) // 2]), total - 300):
            first = max(first, 0)
            count = min(300, total - first)
            assert np.array_equal(mechanism._balanced_range(first, count),
                                  mechanism._balanced_bitwise(np.arange(first, first + count)))
    # the closed-form data-free test of the fast path equals data_free on every used node
    from transforms.mechanisms.smooth import popcount
    for horizon in (5, 69, 1000, 3432):
        mechanism = make("smooth_binary", horizon, epsilon=1.0, seed=0, prune=True)
        m = mechanism.prefix_leaves(np.arange(1, horizon + 1))
        for level in range(mechanism.height):
            q = np.unique(m >> level)
            q = q[(q & 1) == 1]
            closed = mechanism.height // 2 - popcount(q) == level
            assert np.array_equal(closed, mechanism.data_free(level, (q >> 1) * 2))


def test_popcount_with_and_without_numpy_bitwise_count(monkeypatch):
    from transforms.mechanisms.smooth import popcount
    values = np.concatenate([np.arange(300), np.random.default_rng(0).integers(0, 2 ** 62, 300),
                             [2 ** 63 - 1]]).astype(np.int64)
    expected = [bin(int(v)).count("1") for v in values]
    assert popcount(values).tolist() == expected
    monkeypatch.delattr(np, "bitwise_count", raising=False)
    assert popcount(values).tolist() == expected
    mechanism = make("smooth_binary", 1000, epsilon=1.0, seed=0)
    assert mechanism.balanced(np.int64(17)).shape == () and int(mechanism.balanced(17)) == int(
        mechanism._balanced_bitwise(np.array([17]))[0])


@pytest.mark.parametrize("name,params", [("binary_tree", {}), ("kary_tree", {"k": 4}),
                                         ("kary_subtraction", {"k": 5}),
                                         ("kary_subtraction", {"k": 19})])
def test_data_free_nodes_are_a_suffix_of_each_level_and_its_first_is_found(name, params):
    """The batch path prunes only rows from the first data-free node on (`_first_free_node`):
    that is right only if no node before it is free and every node after it is."""
    for horizon in (1, 2, 7, 19, 64, 65, 361, 1000, 4097):
        mechanism = make(name, horizon, epsilon=1.0, seed=0, **params)
        for level in range(mechanism.height):
            nodes = np.arange(-3, 2 * mechanism.arity ** (mechanism.height - level) + 3)
            free = mechanism.data_free(level, nodes)
            first = mechanism._first_free_node(level)
            assert free[nodes >= first].all() and not free[nodes < first].any()
            assert first <= nodes[-1]  # a level ends with free nodes (its tree passes T)

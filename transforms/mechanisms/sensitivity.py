"""The one seam through which every mechanism gets its sensitivity on S_{D,k}.

S_{D,k} (Andersson et al. 2026 Sec. 6.2) holds the integer vectors whose interval sums lie in [-D,
D] and whose
l1 norm is at most k: the changes one protected unit can make to a difference stream
(`max_contributions` k, `interval_bound` D). Since interval sums are bounded by the l1 norm,
S_{D,k} = S_{min(D,k),k}. On S_{1,1} the sensitivity is the largest column l_p norm of R.

- Trees: the parity-counting dynamic program of Andersson et al. 2026 Lemma 9.6/9.7 (9.10 for
R-hat), run on
  the mechanism's actual tree (truncated to T, sparsified or not, smooth leaves): with j
  alternating +-1 entries, node values are +-1 exactly for nodes holding an odd number of them,
  so sens_p(S_{1,j})^p = max number of odd counted nodes over j' <= j balls in data leaves.
  Identical subtrees are merged level by level, so only O(h) distinct tables are computed.
  For S_{D,k}, Lemma 7.3: sens_p <= max over k_1 + ... + k_D = k of sum_d sens_p(S_{1,k_d}).
  Where the DP is too large, the closed form U(k) = (sum_l min(k, n_l))^(1/p) bounds
  sens_p(S_{1,k}) (level l has n_l counted nodes, each odd at most once; Cor. 9.9 / 9.12 in
  general form); U is concave and non-decreasing, so Lemma 7.3 gives D U(ceil(k/D)).
- Toeplitz R with non-negative, non-increasing diagonals: l2 <= sqrt(k D) ||R||_{1->2}
  (Thm 8.4); every R: l_p <= k * max column l_p norm (triangle inequality).
- Naive factorizations are exact: R = A gives D T^(1/p); R = I gives the largest l_p norm of a
  vector with entries in [-D, D], l1 <= k and T entries.
A claimed sensitivity is never below the true one: tests compare every path with brute force
over S_{D,k} for small T.
"""
from __future__ import annotations

import math

import numpy as np

EXACT_TREE_LIMIT = 1 << 21  # leaves of the tree DP
EXACT_TREE_MAX_K = 512


def sensitivity(mechanism, p: int, max_contributions: int, interval_bound: int) -> float:
    k = max_contributions
    d = min(interval_bound, k)
    if k == 1:
        return mechanism.column_norm(p)
    return mechanism.set_sensitivity(p, k, d)


# ----- helpers shared by the families ---------------------------------------------------------
def split_over_parts(per_ones: np.ndarray, k: int, parts: int) -> float:
    """max over k_1 + ... + k_parts = k (k_d >= 0) of sum_d per_ones[k_d] (Lemma 7.3)."""
    values = np.asarray(per_ones, dtype=np.float64)[:k + 1]
    # the parts-fold max-plus power of `values` by repeated squaring (max-plus convolution is
    # associative): O(log parts) products instead of parts - 1
    best = np.full(k + 1, -np.inf)
    best[0] = 0.0  # the identity: zero balls in zero parts
    base, remaining = values, parts
    while remaining:
        if remaining & 1:
            best = max_plus(best, base, k)
        remaining >>= 1
        if remaining:
            base = max_plus(base, base, k)
    return float(np.max(best[:k + 1]))


def max_plus(a: np.ndarray, b: np.ndarray, cap: int) -> np.ndarray:
    """c[j] = max_i a[i] + b[j - i] for j <= cap (-inf where impossible)."""
    rows = min(cap, len(a) - 1) + 1
    if rows * (cap + 1) <= 1 << 22:  # one vectorised max over the (i, j) table
        padded = np.full(2 * cap + 1, -np.inf)
        width = min(cap, len(b) - 1) + 1
        padded[cap:cap + width] = b[:width]
        # shifted[i, j] = b[j - i] (-inf outside b): row i is padded[cap - i: 2 cap - i + 1]
        shifted = np.lib.stride_tricks.sliding_window_view(padded, cap + 1)[cap - np.arange(rows)]
        return np.max(np.asarray(a[:rows], dtype=np.float64)[:, None] + shifted, axis=0)
    out = np.full(cap + 1, -np.inf)
    for i in range(min(cap, len(a) - 1) + 1):
        if a[i] == -np.inf:
            continue
        width = min(cap - i, len(b) - 1) + 1
        np.maximum(out[i:i + width], a[i] + b[:width], out=out[i:i + width])
    return out


# ----- trees ----------------------------------------------------------------------------------
def tree_odd_node_counts(mechanism, k: int) -> np.ndarray:
    """F[j] = max number of odd counted nodes with exactly j balls in data leaves (j <= k)."""
    arity, height, horizon = mechanism.arity, mechanism.height, mechanism.horizon
    leaves = mechanism.data_leaf(np.arange(1, horizon + 1, dtype=np.int64))
    width = int(leaves.max()) + 1
    used = mechanism.used_nodes() if mechanism.sparsify else None
    odd = (np.arange(k + 1) % 2).astype(np.float64)
    empty = np.full(k + 1, -np.inf)
    empty[0] = 0.0

    def counted(level, size):
        if used is None:
            return np.ones(size, dtype=np.int64)
        flags = np.zeros(size, dtype=np.int64)
        n = min(size, used[level].shape[0])
        flags[:n] = used[level][:n]
        return flags

    # level 0: a leaf holds 0 or 1 ball, if it is a data leaf
    is_data = np.zeros(width, dtype=np.int64)
    is_data[leaves] = 1
    rows = np.stack([is_data, counted(0, width)], axis=1)
    unique, ids = np.unique(rows, axis=0, return_inverse=True)
    tables = []
    for data, flag in unique:
        table = empty.copy()
        if data and k >= 1:
            table[1] = float(flag)
        tables.append(table)
    ids = ids.reshape(-1)
    for level in range(1, height + 1):
        nodes = -(-ids.shape[0] // arity)
        children = np.full(nodes * arity, len(tables), dtype=np.int64)  # padding: empty
        children[:ids.shape[0]] = ids
        children = children.reshape(nodes, arity)
        tables_ext = tables + [empty]
        if level == height:  # the virtual root (never a node): fold its children
            total = empty
            for child in children.reshape(-1):
                total = max_plus(total, tables_ext[child], k)
            return total
        flags = counted(level, nodes)
        rows = np.concatenate([flags[:, None], children], axis=1)
        unique, ids = np.unique(rows, axis=0, return_inverse=True)
        ids = ids.reshape(-1)
        new_tables = []
        for row in unique:
            total = empty
            for child in row[1:]:
                total = max_plus(total, tables_ext[child], k)
            new_tables.append(total + row[0] * odd)
        tables = new_tables
    raise AssertionError("unreachable")


def tree_level_counts(mechanism) -> np.ndarray:
    """Counted nodes per level: used nodes (R-hat) or nodes holding data (R)."""
    arity, horizon = mechanism.arity, mechanism.horizon
    if mechanism.sparsify and horizon <= EXACT_TREE_LIMIT:
        return np.array([int(u.sum()) for u in mechanism.used_nodes()], dtype=np.int64)
    last = int(mechanism.data_leaf(np.array([horizon]))[0])
    return np.array([last // arity ** level + 1 for level in range(mechanism.height)],
                    dtype=np.int64)


def tree_set_sensitivity(mechanism, p: int, k: int, d: int) -> float:
    if mechanism.horizon <= EXACT_TREE_LIMIT and k <= EXACT_TREE_MAX_K:
        counts = np.maximum.accumulate(tree_odd_node_counts(mechanism, k))
        return split_over_parts(counts ** (1.0 / p), k, d)
    per_level = tree_level_counts(mechanism)
    bound = lambda j: float(np.minimum(j, per_level).sum()) ** (1.0 / p)  # noqa: E731
    return d * bound(-(-k // d))


# ----- Toeplitz -------------------------------------------------------------------------------
def is_monotone_toeplitz(coefficients: np.ndarray) -> bool:
    return bool(np.all(coefficients >= 0) and np.all(np.diff(coefficients) <= 0))


def toeplitz_set_sensitivity(coefficients: np.ndarray, p: int, k: int, d: int) -> float:
    column = float(np.sum(np.abs(coefficients) ** p) ** (1.0 / p))
    triangle = k * column
    if p == 2 and is_monotone_toeplitz(coefficients):
        return min(triangle, math.sqrt(k * d) * column)
    return triangle


def prefix_matrix_sensitivity(horizon: int, p: int, k: int, d: int) -> float:
    """R = A: (A v)_t are prefix sums, each in [-D, D]; v = D e_0 attains D T^(1/p)."""
    return d * horizon ** (1.0 / p)


def identity_sensitivity(horizon: int, p: int, k: int, d: int) -> float:
    """R = I: entries in [-D, D], l1 <= k, T entries; (D, -D, D, ...) plus a remainder attains
    it."""
    full, rest = divmod(k, d)
    entries = [d] * min(full, horizon)
    if rest and len(entries) < horizon:
        entries.append(rest)
    return float(sum(e ** p for e in entries) ** (1.0 / p))


# ----- joint sensitivity over keys ------------------------------------------------------------
def joint_sensitivity(mechanism, p: int, mass: float, keys: int) -> float:
    """l_p sensitivity of the concatenation (R v_1, ..., R v_m) over the public keys, when one
    unit's changes v_1, ..., v_m (one per key, any signs) have sum_j ||v_j||_1 <= `mass` and touch
    at most `keys` keys (ContinualCount / ContinualSum: `max_contributions` caps a unit's total
    over the horizon across all its keys).

    Every column of R has l_p norm <= c_p = `column_norm(p)`, so ||R v||_p <= ||v||_1 c_p
    (triangle inequality over the columns). Hence the l1 norm of the concatenation is
    sum_j ||R v_j||_1 <= mass c_1, and its l2 norm is sqrt(sum_j ||R v_j||_2^2)
    <= sum_j ||R v_j||_2 <= mass c_2: the joint sensitivity is at most mass x c_p whatever the
    number of keys, the same as one key's change `mass` e_t on S_{k,k} (k = mass).

    The discrete square root releases y_j = round(R~ x_j / g) + z_j: a change moves each
    coordinate by at most |R~ v_j / g| + 1, and only the T coordinates of the touched keys, at
    most min(keys, mass) of them (integer changes: a touched key takes >= 1 of the mass), so
    ||(Delta y_j)_j||_2 <= mass c_2 / g + sqrt(min(keys, mass) T) (triangle inequality on the
    concatenation of the linear part and the rounding part).
    """
    linear = mass * mechanism.column_norm(p)
    if mechanism.discrete and isinstance(getattr(mechanism, "grid_bits", None), int):
        # y on a grid (the square roots): the linear part in grid units, plus the rounding
        # (none when R~ x / g is an integer: the horizon-free one)
        touched = max(1, min(keys, int(math.floor(mass))))
        rounding = math.sqrt(touched * mechanism.horizon) if mechanism._rounding_term() else 0.0
        return linear * 2.0 ** mechanism.grid_bits + rounding
    return linear

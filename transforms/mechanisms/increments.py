"""The law of a step's own value: release_t - release_{t-1} = x_t + (L_t - L_{t-1}) z.

A running total's noise at step t is row t of the left factor L applied to the node noises z
(Andersson et al. 2026 Sec. 5). The step's own value differs from x_t by the difference of
two rows, so its
noise is again a weighted sum of i.i.d. nodes, with the weights of L_t - L_{t-1} (L_{-1} = 0):
the rows of D L, D the difference matrix. Its variance and quantiles are exact, from the
factorization (the two rows share nodes: they are not independent):

- Toeplitz L (square root, BLT, the baselines), row t = (l_t, ..., l_0): the difference rows
  are the prefixes of d_0 = l_0, d_m = l_m - l_{m-1}, a Toeplitz L again.
- Trees: row t holds the nodes of `_step_nodes(t + 1)` with signs +-1 (pruned nodes add 0);
  the difference keeps the nodes of one row only (+-1) and any node whose signs differ (+-2).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np


def toeplitz_increments(coefficients: np.ndarray) -> np.ndarray:
    """d with d_0 = l_0, d_m = l_m - l_{m-1}: the Toeplitz coefficients of D L.

    >>> toeplitz_increments(np.array([1.0, 0.5, 0.375]))
    array([ 1.   , -0.5  , -0.125])
    """
    coefficients = np.asarray(coefficients, dtype=np.float64)
    return np.diff(coefficients, prepend=0.0)


def _tree_row(mechanism, step: int) -> Dict[Tuple[int, int], int]:
    """{(level, index): +-1} of row step - 1 (`_step_nodes(step)`), pruned nodes left out."""
    row: Dict[Tuple[int, int], int] = {}
    for negative, nodes in mechanism._step_nodes(step):
        for level, index, pruned in nodes:
            if not pruned:
                row[(level, index)] = row.get((level, index), 0) + (-1 if negative else 1)
    return row


def tree_increment_weights(mechanism) -> List[np.ndarray]:
    """The nonzero weights of L_t - L_{t-1} for t = 0..T-1 (a tree mechanism)."""
    rows, previous = [], {}
    for step in range(1, mechanism.horizon + 1):
        row = _tree_row(mechanism, step)
        weights = [row.get(node, 0) - previous.get(node, 0) for node in row.keys() | previous]
        rows.append(np.array([w for w in weights if w], dtype=np.float64))
        previous = row
    return rows


def increment_weights(mechanism) -> Tuple[str, object]:
    """("coefficients", d) for a Toeplitz left factor, else ("weights", [row weights]);
    cached per mechanism (the variance and the half-width both read it)."""
    found = mechanism._cache.get("increment_weights")
    if found is None:
        if hasattr(mechanism, "left_coefficients"):
            found = "coefficients", toeplitz_increments(mechanism.left_coefficients())
        else:
            found = "weights", tree_increment_weights(mechanism)
        mechanism._cache["increment_weights"] = found
    return found


def increment_variance(mechanism) -> np.ndarray:
    """Var(release_t - release_{t-1}) for t = 0..T-1: node variance x ||L_t - L_{t-1}||^2."""
    own = getattr(mechanism, "increment_squares", None)  # a mechanism's own closed form
    if own is not None:
        return mechanism.node_variance * own()
    kind, rows = increment_weights(mechanism)
    if kind == "coefficients":
        squares = np.cumsum(rows ** 2)
    else:
        squares = np.array([float(np.sum(w ** 2)) for w in rows])
    return mechanism.node_variance * squares


def increment_half_width(mechanism, level: float) -> np.ndarray:
    """c_t with P(|noise of release_t - release_{t-1}| > c_t) <= 1 - level: the exact
    quantile of the difference rows' law, by the rule of the running totals' intervals
    (`tails.step_quantiles` with the mechanism's node law and factor). Cached per level."""
    from . import tails
    cache = mechanism._cache.setdefault("increment_half_width", {})
    if level not in cache:
        node, factor = mechanism._noise_node()
        if getattr(mechanism, "increment_squares", None) is not None:
            # (the hybrid: Gaussian float noise only, so the sum of its nodes is Gaussian)
            cache[level] = tails.gaussian_quantile(1.0 - level) * np.sqrt(
                increment_variance(mechanism))
            return cache[level].copy()
        kind, rows = increment_weights(mechanism)
        if kind == "coefficients":
            half = factor * tails.step_quantiles(node, 1.0 - level, coefficients=rows)
        else:
            if any(np.any(np.abs(w) != 1.0) for w in rows):
                raise AssertionError("a tree's difference rows must have weights +-1")
            counts = np.array([w.shape[0] for w in rows], dtype=np.int64)
            half = factor * tails.step_quantiles(node, 1.0 - level, counts=counts)
        half[increment_variance(mechanism) == 0] = 0.0
        cache[level] = half + mechanism.rounding_bound(increments=True)
    return cache[level].copy()

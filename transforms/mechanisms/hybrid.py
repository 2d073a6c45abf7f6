"""The hybrid mechanism of Chan, Shi and Song, "Private and Continual Release of Statistics"
(ACM TISSEC 2011, Sec. 4.3: continual counting with no horizon), as a factorization.

Steps t = 1, 2, 3, ... fall in blocks b = floor(log2 t): block b holds t in [2^b, 2^(b+1)),
2^b steps. Its logarithmic part releases each completed block's sum with fresh noise (a node of
level 0, index b); its binary part is a binary tree over each block (2^b leaves, b + 1 levels),
whose nodes carry noise of b + 1 times the unit scale, the tree's share of a column as in their
analysis (one item is in b + 1 nodes of its block's tree). Step t in block b releases the noisy
sums of blocks 0 .. b - 1 plus the tree's noisy prefix of its block, m = t - 2^b + 1 steps
(the nodes of m's binary digits):

    noise_t = sum_{b' < b} z_{b'} + (b + 1) sum_{j : bit j of m} z_{b, j, (m >> j) - 1}

As A = L R: R's rows are the block sums (weight 1) and the tree nodes (weight 1 / (b + 1)); L
adds them back with weights 1 and b + 1. Every column of R has l2 norm^2 1 + 1 / (b + 1) <= 2
(2 at t = 1) and l1 norm 2, whatever the horizon: nothing depends on how many steps follow,
and the variance at step t is s^2 (b + (b + 1)^2 popcount(m)), s^2 the node variance
(O(log^3 t)). Gaussian noise (zCDP), float only here: a discrete version needs one sampler per
block (nodes of different scales), and a Laplace interval of these unequal weights is not yet
in `tails`.

>>> from transforms.mechanisms import make
>>> m = make("hybrid", 10, rho=0.5, noise="float", seed=1)
>>> [round(float(v), 6) for v in m.noise_variance() / m.node_variance]
[1.0, 5.0, 5.0, 11.0, 11.0, 20.0, 11.0, 19.0, 19.0, 35.0]
"""
from __future__ import annotations

import math

import numpy as np

from transforms import validation as check
from .base import ContinualMechanism
from .privacy import GAUSSIAN
from . import tails


def block_and_prefix(t: np.ndarray):
    """1-based steps t -> (block b = floor(log2 t), prefix m = t - 2^b + 1 within it)."""
    t = np.asarray(t, dtype=np.int64)
    b = np.floor(np.log2(t)).astype(np.int64)
    b -= (np.left_shift(1, b) > t)  # float log2 of large t may round up
    b += (np.left_shift(1, b + 1) <= t)
    return b, t - np.left_shift(1, b) + 1


def hybrid_terms(horizon: int) -> np.ndarray:
    """Per step t = 1..T: sum of L[t, i]^2 (b + (b + 1)^2 popcount(m)), the closed form."""
    b, m = block_and_prefix(np.arange(1, horizon + 1))
    return (b + (b + 1) ** 2 * np.bitwise_count(m).astype(np.int64)).astype(np.float64)


class Hybrid(ContinualMechanism):
    """The hybrid mechanism (the module docstring): no horizon; Gaussian, float noise."""

    name = "hybrid"
    auto_rank = 95
    pure_dp = False
    horizon_free = True

    @classmethod
    def candidates(cls, horizon, noise, pure_dp):
        return []  # for releases with no horizon (a baseline: `log_sqrt_toeplitz` is better)

    def __init__(self, horizon, budget, noise_source, **kwargs):
        super().__init__(horizon, budget, noise_source, **kwargs)
        if self.distribution != GAUSSIAN:
            check.fail("privacy", "rho, or epsilon and delta, for hybrid (its Laplace "
                                  "intervals are not implemented)", "epsilon alone")
        if self.discrete:
            check.fail("noise", "'float' for hybrid (a discrete version needs a sampler per "
                                "block)", self.noise)

    # ----- factorization -----------------------------------------------------------------------
    def column_norm(self, p):
        # column t in block b: 1 (its block's sum) and b + 1 nodes of weight 1 / (b + 1);
        # the largest over every horizon is at t = 1 (b = 0) for p = 2, and 2 for p = 1
        return 2.0 if p == 1 else math.sqrt(2.0)

    def set_sensitivity(self, p, k, d):
        return k * self.column_norm(p)  # the triangle inequality over a unit's k changes

    def _squared_weights(self):
        if "squared_weights" not in self._cache:
            self._cache["squared_weights"] = hybrid_terms(self.horizon)
        return self._cache["squared_weights"]

    def _equal_weight_terms(self):
        return None

    def _noise_rows(self):
        raise AssertionError("hybrid's intervals are Gaussian: `confidence_half_width`")

    def confidence_half_width(self, level: float = 0.95, simultaneous: bool = False):
        """Gaussian node noise: a step's noise is N(0, its variance), so its quantile is
        exact in closed form (`tails.gaussian_quantile`)."""
        level = check.open_unit_interval("level", level)
        check.boolean("simultaneous", simultaneous)
        alpha = (1.0 - level) / (self.horizon if simultaneous else 1)
        return tails.gaussian_quantile(alpha) * np.sqrt(self.noise_variance())

    def increment_squares(self) -> np.ndarray:
        """Per step, ||L_t - L_{t-1}||^2 (the step's own value's noise, `increments`): within
        a block, m's node at level k (its trailing zeros) replaces m - 1's k nodes below it,
        all of weight b + 1: (k + 1)(b + 1)^2; at a block's first step (m = 1, b >= 1) the
        last block's sum (1) replaces its root (weight b) and the new leaf comes in (b + 1):
        1 + b^2 + (b + 1)^2; at t = 1, 1."""
        b, m = block_and_prefix(np.arange(1, self.horizon + 1))
        trailing = np.bitwise_count((m & -m) - 1).astype(np.int64)  # trailing zeros of m
        squares = ((trailing + 1) * (b + 1) ** 2).astype(np.float64)
        first = (m == 1) & (b >= 1)
        squares[first] = (1 + b[first] ** 2 + (b[first] + 1) ** 2).astype(np.float64)
        squares[0] = 1.0
        return squares

    def _unit_noise(self, start, count):
        """(L z)[start:start+count] for unit Gaussian nodes z (0-based steps); one step reads
        only its own nodes (`_step_noise`), with the same operations in the same order."""
        if count == 1:
            return np.array([self._step_noise(start)])
        t = np.arange(start + 1, start + count + 1)
        if count == 0:
            return np.zeros(0)
        b, m = block_and_prefix(t)
        top = int(b[-1])
        logs = np.concatenate(([0.0], np.cumsum(self._draw(0, 0, top + 1))))
        out = logs[b].copy()
        for block in np.unique(b).tolist():
            inside = b == block
            nodes = self._draw(1 + block, 0, (1 << (block + 1)) - 1)
            prefix = m[inside]
            total = np.zeros(prefix.shape[0])
            offset = 0
            for level in range(block + 1):
                bit = (prefix >> level) & 1 == 1
                index = np.where(bit, (prefix >> level) - 1, 0) + offset
                total += np.where(bit, nodes[index], 0.0)
                offset += 1 << (block - level)
            out[inside] += (block + 1) * total
        return out

    def _step_noise(self, start: int) -> float:
        """`_unit_noise` of one step: the cumulative sum of the completed blocks' nodes, then
        (b + 1) times the sum of the prefix's tree nodes, level by level (bit for bit the
        batch path's floats: adding 0.0 for a level without a node changes nothing)."""
        b, m = (int(v[0]) for v in block_and_prefix(np.array([start + 1])))
        logs = 0.0
        for block in range(b):
            logs += self._draw_one(0, block)
        total, offset = 0.0, 0
        for level in range(b + 1):
            if (m >> level) & 1:
                total += self._draw_one(1 + b, offset + (m >> level) - 1)
            offset += 1 << (b - level)
        return logs + (b + 1) * total

    def dense_factors(self):
        """(L, R) for small T: R's rows are the block sums, then each block's tree nodes."""
        horizon = self.horizon
        blocks = int(block_and_prefix(np.array([horizon]))[0][0]) + 1
        rows, left_columns = [], []
        for block in range(blocks):  # the logarithmic part: block sums
            lo, hi = (1 << block) - 1, min((1 << (block + 1)) - 1, horizon)
            row = np.zeros(horizon)
            row[lo:hi] = 1.0
            rows.append(row)
            left_columns.append(("log", block))
        for block in range(blocks):  # the binary part: tree nodes, weight 1 / (b + 1)
            for level in range(block + 1):
                for i in range(1 << (block - level)):
                    lo = (1 << block) - 1 + (i << level)
                    hi = min(lo + (1 << level), horizon)
                    row = np.zeros(horizon)
                    if lo < horizon:
                        row[lo:hi] = 1.0 / (block + 1)
                    rows.append(row)
                    left_columns.append(("tree", block, level, i))
        right = np.array(rows)
        left = np.zeros((horizon, len(rows)))
        for step in range(horizon):
            b, m = (int(v[0]) for v in block_and_prefix(np.array([step + 1])))
            for column, what in enumerate(left_columns):
                if what[0] == "log" and what[1] < b:
                    left[step, column] = 1.0
                elif what[0] == "tree" and what[1] == b:
                    level, i = what[2], what[3]
                    if (m >> level) & 1 and i == (m >> level) - 1:
                        left[step, column] = b + 1.0
        return left, right

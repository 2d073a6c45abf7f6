"""Brute force over S_{D,k}: every integer vector with interval sums in [-D, D], l1 <= k."""
from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=None)
def sensitivity_set(horizon: int, d: int, k: int) -> np.ndarray:
    """All vectors of S_{D,k} in Z^T (as rows), built step by step on prefix sums."""
    vectors = np.zeros((1, 0), dtype=np.int8)
    prefix = np.zeros(1, dtype=np.int16)
    low = np.zeros(1, dtype=np.int16)
    high = np.zeros(1, dtype=np.int16)
    mass = np.zeros(1, dtype=np.int16)
    for _ in range(horizon):
        parts = []
        for step in range(-d, d + 1):
            new_prefix = prefix + step
            new_low, new_high = np.minimum(low, new_prefix), np.maximum(high, new_prefix)
            new_mass = mass + abs(step)
            ok = (new_high - new_low <= d) & (new_mass <= k)
            parts.append((np.concatenate([vectors[ok], np.full((ok.sum(), 1), step, np.int8)],
                                         axis=1), new_prefix[ok], new_low[ok], new_high[ok],
                          new_mass[ok]))
        vectors, prefix, low, high, mass = (np.concatenate(p) for p in zip(*parts))
    return vectors


def brute_sensitivity(right: np.ndarray, d: int, k: int, p: int) -> float:
    vectors = sensitivity_set(right.shape[1], d, k)
    best = 0.0
    for chunk in range(0, vectors.shape[0], 200_000):
        images = vectors[chunk:chunk + 200_000].astype(np.float64) @ right.T
        best = max(best, float(np.max(np.sum(np.abs(images) ** p, axis=1)) ** (1.0 / p)))
    return best

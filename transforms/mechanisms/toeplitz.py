"""Lower-triangular Toeplitz factorizations A = L R with L = T(f_left), R = T(f_right):

- square root (seeds 003/004): f_left = f_right = f, f(0) = 1, f(j) = f(j-1) (2j-1)/(2j);
- naive composition: L = I, R = A (fresh noise every step, sensitivity grows with T);
- input perturbation: L = A, R = I (noise on every input, running sums of it).

The noise vector L z (unit z, one node per time step on level 0) is computed once per stream for
the whole horizon (FFT convolution for the square root, exact cumsum for input perturbation) and
cached on the mechanism object, not in the state. Streaming steps read from the same vector as
batch release, so both agree bit for bit. The streaming state stays (steps, running total);
what the square root needs beyond it is the O(T) noise vector, re-derived from the seam on demand.
"""
from __future__ import annotations


import numpy as np

from . import _validation as check
from . import sensitivity
from .base import ContinualMechanism
from .noise import stream_bytes


def sqrt_coefficients(n: int) -> np.ndarray:
    """f(0..n-1) of the square root of A: f(j) = binom(2j, j) / 4^j."""
    ratios = (2.0 * np.arange(1, n) - 1.0) / (2.0 * np.arange(1, n))
    return np.concatenate(([1.0], np.cumprod(ratios)))


def toeplitz_lower(coefficients: np.ndarray) -> np.ndarray:
    n = coefficients.shape[0]
    index = np.arange(n)
    lag = index[:, None] - index[None, :]
    return np.where(lag >= 0, coefficients[np.clip(lag, 0, n - 1)], 0.0)


class ToeplitzMechanism(ContinualMechanism):
    """Shared implementation; subclasses give the left and right coefficient vectors."""

    _CACHE_BYTES = 64 << 20  # noise vectors kept, shared by for_stream copies

    def left_coefficients(self) -> np.ndarray:
        raise NotImplementedError

    def right_coefficients(self) -> np.ndarray:
        raise NotImplementedError

    def column_norm(self, p):
        # Column j of T(f) is f[0:T-j]; with f >= 0 the first column is the largest.
        key = ("column_norm", p)
        if key not in self._cache:
            self._cache[key] = float(np.sum(self.right_coefficients() ** p) ** (1.0 / p))
        return self._cache[key]

    def set_sensitivity(self, p, k, d):
        return sensitivity.toeplitz_set_sensitivity(self.right_coefficients(), p, k, d)

    def _squared_weights(self):
        if "squared_weights" not in self._cache:
            self._cache["squared_weights"] = np.cumsum(self.left_coefficients() ** 2)
        return self._cache["squared_weights"]

    def _unit_z(self, start: int, count: int) -> np.ndarray:
        return self._draw(0, start, count)

    def _noise_vector(self) -> np.ndarray:
        raise NotImplementedError

    def _unit_noise(self, start, count):
        vectors = self._cache.setdefault("stream_noise", {})
        key = stream_bytes(self.stream)
        vector = vectors.get(key)
        if vector is None:
            vector = self._noise_vector()
            while vectors and (len(vectors) + 1) * vector.nbytes > self._CACHE_BYTES:
                vectors.pop(next(iter(vectors)))  # oldest first
            vectors[key] = vector
        return vector[start:start + count]

    def dense_factors(self, max_horizon: int = 4096):
        return (toeplitz_lower(self.left_coefficients()),
                toeplitz_lower(self.right_coefficients()))


class SqrtToeplitz(ToeplitzMechanism):
    """L = R = sqrt(A) (seed 003 Thm 1.1; seed 004 Sec. 8)."""

    name = "sqrt_toeplitz"

    def __init__(self, horizon, budget, noise_source, **kwargs):
        super().__init__(horizon, budget, noise_source, **kwargs)
        if self.discrete:
            check.fail("noise", "'float' for sqrt_toeplitz (its real-valued R has no "
                                "discretised release yet; choose a tree for secure noise)",
                       self.noise)

    def left_coefficients(self):
        if "f" not in self._cache:
            self._cache["f"] = sqrt_coefficients(self.horizon)
        return self._cache["f"]

    right_coefficients = left_coefficients

    def _noise_vector(self):
        z = self._unit_z(0, self.horizon)
        size = 1 << max(1, (2 * self.horizon - 1).bit_length())
        spectrum = np.fft.rfft(self.left_coefficients(), size) * np.fft.rfft(z, size)
        return np.fft.irfft(spectrum, size)[:self.horizon]

    def _equal_weight_terms(self):
        return None


class NaiveComposition(ToeplitzMechanism):
    """L = I, R = A: every step gets fresh noise calibrated to the whole horizon."""

    name = "naive_composition"

    def left_coefficients(self):
        return np.concatenate(([1.0], np.zeros(self.horizon - 1)))

    def right_coefficients(self):
        return np.ones(self.horizon)

    def _unit_noise(self, start, count):
        return self._unit_z(start, count)

    def set_sensitivity(self, p, k, d):
        return sensitivity.prefix_matrix_sensitivity(self.horizon, p, k, d)

    def _equal_weight_terms(self):
        return np.ones(self.horizon, dtype=np.int64)


class InputPerturbation(ToeplitzMechanism):
    """L = A, R = I: noise on every input; the output adds up all noise so far."""

    name = "input_perturbation"

    def left_coefficients(self):
        return np.ones(self.horizon)

    def right_coefficients(self):
        return np.concatenate(([1.0], np.zeros(self.horizon - 1)))

    def _noise_vector(self):
        return np.cumsum(self._unit_z(0, self.horizon))

    def set_sensitivity(self, p, k, d):
        return sensitivity.identity_sensitivity(self.horizon, p, k, d)

    def _equal_weight_terms(self):
        return np.arange(1, self.horizon + 1, dtype=np.int64)

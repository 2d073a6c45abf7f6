"""Lower-triangular Toeplitz factorizations A = L R with L = T(f_left), R = T(f_right):

- square root (Fichtenberger et al. 2023; Andersson et al. 2026): f_left = f_right = f,
  f(0) = 1, f(j) = f(j-1) (2j-1)/(2j);
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

import inspect
import math
import threading

from transforms import validation as check
from . import sensitivity, tails
from .base import ContinualMechanism, HistoryState
from .privacy import GAUSSIAN
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


# what the float square root and input perturbation hold besides a CounterState (`plan`)
_NOISE_VECTOR_STATE = "17 B (+ O(T) noise vector re-derived from the seam)"
_NOISE_VECTOR_MEMORY = "+ O(T) noise vector per stream in worker memory"

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


FIXED_BITS = 16             # R~ = round(2^16 f) / 2^16 (non-negative, non-increasing like f)
MAX_TOTAL_CHANGE = 1 << 46  # sum_t |x_t| per key (7e13): F x and round(R~ x / g) fit int64
DIRECT_LIMIT = 1 << 15      # batch computes step by step (bit-identical to streaming) up to here
ROUNDING_SHARE = 0.01       # the rounding term is at most ~1 % of the sensitivity (grid choice)


def series_inverse(coefficients: np.ndarray) -> np.ndarray:
    """First n coefficients of 1 / c(x) (c(0) != 0), Newton iteration with FFT products."""
    n = coefficients.shape[0]
    inverse = np.array([1.0 / coefficients[0]])
    while inverse.shape[0] < n:
        m = min(2 * inverse.shape[0], n)
        size = 1 << (2 * m - 1).bit_length()
        product = np.fft.irfft(np.fft.rfft(coefficients[:m], size) * np.fft.rfft(inverse, size),
                               size)[:m]
        correction = -product
        correction[0] += 2.0
        inverse = np.fft.irfft(np.fft.rfft(inverse, size) * np.fft.rfft(correction, size),
                               size)[:m]
    return inverse


# numpy >= 2.0 writes a transform into a given array (`out=`); older numpy allocates it
_FFT_OUT = "out" in inspect.signature(np.fft.rfft).parameters
_SCRATCH = threading.local()  # this thread's transform buffers (`_scratch`)


def _scratch(complex_count: int, real_count: int):
    """Views of the first `complex_count` complex and `real_count` real values of this
    thread's transform buffers, kept between calls (grown when a call needs more: 36 B per
    step of the longest horizon the thread released): arrays that large are returned to the
    OS when freed, and a new one is mapped in again page by page on every call."""
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None or buffers[0].shape[0] < complex_count \
            or buffers[1].shape[0] < real_count:
        held = (0, 0) if buffers is None else (buffers[0].shape[0], buffers[1].shape[0])
        buffers = _SCRATCH.buffers = (np.empty(max(complex_count, held[0]), np.complex128),
                                      np.empty(max(real_count, held[1]), np.float64))
    return buffers[0][:complex_count], buffers[1][:real_count]


def _into(transform, values: np.ndarray, out: np.ndarray, **options) -> np.ndarray:
    """transform(values, **options), written into `out` where numpy can (the same values)."""
    return transform(values, out=out, **options) if _FFT_OUT else transform(values, **options)


def convolve(spectrum: np.ndarray, values: np.ndarray, size: int, stop: int) -> np.ndarray:
    """irfft(rfft(values, size) * spectrum, size)[:stop], the same bits, in this thread's
    buffers (`_scratch`): a view of them, valid until its next transform."""
    frequencies, signal = _scratch(size // 2 + 1, size)
    frequencies = _into(np.fft.rfft, values, frequencies, n=size)
    # rfft(values) times spectrum, in this order: numpy computed `spectrum * rfft(...)` so
    # (it reuses a temporary left operand), and the order changes a product's bits
    np.multiply(frequencies, spectrum, out=frequencies)
    return _into(np.fft.irfft, frequencies, signal, n=size)[:stop]


def _blocks(n: int):
    """(B, K): an exact convolution of n values splits them into K <= 8 blocks of B, a power
    of two (8 B >= n)."""
    block = 1 << max(0, (n - 1).bit_length() - 3)
    return block, -(-n // block)


def block_spectra(coefficients: np.ndarray, n: int) -> np.ndarray:
    """rfft (2B points, `_blocks`) of F[dB - B, dB + B) for d < K (F = 0 before 0): the lags
    of F through which block j of v reaches block j + d of F * v."""
    block, count = _blocks(n)
    padded = np.zeros((count + 1) * block)
    padded[block:block + n] = coefficients[:n]
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * block)[::block][:count]
    return np.fft.rfft(windows, axis=1)


def block_convolution(spectra: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(F * v)_t for t < K B as K rows of B floats (a view of this thread's buffers, valid
    until its next transform), from `block_spectra` of F (overlap-save): row i is the last B
    points of the 2B-point cyclic convolution of sum_{j <= i} window_{i-j} (x) block_j (v's
    block j zero padded), the sum taken on the spectra. One transform of K rows of 2B points
    each way instead of 2^21-point ones, whose data miss the processor's caches."""
    n = values.shape[0]
    block, count = _blocks(n)
    width = block + 1
    complexes, reals = _scratch((count + 2) * width, 2 * count * block)
    signals = reals.reshape(count, 2 * block)
    signals[:, block:] = 0.0
    rows = n // block
    signals[:rows, :block] = values[:rows * block].reshape(rows, block)
    if rows < count:
        signals[rows, :n - rows * block] = values[rows * block:]
        signals[rows, n - rows * block:block] = 0.0
    frequencies = _into(np.fft.rfft, signals, complexes[:count * width].reshape(count, width),
                        axis=1)
    total, product = complexes[count * width:(count + 1) * width], complexes[-width:]
    for i in range(count - 1, -1, -1):  # row i needs rows j <= i: from the last, in place
        np.multiply(frequencies[i], spectra[0], out=total)
        for j in range(i):
            np.add(total, np.multiply(frequencies[j], spectra[i - j], out=product), out=total)
        frequencies[i] = total
    return _into(np.fft.irfft, frequencies, signals, n=2 * block, axis=1)[:, block:]


def _exact_rounding(raw: np.ndarray, n: int) -> np.ndarray:
    """The first n of rint(raw) as int64 (`block_convolution`'s rows in order), failing
    closed unless every value is within 1/4 of it (`raw` is overwritten)."""
    rounded = np.rint(raw)
    deviation = np.abs(np.subtract(raw, rounded, out=raw), out=raw)
    if np.max(deviation, initial=0.0) > 0.25:
        raise AssertionError("limb convolution is not exact")
    return rounded.astype(np.int64).reshape(-1)[:n]


def exact_convolution(coefficients: np.ndarray, values: np.ndarray, spectra=None
                      ) -> np.ndarray:
    """(F * v)_t = sum_{s <= t} F[t - s] v[s] exactly in int64, for 0 <= F <= 2^16,
    sum |v| < 2^46 and t < 2^20, by `block_convolution`. Every float FFT sum is kept below
    2^42 in magnitude, far inside exact rounding, and the result is checked to be integral
    (fails closed otherwise):
    - sum |v| < 2^26 (e.g. counts): one signed product with the whole F (|sum| <= 2^16 sum |v|);
    - otherwise v is split into its positive and negative parts and 12-bit limbs, F into 9-bit
      limbs (each limb product is below 2^9 2^12 2^20 = 2^41); each part's total is at most
      2^16 sum |v| < 2^62."""
    n = values.shape[0]
    f_spectra = spectra.get(n) if spectra is not None else None
    if f_spectra is None:
        f_limbs = [coefficients[:n]] + [(coefficients[:n] >> (9 * a)) & 0x1FF for a in range(2)]
        f_spectra = [block_spectra(limb.astype(np.float64), n) for limb in f_limbs]
        if spectra is not None:
            spectra.clear()  # one horizon prefix at a time (bounded memory)
            spectra[n] = f_spectra
    whole, limb_spectra = f_spectra[0], f_spectra[1:]
    if int(np.sum(np.abs(values))) < 1 << 26:
        return _exact_rounding(block_convolution(whole, values.astype(np.float64)), n)
    total = np.zeros(n, dtype=np.int64)
    for sign, part in ((1, np.maximum(values, 0)), (-1, np.maximum(-values, 0))):
        for b in range(4):
            limb = (part >> (12 * b)) & 0xFFF
            if not limb.any():
                continue
            limb = limb.astype(np.float64)
            for a, f_spectrum in enumerate(limb_spectra):
                rounded = _exact_rounding(block_convolution(f_spectrum, limb), n)
                total += sign * (rounded << (9 * a + 12 * b))
    return total


class SqrtToeplitz(ToeplitzMechanism):
    """L = R = sqrt(A) (Fichtenberger et al. 2023 Thm 1.1; Andersson et al. 2026 Sec. 8).

    Float noise: L (R x + z) with continuous Gaussian or Laplace z.
    Discrete noise (zCDP only): the release is g L~ y with the integer vector
    y = round(R~ x / g) + z, z discrete Gaussian, R~ = round(2^16 f) / 2^16 (still non-negative
    and non-increasing, so Thm 8.4 applies), L~ = A R~^-1 (so L~ R~ = A: no bias) and the grid
    g = 2^-G. The output depends on the data only through y (L~ is applied to y alone).
    Sensitivity of y: |round(a) - round(b)| <= |a - b| + 1 per coordinate, and a unit changes at
    most T coordinates, so Delta_2(y) <= Delta_2(R~) / g + sqrt(T); G is the smallest with
    sqrt(T) <= ROUNDING_SHARE Delta_2(R~) / g (at most 1 % more noise than the real-valued R),
    capped at 16.
    R~ x is computed exactly in integers; streaming keeps x and round(R~ x / g) (O(T) state).
    """

    name = "sqrt_toeplitz"
    auto_rank = 50
    DIRECT_STEPS = 0  # steps a batch past DIRECT_LIMIT still releases by dot products
    fixed_bits = FIXED_BITS  # R~ = round(2^b f) / 2^b (b <= 16: `exact_convolution`)

    @classmethod
    def candidates(cls, horizon, noise, pure_dp):
        # the discrete square root is calibrated for zCDP and horizons up to 2^20
        return [{}] if noise == "float" or (not pure_dp and horizon <= 1 << 20) else []

    @classmethod
    def state_note(cls, noise):
        return "O(T): 16 B per step (x and round(R x / g) history)" if noise == "discrete" \
            else _NOISE_VECTOR_STATE

    @classmethod
    def memory_note(cls, noise):
        return "16 B per step: the input history" if noise == "discrete" \
            else _NOISE_VECTOR_MEMORY

    def __init__(self, horizon, budget, noise_source, **kwargs):
        super().__init__(horizon, budget, noise_source, **kwargs)
        if self.discrete and self.distribution != GAUSSIAN:
            check.fail("noise", "'float' for sqrt_toeplitz under pure DP (its discrete release "
                                "is calibrated for rho or epsilon + delta)", self.noise)
        if self.discrete and self.horizon > 1 << 20:
            check.fail("horizon", f"<= 2^20 for the discrete {self.name}", self.horizon)
        if self.discrete:  # its sampling table must hold the noise (else fail now, not later)
            from .discrete import MAX_TABLE
            sigma = self.sensitivity / math.sqrt(2.0 * self.budget.rho)
            if sigma * 4.9 > MAX_TABLE:
                check.fail("rho", f"large enough for the discrete {self.name} at horizon "
                                  f"{self.horizon} (its noise of {sigma:.3g} grid units exceeds "
                                  f"the sampling table; use a tree or noise='float')",
                           self.budget.rho)

    def left_coefficients(self):
        if not self.discrete:
            return self._f()
        if "left" not in self._cache:  # L~ = A R~^-1: prefix sums of the series inverse
            self._cache["left"] = np.cumsum(series_inverse(self.right_coefficients()))
        return self._cache["left"]

    def _f(self):
        if "f" not in self._cache:
            self._cache["f"] = sqrt_coefficients(self.horizon)
        return self._cache["f"]

    def fixed_coefficients(self) -> np.ndarray:
        if "fixed" not in self._cache:
            self._cache["fixed"] = np.rint(self._f() * (1 << self.fixed_bits)).astype(np.int64)
        return self._cache["fixed"]

    def right_coefficients(self):
        if not self.discrete:
            return self._f()
        return self.fixed_coefficients() / float(1 << self.fixed_bits)

    @property
    def integer_release(self) -> bool:
        return False  # g L~ y: a real-valued post-processing of the integer vector y

    # ----- discrete calibration ----------------------------------------------------------------
    def _rounding_term(self) -> float:
        return math.sqrt(self.horizon)

    @property
    def grid_bits(self) -> int:
        """G: the grid is g = 2^-G (0 <= G <= 16)."""
        base = sensitivity.sensitivity(self, 2, self.max_contributions, self.interval_bound)
        target = self._rounding_term() / (ROUNDING_SHARE * base)   # want 2^G >= target
        return int(min(self.fixed_bits, max(0, math.ceil(math.log2(target)))))

    @property
    def grid(self) -> float:
        return 2.0 ** -self.grid_bits

    @property
    def sensitivity(self) -> float:
        """l2 sensitivity of the integer vector y (discrete), else of R."""
        if "sensitivity" not in self._cache:
            base = sensitivity.sensitivity(self, self.budget.sensitivity_norm,
                                           self.max_contributions, self.interval_bound)
            if self.discrete:
                base = base * 2.0 ** self.grid_bits + self._rounding_term()
            self._cache["sensitivity"] = base
        return self._cache["sensitivity"]

    @property
    def node_scale(self) -> float:
        scale = super().node_scale
        return scale * self.grid if self.discrete else scale

    @property
    def node_variance(self) -> float:
        variance = super().node_variance
        return variance * self.grid ** 2 if self.discrete else variance

    def rounding_bound(self, increments: bool = False):
        """Discrete noise: the release is g L~ (round(R~ x / g) + z) and A x = g L~ (R~ x / g),
        so besides g L~ z it is off by g L~ e with |e_j| <= 1/2 (the rounding): at most
        (g / 2) sum_j |l~_j| over the step's row (of D L~ for the step's own value). The
        intervals add it (it is about 1 % of the noise's quantile by the choice of g; at a
        huge budget the noise is 0 and it is all the interval holds)."""
        if not self.discrete:
            return super().rounding_bound(increments)
        key = ("rounding_bound", increments)
        if key not in self._cache:
            weights = self.left_coefficients()
            if increments:
                weights = np.diff(weights, prepend=0.0)
            self._cache[key] = 0.5 * self.grid * np.cumsum(np.abs(weights))
        return self._cache[key].copy()

    def _noise_node(self):
        """Discrete noise: the release is g L~ z (plus the data part), so the node law is the
        discrete Gaussian of the sampler and the factor the grid g; L~'s weights are not
        integers (`tails`: the smoothed inversion, exact to two grid units)."""
        if not self.discrete:
            return super()._noise_node()
        return tails.node_law(self.sampler.kind, self.sampler.parameter), self.grid

    # ----- discrete release --------------------------------------------------------------------
    def init_state(self):
        return HistoryState() if self.discrete else super().init_state()

    @classmethod
    def state_size(cls, horizon, noise="discrete", steps=None):
        """Discrete noise: a `HistoryState`, 9 B + 16 B per released step (x_t and
        round(R~ x / g)_t as int64): 9 + 16 T at the end of the horizon (140,169 B at
        T = 8760). Float noise: the 17 B `CounterState` (its O(T) noise vector is worker memory,
        re-derived from the seam, not state)."""
        if noise != "discrete":
            return super().state_size(horizon, noise, steps)
        steps = horizon if steps is None else steps
        return HistoryState._HEADER.size + 16 * steps

    def _counter_advance(self):
        return not self.discrete  # float noise: the base CounterState advance (and step)

    def advance(self, state, values):
        if not self.discrete:
            return super().advance(state, values)
        out, inputs, rounded = self._discrete_advance(state, values)
        return out, HistoryState(state.steps + out.shape[0], tuple(inputs.tolist()),
                                 tuple(rounded.tolist()))

    def release(self, x):
        # the batch release keeps no state: its 2 T history integers are not turned into
        # Python tuples (a quarter of the discrete release's time at T = 2^20)
        if not self.discrete:
            return super().release(x)
        return self._discrete_advance(self.init_state(), x)[0]

    def _discrete_advance(self, state, values):
        """`advance` with discrete noise: (outputs, the whole input history x, the whole
        round(R~ x / g)) as arrays; `advance` makes them the new HistoryState."""
        if not isinstance(state, HistoryState):
            check.fail("state", "a HistoryState", state)
        xs = np.asarray(values, dtype=np.float64).reshape(-1)
        if not np.all(np.isfinite(xs)):  # (showing no finite value: private data)
            check.fail("values", "finite numbers", xs[~np.isfinite(xs)][:3].tolist())
        if not np.all(xs == np.round(xs)):
            check.fail("values", f"integers for the discrete {self.name}", "non-integers")
        history = np.abs(np.array(state.inputs, dtype=np.float64))
        if float(np.sum(np.abs(xs))) + float(np.sum(history)) >= MAX_TOTAL_CHANGE:
            # fail closed, without the values in the message (they are private)
            check.fail("values", f"a stream with sum |x| < 2^46 per key for the discrete "
                                 f"sqrt_toeplitz", "a larger stream")
        start, count = state.steps, xs.shape[0]
        if start + count > self.horizon:
            check.fail("steps released", f"<= horizon ({self.horizon})", start + count)
        inputs = xs.astype(np.int64)
        if len(state.inputs):  # (a batch release has no history to join)
            inputs = np.concatenate((np.array(state.inputs, dtype=np.int64), inputs))
        shift = self.fixed_bits - self.grid_bits
        fixed = self.fixed_coefficients()
        if start + count > DIRECT_LIMIT and count > 1:
            products = exact_convolution(fixed, inputs,
                                         self._cache.setdefault("fixed_spectra", {}))[start:]
        else:
            reversed_fixed = self._cache.get("reversed_fixed")
            if reversed_fixed is None:
                reversed_fixed = self._cache["reversed_fixed"] = fixed[::-1].copy()
            high, low = inputs >> 23, inputs & ((1 << 23) - 1)  # int64 dots stay < 2^59
            products = np.array([(int(np.dot(reversed_fixed[self.horizon - 1 - t:],
                                             high[:t + 1])) << 23)
                                 + int(np.dot(reversed_fixed[self.horizon - 1 - t:],
                                              low[:t + 1]))
                                 for t in range(start, start + count)], dtype=np.int64)
        if shift:
            products = (products + (1 << (shift - 1))) >> shift  # round half up, exactly
        rounded = products
        if len(state.rounded):
            rounded = np.concatenate((np.array(state.rounded, dtype=np.int64), products))
        noise = self._draw(0, 0, start + count).astype(np.int64)
        integers = np.add(rounded, noise, out=noise).astype(np.float64)  # y, exact (|y| < 2^53)
        left = self._reversed_left()
        if start + count > DIRECT_LIMIT and count > 1:
            n = start + count
            size = 1 << (2 * n - 1).bit_length()
            spectra = self._cache.setdefault("left_spectra", {})
            if (n, size) not in spectra:
                spectra.clear()  # bounded memory
                spectra[(n, size)] = np.fft.rfft(self.left_coefficients()[:n], size)
            out = convolve(spectra[(n, size)], integers, size, n)[start:]
            direct = min(self.DIRECT_STEPS, n)  # (the caller may overwrite `out`)
            out[:max(0, direct - start)] = [np.dot(left[self.horizon - 1 - t:],
                                                   integers[:t + 1])
                                            for t in range(start, direct)]
        else:
            out = np.array([np.dot(left[self.horizon - 1 - t:], integers[:t + 1])
                            for t in range(start, start + count)])
        return self.grid * out, inputs, rounded

    def last_output(self, state):
        if not self.discrete:
            return super().last_output(state)
        if state.steps == 0:
            return 0.0
        last = state.steps - 1  # the last step again, from the history before it (count 1)
        before = HistoryState(last, state.inputs[:last], state.rounded[:last])
        return float(self.advance(before, [float(state.inputs[last])])[0][0])

    def _reversed_left(self) -> np.ndarray:
        if "reversed_left" not in self._cache:
            self._cache["reversed_left"] = self.left_coefficients()[::-1].copy()
        return self._cache["reversed_left"]

    def _noise_vector(self):
        z = self._unit_z(0, self.horizon)
        size = 1 << max(1, (2 * self.horizon - 1).bit_length())
        left = self._cache.get("left_spectrum")  # the same for every stream: once
        if left is None:
            left = self._cache["left_spectrum"] = np.fft.rfft(self.left_coefficients(), size)
        return np.fft.irfft(left * np.fft.rfft(z, size), size)[:self.horizon]

    def _equal_weight_terms(self):
        return None


class NaiveComposition(ToeplitzMechanism):
    """L = I, R = A: every step gets fresh noise calibrated to the whole horizon."""

    name = "naive_composition"
    auto_rank = 70

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
    auto_rank = 80

    @classmethod
    def state_note(cls, noise):
        return _NOISE_VECTOR_STATE

    @classmethod
    def memory_note(cls, noise):
        return _NOISE_VECTOR_MEMORY

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

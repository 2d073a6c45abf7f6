"""Buffered linear Toeplitz (BLT) factorization (Dvijotham, McMahan, Pillutla, Steinke, Thakurta
2024; McKenna 2024): square-root-quality noise with O(d) streaming memory.

The right factor R = C is lower-triangular Toeplitz with generating sequence

    c_0 = 1,   c_j = sum_i w_i theta_i^(j-1)   (j >= 1),

d "buffers" with decays theta_i in (0, 1) and weights w_i > 0. The left factor is L = A C^-1, so
L R = A. Its noise L z is generated in streaming with d buffers and one accumulator
(Alg. 3 of McKenna 2024, then a running sum):

    u_t = z_t - sum_i w_i buf_i,   buf_i <- theta_i buf_i + u_t,   acc <- acc + u_t,

so u = C^-1 z and acc_t = (L z)_t: O(d) work and O(d) memory per step. The noise depends only
on the keyed node noise z, never on the data, so the buffers are not part of the serialised state
(still `CounterState`, 17 B): they are kept per stream in the mechanism's cache (d + 2 floats) and
re-derived from the noise seam (O(t d), once) when a state arrives without them (a new process,
a resumed run). Batch release runs the same per-step arithmetic, so both agree bit for bit.

Privacy. The optimiser is restricted to the monotone family (w_i > 0, sum w_i < 1: c is
non-negative and non-increasing, also the family of the jax_privacy BLT optimiser), where Andersson
et al. 2026
Thm 8.4 gives sens_2(S_{D,k}) <= sqrt(kD) ||c||_2. The check is made exactly on the computed
coefficients for the horizon in use (`sensitivity.toeplitz_set_sensitivity`); if it ever failed,
the valid general bound k ||c||_p is used and `factorization()` says so. On S_{1,1} the
sensitivity is the first column norm (exact for every Toeplitz R).

Error. MaxSE^2 = sigma^2 sum_{j<T} l_j^2 and MeanSE^2 = sigma^2 mean_t sum_{j<=t} l_j^2 with
l = A C^-1's generating sequence, computed exactly in O(T d) from the inverse BLT
(C^-1 has decays theta_hat, the roots of the secular equation 1 + sum_i w_i / (lambda - theta_i)
= 0, and l_j = a + sum_k b_k theta_hat_k^j with a, b_k > 0). The parameters minimise
log(error) + log(sensitivity^2) for (T, metric) over (log(1 - theta), log(1 - theta_hat)) pairs
with closed-form O(d^2) objectives and a BFGS quasi-Newton from interlaced log-spaced decays
(0.3-0.9 s per (T, d, metric) for T <= 2^20, so no committed table); results are cached per
(T, d, metric) in an lru_cache. The square root is the optimal Toeplitz factorization for MaxSE, so a BLT
approaches it from above (1.0011x at T = 2^20 with 6 buffers).

Noise: continuous float noise only (`noise="float"`); a discrete construction would need an
exact R~ x, which a BLT cannot keep in O(d) integer state (see the module's tests).
"""
from __future__ import annotations

import functools
import math
from typing import Tuple

import numpy as np

from transforms import validation as check
from . import sensitivity
from .base import ContinualMechanism

DEFAULT_BUFFERS = 6
ERROR_METRICS = ("max", "mean")  # what a BLT is optimised for (MaxSE, MeanSE)
MAX_BUFFERS = 8
METRICS = ("max", "mean")
_STREAM_CACHE_ENTRIES = 1 << 16  # per-stream buffers kept in memory (each d + 2 floats)


# ----- closed-form objective -------------------------------------------------------------------
def _geometric(eps: np.ndarray, n: int) -> np.ndarray:
    """sum_{j<n} q^j for q = 1 - eps, eps in (0, 1], accurate for q near 1."""
    return -np.expm1(n * np.log1p(-eps)) / eps


def _weighted_geometric(eps: np.ndarray, n: int) -> np.ndarray:
    """sum_{j<n} (n - j) q^j = (n - q G_n(q)) / (1 - q) for q = 1 - eps (series for small n eps,
    where the closed form cancels)."""
    g = _geometric(eps, n)
    direct = (n - (1.0 - eps) * g) / eps
    # sum_j (n - j) (1 - j x + j^2 x^2 / 2 - j^3 x^3 / 6), x = -log(q)
    x = -np.log1p(-eps)
    s0 = n * (n + 1) / 2.0
    s1 = (n - 1) * n * (n + 1) / 6.0
    s2 = (n - 1) * n * n * (n + 1) / 12.0
    s3 = (n - 1) * n * (n + 1) * (3.0 * n * n - 2.0) / 60.0
    series = s0 - s1 * x + s2 * x * x / 2.0 - s3 * x ** 3 / 6.0
    return np.where(n * eps < 1e-4, series, direct)


def pair_weights(theta_eps: np.ndarray, hat_eps: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Weights (w, v) of the BLT pair C = BLT(theta, w), C^-1 = BLT(theta_hat, v) from the decays
    (1 - theta, 1 - theta_hat) (Dvijotham et al. Lemma 5.2)."""
    def residues(poles, zeros):
        numerator = np.prod(zeros[None, :] - poles[:, None], axis=1)
        gaps = poles[None, :] - poles[:, None]
        np.fill_diagonal(gaps, 1.0)
        return numerator / np.prod(gaps, axis=1)
    return residues(theta_eps, hat_eps), residues(hat_eps, theta_eps)


def log_objective(params: np.ndarray, horizon: int, metric: str) -> float:
    """log(error^2 / sigma^2) + log(||c||_2^2) of the BLT pair exp(params) = (1 - theta,
    1 - theta_hat); +inf outside the monotone family."""
    d = params.shape[0] // 2
    if np.any(params >= 0.0) or not np.all(np.isfinite(params)):
        return math.inf
    theta_eps, hat_eps = np.exp(params[:d]), np.exp(params[d:])
    if np.any(theta_eps >= 1.0) or np.any(hat_eps >= 1.0):
        return math.inf
    with np.errstate(all="ignore"):
        w, v = pair_weights(theta_eps, hat_eps)
    if np.any(w <= 0) or np.any(v >= 0) or np.sum(w) >= 1.0 or not np.all(np.isfinite(w)):
        return math.inf
    pairs = theta_eps[:, None] + theta_eps[None, :] - theta_eps[:, None] * theta_eps[None, :]
    sens2 = 1.0 + float(np.sum(w[:, None] * w[None, :] * _geometric(pairs, horizon - 1))) \
        if horizon > 1 else 1.0
    a = 1.0 / (1.0 + float(np.sum(w / theta_eps)))
    b = -v / hat_eps
    hats = hat_eps[:, None] + hat_eps[None, :] - hat_eps[:, None] * hat_eps[None, :]
    if metric == "max":
        err = (horizon * a * a + 2.0 * a * float(np.sum(b * _geometric(hat_eps, horizon)))
               + float(np.sum(b[:, None] * b[None, :] * _geometric(hats, horizon))))
    else:
        err = (a * a * horizon * (horizon + 1) / 2.0
               + 2.0 * a * float(np.sum(b * _weighted_geometric(hat_eps, horizon)))
               + float(np.sum(b[:, None] * b[None, :] * _weighted_geometric(hats, horizon)))
               ) / horizon
    if not (err > 0 and math.isfinite(err)):
        return math.inf
    return math.log(err) + math.log(sens2)


def _gradient(f, x, fx, h=1e-6):
    g = np.empty_like(x)
    for i in range(x.shape[0]):
        e = np.zeros_like(x)
        e[i] = h
        up, down = f(x + e), f(x - e)
        if math.isfinite(up) and math.isfinite(down):
            g[i] = (up - down) / (2 * h)
        elif math.isfinite(down):
            g[i] = (fx - down) / h
        else:
            g[i] = (up - fx) / h
    return g


def _bfgs(f, x, iterations: int):
    """Quasi-Newton (BFGS, Armijo backtracking, central-difference gradients)."""
    n = x.shape[0]
    fx = f(x)
    if not math.isfinite(fx):
        raise ValueError("BLT optimiser seed outside the monotone family")
    g, hess = _gradient(f, x, fx), np.eye(n)
    for _ in range(iterations):
        p = -hess @ g
        if g @ p >= 0:
            hess, p = np.eye(n), -g
        step = 1.0
        while True:
            candidate = x + step * p
            fc = f(candidate)
            if fc <= fx + 1e-4 * step * (g @ p):
                break
            step *= 0.5
            if step < 1e-12:
                return x, fx
        gc = _gradient(f, candidate, fc)
        s, y = candidate - x, gc - g
        sy = float(s @ y)
        if sy > 1e-18:
            r = 1.0 / sy
            eye = np.eye(n)
            hess = (eye - r * np.outer(s, y)) @ hess @ (eye - r * np.outer(y, s)) \
                + r * np.outer(s, s)
        improvement = fx - fc
        x, fx, g = candidate, fc, gc
        if np.max(np.abs(g)) < 1e-9 or improvement < 1e-15:
            break
    return x, fx


def _grid_seed(horizon: int, buffers: int) -> np.ndarray:
    """Interlaced log-spaced decays theta_1 > theta_hat_1 > theta_2 > ... (a feasible pair)."""
    eps = np.exp(np.linspace(math.log(0.5 / max(horizon, 2)), math.log(0.7), 2 * buffers))
    return np.log(np.concatenate((eps[0::2], eps[1::2])))


@functools.lru_cache(maxsize=256)
def optimized_parameters(horizon: int, buffers: int, metric: str
                         ) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """(1 - theta, 1 - theta_hat) of the optimised BLT for (T, d, metric), sorted by decay."""
    objective = functools.partial(_objective_for, horizon=horizon, metric=metric)
    x, _ = _bfgs(objective, _grid_seed(horizon, buffers), 800)
    theta_eps = np.sort(np.exp(x[:buffers]))
    hat_eps = np.sort(np.exp(x[buffers:]))
    return tuple(float(e) for e in theta_eps), tuple(float(e) for e in hat_eps)


def _objective_for(params, horizon, metric):
    return log_objective(params, horizon, metric)


def inverse_decays(theta: np.ndarray, weights: np.ndarray, guess_eps: np.ndarray
                   ) -> np.ndarray:
    """1 - theta_hat: the roots lambda of 1 + sum_i w_i / (lambda - theta_i) = 0 (the decays of
    C^-1), by safeguarded Newton from a guess, each inside its bracket."""
    eps = 1.0 - theta  # exact (theta in [1/2, 1)) or accurate (Sterbenz / small theta)
    order = np.argsort(eps)
    eps_sorted = eps[order]
    roots = np.empty(eps.shape[0])
    for k in range(eps.shape[0]):
        # root mu = 1 - lambda lies in (eps_(k), eps_(k+1)) (or (eps_(d), 1) for the last)
        low = eps_sorted[k]
        high = eps_sorted[k + 1] if k + 1 < eps.shape[0] else 1.0
        mu = float(guess_eps[k]) if low < guess_eps[k] < high else 0.5 * (low + high)
        for _ in range(200):
            gaps = eps - mu  # lambda - theta_i
            value = 1.0 + float(np.sum(weights / gaps))
            slope = float(np.sum(weights / gaps ** 2))  # d/dmu
            if value > 0:
                high = min(high, mu)  # value increases with mu between poles? keep bracket
            else:
                low = max(low, mu)
            new = mu - value / slope
            if not (low < new < high):
                new = 0.5 * (low + high)
            if abs(new - mu) <= 1e-17 + 4e-16 * abs(mu):
                mu = new
                break
            mu = new
        roots[k] = mu
    return roots


class BufferedToeplitz(ContinualMechanism):
    """BLT factorization with `buffers` buffers, optimised for `metric` ("max" or "mean") at the
    horizon (see the module docstring). Float noise only."""

    name = "blt"
    accepts = ("buffers", "metric", "decay_gaps", "inverse_gaps")
    auto_rank = 60

    @classmethod
    def candidates(cls, horizon, noise, pure_dp):
        # float noise only: O(d) streaming memory at near square-root error
        return [{"buffers": DEFAULT_BUFFERS, "metric": m} for m in ERROR_METRICS] \
            if noise == "float" else []

    @classmethod
    def state_note(cls, noise):
        return "17 B (+ d + 2 floats per stream in memory, re-derived from the seam)"

    @classmethod
    def memory_note(cls, noise):
        return "+ d + 2 floats per stream in worker memory"

    def __init__(self, horizon, budget, noise_source, *, buffers: int = DEFAULT_BUFFERS,
                 metric: str = "max", decay_gaps=None, inverse_gaps=None, **kwargs):
        super().__init__(horizon, budget, noise_source, **kwargs)
        if self.discrete:
            check.fail("noise", "'float' for blt (its noise is a real-valued recurrence; no "
                                "discrete construction yet)", self.noise)
        self.buffers = check.integer_at_least("buffers", buffers, 1)
        if self.buffers > MAX_BUFFERS:
            check.fail("buffers", f"<= {MAX_BUFFERS}", buffers)
        check.one_of("metric", metric, METRICS)
        self.metric = metric
        if (decay_gaps is None) != (inverse_gaps is None):
            check.fail("decay_gaps", "given together with inverse_gaps (or neither)",
                       decay_gaps if inverse_gaps is None else None)
        if decay_gaps is None:  # optimised here; params() pins the result in the release
            decay_gaps, inverse_gaps = optimized_parameters(self.horizon, self.buffers, metric)
        theta_eps = self._gaps("decay_gaps", decay_gaps)
        hat_eps = self._gaps("inverse_gaps", inverse_gaps)
        self._decay_gaps = [float(g) for g in theta_eps]
        self._inverse_gaps = [float(g) for g in hat_eps]
        weights, _ = pair_weights(theta_eps, hat_eps)
        # the mechanism is exactly R = BLT(theta, w) with these floats
        self.decays = 1.0 - theta_eps
        self.weights = weights
        self._hat_guess = hat_eps
        self._theta_list = [float(t) for t in self.decays]
        self._weight_list = [float(w) for w in self.weights]

    def _gaps(self, name: str, given) -> np.ndarray:
        """1 - decay for each buffer: `buffers` floats in (0, 1)."""
        try:
            gaps = np.array([float(g) for g in given], dtype=np.float64)
        except (TypeError, ValueError):
            gaps = np.array([])
        if gaps.shape != (self.buffers,) or not np.all((gaps > 0) & (gaps < 1)):
            check.fail(name, f"{self.buffers} numbers in (0, 1)", given)
        return gaps

    def params(self):
        """Including the optimised gaps (floats round-trip exactly through JSON): every worker
        of a release rebuilds exactly this factorization, whatever its numpy or CPU."""
        return {"buffers": self.buffers, "metric": self.metric,
                "decay_gaps": list(self._decay_gaps), "inverse_gaps": list(self._inverse_gaps)}

    # ----- factors -------------------------------------------------------------------------------
    def right_coefficients(self) -> np.ndarray:
        """c_0 = 1, c_j = sum_i w_i theta_i^(j-1), as sequential products (so the computed c is
        non-increasing whenever the real one is: fl(x theta) <= x for theta < 1)."""
        if "right" not in self._cache:
            c = np.zeros(self.horizon)
            c[0] = 1.0
            if self.horizon > 1:
                for theta, w in zip(self.decays, self.weights):
                    powers = np.cumprod(np.concatenate(([1.0], np.full(self.horizon - 2,
                                                                       theta))))
                    c[1:] += w * powers
            self._cache["right"] = c
        return self._cache["right"]

    def inverse(self) -> Tuple[np.ndarray, np.ndarray]:
        """(1 - theta_hat, v): C^-1 = BLT(theta_hat, v) for the mechanism's (theta, w)."""
        if "inverse" not in self._cache:
            hat_eps = inverse_decays(self.decays, self.weights, self._hat_guess)
            _, v = pair_weights(1.0 - self.decays, hat_eps)
            self._cache["inverse"] = (hat_eps, v)
        return self._cache["inverse"]

    def left_coefficients(self) -> np.ndarray:
        """l_j = (A C^-1)_{j,0} = a + sum_k b_k theta_hat_k^j, a = 1 / (1 + sum w / (1 - theta)),
        b_k = -v_k / (1 - theta_hat_k); O(T d)."""
        if "left" not in self._cache:
            hat_eps, v = self.inverse()
            a = 1.0 / (1.0 + float(np.sum(self.weights / (1.0 - self.decays))))
            b = -v / hat_eps
            j = np.arange(self.horizon, dtype=np.float64)
            left = np.full(self.horizon, a)
            for bk, ek in zip(b, hat_eps):
                left += bk * np.exp(j * math.log1p(-ek))
            left[0] = 1.0
            self._cache["left"] = left
        return self._cache["left"]

    def dense_factors(self):
        from .toeplitz import toeplitz_lower
        return toeplitz_lower(self.left_coefficients()), toeplitz_lower(self.right_coefficients())

    @property
    def monotone(self) -> bool:
        """c is non-negative and non-increasing, checked exactly at this horizon."""
        return sensitivity.is_monotone_toeplitz(self.right_coefficients())

    def column_norm(self, p):
        key = ("column_norm", p)
        if key not in self._cache:  # the first column holds every other column's entries
            self._cache[key] = float(np.sum(np.abs(self.right_coefficients()) ** p) ** (1.0 / p))
        return self._cache[key]

    def set_sensitivity(self, p, k, d):
        return sensitivity.toeplitz_set_sensitivity(self.right_coefficients(), p, k, d)

    def factorization(self) -> dict:
        """The BLT itself and which sensitivity bound it uses on S_{D,k}."""
        return {"decays": [float(t) for t in self.decays],
                "weights": [float(w) for w in self.weights],
                "monotone": self.monotone,
                "set_bound": ("sqrt(kD) ||R||_{1->2} (Andersson et al. 2026 Thm 8.4)"
                              if self.monotone
                              else "k x max column norm (triangle inequality)")}

    def describe(self):
        return {**super().describe(), "factorization": self.factorization()}

    def _squared_weights(self):
        if "squared_weights" not in self._cache:
            self._cache["squared_weights"] = np.cumsum(self.left_coefficients() ** 2)
        return self._cache["squared_weights"]

    def _equal_weight_terms(self):
        return None

    # ----- streaming noise -----------------------------------------------------------------------
    def _run(self, entry, z: np.ndarray):
        """Advance (steps, acc, buffers) over unit node noise z; returns (L z, new entry).
        The one arithmetic path of streaming and batch (an unrolled loop over the d buffers)."""
        steps, acc, buffers = entry
        out, acc, buffers = self._kernel()(z.tolist(), acc, list(buffers))
        return np.array(out, dtype=np.float64), (steps + z.shape[0], acc, buffers)

    def _kernel(self):
        """u = z - (w_1 b_1 + ... + w_d b_d) (left to right); b_i = theta_i b_i + u; acc += u:
        the recurrence over z, with the parameters bound once per mechanism."""
        if "kernel" not in self._cache:
            step = _recurrence(tuple(self._weight_list), tuple(self._theta_list))

            def kernel(zs, acc, buffers):
                out = []
                for zt in zs:
                    acc = step(zt, acc, buffers)
                    out.append(acc)
                return out, acc, buffers
            self._cache["kernel"] = kernel
        return self._cache["kernel"]

    def _unit_noise(self, start, count):
        entries = self._cache.setdefault("blt_buffers", {})
        key = (type(self.stream), self.stream)
        entry = entries.pop(key, None)
        if entry is None or entry[0] != start:
            entry = (0, 0.0, [0.0] * self.buffers)
            if start:  # re-derive the buffers from the seam (a state without them)
                _, entry = self._run(entry, self._draw(0, 0, start))
        out, entry = self._run(entry, self._draw(0, start, count))
        while len(entries) >= _STREAM_CACHE_ENTRIES:
            entries.pop(next(iter(entries)))  # oldest first
        entries[key] = list(entry)  # [steps, acc, buffers]: `_step_noise` updates it in place
        return out

    def _step_noise(self, start):
        """(L z)[start] for one streaming step: the kernel's arithmetic for one z, on the
        stream's cached entry in place (O(d), no arrays); otherwise `_unit_noise`."""
        entries = self._cache.get("blt_buffers")
        if entries is not None:
            key = (type(self.stream), self.stream)
            entry = entries.pop(key, None)
            if entry is not None:
                entries[key] = entry  # most recently used last
                if entry[0] == start:
                    step = self._cache.get("step_kernel") or self._step_kernel()
                    return step(self._draw_one(0, start), entry)
        return float(self._unit_noise(start, 1)[0])

    def _step_kernel(self):
        """`_kernel`'s recurrence for one z on an entry [steps, acc, buffers], in place."""
        step = _recurrence(tuple(self._weight_list), tuple(self._theta_list))

        def one(zt, entry):
            acc = entry[1] = step(zt, entry[1], entry[2])
            entry[0] += 1
            return acc
        self._cache["step_kernel"] = one
        return one


def _recurrence(weights: Tuple[float, ...], thetas: Tuple[float, ...]):
    """One step of the BLT noise recurrence on `buffers` (a list, updated in place): the
    weighted read summed left to right from its first term (the order the generated sums had:
    bit for bit the same floats), u = z - read, b_i = theta_i b_i + u; -> acc + u."""
    rest = tuple(zip(range(1, len(weights)), weights[1:]))
    first, indexed = weights[0], tuple(enumerate(thetas))

    def step(zt, acc, buffers):
        read = first * buffers[0]
        for i, w in rest:
            read += w * buffers[i]
        u = zt - read
        for i, t in indexed:
            buffers[i] = t * buffers[i] + u
        return acc + u
    return step

"""Private key selection under continual release: keys nobody listed in advance (issue #30).

Without public keys, a key is published from the first step at which its released (noisy)
running total reaches a threshold tau, and at every step after that; before, nothing about it
is published. From its selection step on, a key's records are exactly those of a public key:
its noise is the mechanism's noise for the key's stream, derived from (secret, release, key,
node) as for a public key, so a key's values never depend on when it was selected. A key has
state only from the first step it has data (a kept, truncated contribution).

Setting. One release of horizon T; each key runs the same mechanism, whose release at step t is
y_t = X_t + n_t: the key's exact running total X_t plus the noise n_t = (L z)_t of its own
stream (`ContinualMechanism.release`). A unit touches at most m keys (`max_keys_per_unit`) and
its contributions give each key a running total of at most K (`contribution_bound`: k for
counts, k max_value in grid units for sums, the interval bound D for count-distinct and entity
streams, whose running total is the unit's own g-value in [0, D]). The public-key release of
any fixed set of keys is epsilon-DP (discrete / continuous Laplace) or rho-zCDP (Gaussian) for
one unit: `transforms.calibration` (split or joint) is unchanged.

Rule (`select_key`): with sigma_j the first step key j has data, key j is published at every
step t >= s_j, s_j = min {t >= sigma_j : y_jt >= tau} (`first_selected`).

Lemma (selection costs delta only). Let D be an input, D' = D without one unit u, and
    delta(tau) = m sum_{t < T} P(n_t >= tau - K).
Then for every set S of outputs
    P(O(D) in S) <= e^epsilon P(O(D') in S) + delta(tau)   and the same with D, D' swapped,
for the epsilon of the public-key release (pure DP); under rho-zCDP the release is
(epsilon', delta' + delta(tau))-DP for every (epsilon', delta') the rho-zCDP release has.

Proof. Let Y(.) be the public-key release of the key set K_D (every key with data in D, taken as
public), computed with the same noise. It is epsilon-DP between D and D' (u touches at most m
of these keys; keys of K_D that D' has no data for simply have running total 0). Both outputs
are functions of Y: O(D) = G_sigma(Y(D)), O(D') = G_sigma'(Y(D')), G_s selecting key j from
its first step >= s_j at or above tau (sigma'_j = T when D' has no data for j). The start steps
differ only for the keys u touches: sigma_j <= sigma'_j. Let F be the event that some key j
that u touches reaches tau in its window [sigma_j, sigma'_j). Off F, G_sigma = G_sigma'. Hence
    P(O(D) in S) <= P(G_sigma'(Y(D)) in S) + P_D(F) <= e^epsilon P(O(D') in S) + P_D(F),
    P(O(D') in S) <= P(Y(D') in G_sigma'^-1(S) \\ F) + P_D'(F)
                  <= e^epsilon P(Y(D) in G_sigma^-1(S) \\ F) + P_D'(F)
                  <= e^epsilon P(O(D) in S) + P_D'(F)
(G_sigma^-1(S) \\ F = G_sigma'^-1(S) \\ F). Inside a window, only u has data for the key (the
other units' data starts at sigma'_j), so X_t <= K there, and P(X_t + n_t >= tau) <=
P(n_t >= tau - K). A union bound over the at most m keys u touches and over the steps (no
independence is needed, neither between steps, whose noises are correlated, nor between keys)
gives P_D(F) <= delta(tau); under D' the running totals in the windows are 0, so
P_D'(F) <= m sum_t P(n_t >= tau) <= delta(tau). Under zCDP the two middle inequalities hold
with + delta' (the zCDP conversion), whence (epsilon', delta' + delta(tau)). []

The window covers both cases of the issue: a key carried by u alone (sigma' = T: its window is
the whole horizon) and a key shared with other units whose data start later than u's (a key
whose state starts earlier because of u). A key whose data from other units starts no later
than u's has an empty window: its selection is pure post-processing.

What the lemma needs from the pipeline (it is stated for these): a key's state starts with its
first KEPT contribution, after truncation (a record dropped by a cap, or a dead letter, must not
create a key: else u could create more than m keys); the noise of a key is the public-key noise
of its stream whenever its state starts; tau is fixed before the data (it depends on T, m, K,
the mechanism and delta only).

Threshold (`selection_threshold`): the smallest tau (an integer for integer releases) with
delta(tau) <= delta, where P(n_t >= c) is bounded from above per step by the smaller of
- the exact tail (`tails.step_tails`, two-sided; the noise is symmetric): P(n >= c) =
  P(|n| > c - 1) / 2 on the integer lattice (c >= 1), P(|n| > c) / 2 for continuous noise;
  plus its numerical error (`tails.TOLERANCE` per step where the tail is inverted, 0 for the
  closed forms; the smoothed discrete square root also pays the revival term, and is read at
  c - 2a, a the step's largest weight: P(S >= c) <= P(|S'| > c - 2a) / 2);
- a Chernoff bound min_lambda exp(-lambda c) E exp(lambda n_t) (exact MGF for Laplace and
  discrete Laplace sums of +-1 weights, -log(1 - y) <= y / (1 - y) for Laplace with other
  weights, subgaussian for (discrete) Gaussians): no numerical error, and it takes over where
  delta / (m T) is below the tails' 1e-10 accuracy.
The discrete square root releases g L~ round(R~ x / g) + noise, within (g / 2) sum_i |l~_i| of
the running total (rounding): that slack is added to K at every step.

Planning (`expected_selection_step`): for a key whose running total grows by `rate` per step,
the first step s with P(y_s >= tau) >= probability (default 1/2) from below; the key is
selected by step s with at least that probability (an upper bound on that quantile of the
first selection step; 1/2: the median).
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Optional, Tuple

import numpy as np

from transforms import validation as check
from . import laplace_sums, tails
from .base import ContinualMechanism

_ROUNDING = 1e-9  # relative margin on a delta sum (float rounding of T tail values)
_GOLDEN = 60      # golden-section iterations of a Chernoff exponent (bracket 0.618^60)


class _Noise(NamedTuple):
    """The per-step noise law of a mechanism, in the terms the bounds need."""
    node: "tails.NodeLaw"
    factor: float          # release noise = factor x S_t, S_t = sum_j w_tj z_j
    rows: dict             # {"counts": ...} or {"coefficients": ...} (`tails.step_tails`)
    lattice: bool          # integer release: n_t is an integer
    smoothed: bool         # a lattice node law with non-integer weights (discrete sqrt)
    nonzero: np.ndarray    # per step, number of nodes with a nonzero weight
    squares: np.ndarray    # per step, sum_j w_tj^2
    largest: np.ndarray    # per step, max_j |w_tj|
    counts: Optional[np.ndarray]  # per step, number of +-1 weights when every |w| is 0 or 1
    slack: np.ndarray      # per step, |data part - running total| at most (release units)


def _noise(mechanism) -> _Noise:
    if not isinstance(mechanism, ContinualMechanism):
        check.fail("mechanism", "a ContinualMechanism", mechanism)
    node, factor = mechanism._noise_node()
    rows = mechanism._noise_rows()
    horizon = mechanism.horizon
    if "counts" in rows:
        n = np.asarray(rows["counts"], dtype=np.float64)
        nonzero, squares, largest, counts = n, n, (n > 0).astype(np.float64), n
    else:
        l = np.asarray(rows["coefficients"], dtype=np.float64)
        nonzero = np.cumsum(l != 0).astype(np.float64)
        squares = np.cumsum(l * l)
        largest = np.maximum.accumulate(np.abs(l))
        unit = bool(np.all((l == 0) | (np.abs(l) == 1)))
        counts = nonzero if unit else None
    smoothed = bool(node.lattice and counts is None)
    slack = np.zeros(horizon)
    if mechanism.discrete and not mechanism.integer_release:
        # the discrete square root: g L~ (round(R~ x / g) + z), |round - exact| <= 1/2 per node
        slack = 0.5 * factor * np.cumsum(np.abs(np.asarray(rows["coefficients"],
                                                           dtype=np.float64)))
    return _Noise(node, float(factor), rows, bool(mechanism.integer_release), smoothed,
                  nonzero[:horizon], squares[:horizon], largest[:horizon],
                  None if counts is None else counts[:horizon], slack[:horizon])


def _golden_minimum(exponent, shape) -> np.ndarray:
    """`laplace_sums.golden_minimum` with _GOLDEN iterations (a tighter bracket for the
    exponent)."""
    return laplace_sums.golden_minimum(exponent, shape, _GOLDEN)


def _chernoff(noise: _Noise, s: np.ndarray) -> np.ndarray:
    """Per step, an upper bound on P(S_t >= s_t) (node units, s_t > 0, rows with noise):
    min over lambda of exp(-lambda s + log E exp(lambda S_t))."""
    node = noise.node
    w = noise.squares
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if isinstance(node, (tails.Gaussian, tails.DiscreteGaussian)):
            # N(0, sigma^2) and the discrete Gaussian (sigma^2-subgaussian, CKS20 Cor. 9)
            variance = (node.parameter ** 2 if isinstance(node, tails.Gaussian)
                        else node.parameter)
            exponent = -s * s / (2.0 * variance * w)
        elif isinstance(node, tails.DiscreteLaplace):  # +-1 weights only (`tails._kind`)
            t, n = node.parameter, noise.counts
            exponent = _golden_minimum(
                lambda f: -(f / t) * s + n * node.log_mgf(f / t), s.shape)
        elif noise.counts is not None:  # Laplace(b), n weights +-1: exact MGF
            b, n = node.parameter, noise.counts
            exponent = _golden_minimum(lambda f: -(f / b) * s - n * np.log1p(-f * f), s.shape)
        else:  # Laplace(b), weights w: -log(1 - y) <= y / (1 - y), y <= (lambda b a)^2
            b, a = node.parameter, noise.largest
            exponent = _golden_minimum(
                lambda f: -(f / (b * a)) * s + f * f * w / (a * a * (1.0 - f * f)), s.shape)
    return np.exp(np.minimum(exponent, 0.0))


def _error(noise: _Noise) -> np.ndarray:
    """Per step, the bound on |step_tails - exact tail| (0 for the closed forms)."""
    node = noise.node
    if isinstance(node, tails.Gaussian):
        return np.zeros(noise.nonzero.shape[0])
    closed = (noise.nonzero == 1) & isinstance(node, (tails.Laplace, tails.DiscreteLaplace))
    error = np.where(closed, 0.0, tails.TOLERANCE)
    if noise.smoothed:
        error = error + tails._REVIVAL * node.pmf_gap()
    return error


def _two_sided(noise: _Noise, x: np.ndarray, live: np.ndarray) -> Optional[np.ndarray]:
    """step_tails at x (node units) where `live`, else 0; None where the inversion cannot
    reach x (`tails.MAX_POINTS`: never for the registry's mechanisms at their horizons, and
    the Chernoff bound alone is then used)."""
    x = np.where(live, np.maximum(x, 0.0), 0.0)
    try:
        out = tails.step_tails(noise.node, x, **noise.rows)[:x.shape[0]]
    except check.ValidationError:
        return None
    return np.where(live, out, 0.0)


def _upper(noise: _Noise, c: np.ndarray) -> np.ndarray:
    """Per step, an upper bound on P(n_t >= c_t) (release units; integers on the lattice)."""
    noisy = noise.nonzero > 0
    out = np.where(c > 0, 0.0, 1.0)  # steps without noise: n_t = 0
    s = c / noise.factor
    live = noisy & (c > 0)
    if noise.lattice:
        live = noisy & (c >= 1)
        x = s - 1.0                   # P(n >= c) = P(|n| > c - 1) / 2 on the integers
    elif noise.smoothed:
        x = s - 2.0 * noise.largest   # P(S >= s) <= P(|S'| > s - 2a) / 2
        live = live & (x >= 0)
    else:
        x = s                         # no atoms: P(n >= c) = P(|n| > c) / 2
    bound = np.where(noisy & (c > 0), _chernoff(noise, np.where(c > 0, s, 1.0)), 1.0)
    out = np.where(noisy, np.where(c > 0, bound, 1.0), out)
    two_sided = _two_sided(noise, x, live)
    if two_sided is not None:
        out = np.where(live, np.minimum(0.5 * (two_sided + _error(noise)), out), out)
    return np.minimum(out, 1.0)


def _lower(noise: _Noise, c: np.ndarray) -> np.ndarray:
    """Per step, a lower bound on P(n_t >= c_t) (release units; integers on the lattice)."""
    noisy = noise.nonzero > 0
    out = np.where(c <= 0, 1.0, 0.0)  # steps without noise
    s = c / noise.factor
    error = _error(noise)
    # c <= 0: P(n >= c) = 1 - P(n < c) >= 1 - P(n >= -c) (+1 on the lattice), and >= 1/2
    mirror = np.where(c <= 0, (1.0 - c) if noise.lattice else np.maximum(-c, 0.0), 1.0)
    high = np.maximum(0.5, 1.0 - _upper(noise, mirror))
    # c > 0: P(n >= c) >= P(n > c) = P(|n| > c) / 2 (lattice: P(|n| > c - 1) / 2 exactly)
    if noise.lattice:
        x = s - 1.0
    elif noise.smoothed:
        x = s + noise.largest          # P(|S| > s) >= P(|S'| > s + a)
    else:
        x = s
    live = noisy & (c > 0)
    two_sided = _two_sided(noise, x, live)
    low = 0.0 if two_sided is None else np.maximum(0.0, 0.5 * (two_sided - error))
    return np.where(noisy, np.where(c <= 0, high, low), out)


def _check_bound(name, value, lattice: bool) -> float:
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value < 0):
        check.fail(name, "a finite number >= 0", value)
    if lattice and value != math.floor(value):
        check.fail(name, "an integer for an integer release (grid units for sums)", value)
    return float(value)


def _check_tau(tau) -> float:
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or not math.isfinite(tau):
        check.fail("tau", "a finite number", tau)
    return float(tau)


def selection_delta(mechanism, tau: float, max_keys_per_unit: int,
                    contribution_bound: float) -> float:
    """delta(tau) = m sum_t P(n_t >= tau - K - slack_t), bounded from above (module docstring):
    the delta a threshold `tau` spends for one unit (m keys, running totals <= K).

    Args:
        mechanism: the key mechanism, as calibrated for the release (`make`).
        tau: the threshold, in release units (grid units for discrete sums).
        max_keys_per_unit: m, the keys one unit touches at most.
        contribution_bound: K, the largest running total one unit gives one key.

    Returns:
        An upper bound on the probability that the unit's windows select a key (<= 1 per key).

    >>> from transforms.mechanisms import make
    >>> mech = make("binary_tree", 8, epsilon=1.0, max_contributions=2, interval_bound=2, seed=1)
    >>> selection_delta(mech, 100, 1, 2) < 1e-3 < selection_delta(mech, 60, 1, 2)
    True
    """
    noise = _noise(mechanism)
    m = check.integer_at_least("max_keys_per_unit", max_keys_per_unit, 1)
    k = _check_bound("contribution_bound", contribution_bound, noise.lattice)
    return _delta(noise, _check_tau(tau), m, k)


def _delta(noise: _Noise, tau: float, m: int, k: float) -> float:
    c = tau - k - noise.slack
    if noise.lattice:
        c = np.ceil(c)  # P(n >= c) = P(n >= ceil(c)) for integer n
    per_step = _upper(noise, c)
    return min(1.0, m * math.fsum(per_step.tolist()) * (1.0 + _ROUNDING))


def selection_threshold(mechanism, max_keys_per_unit: int, contribution_bound: float,
                        delta: float) -> float:
    """The smallest threshold tau with delta(tau) = m sum_t P(n_t >= tau - K) <= delta
    (`selection_delta`; an integer for integer releases, conservative against the numerical
    error of `tails`): selecting keys at tau is (epsilon, delta)-DP on top of the release's
    epsilon (zCDP: delta added to the conversion's), by the lemma of the module docstring.

    Args:
        mechanism: the key mechanism, as calibrated for the release (`make`; its horizon T,
            node law and rows of L give n_t).
        max_keys_per_unit: m, the keys one unit touches at most.
        contribution_bound: K, the largest running total one unit gives one key (k for counts,
            k max_value in grid units for sums, D for count-distinct).
        delta: the delta selection may spend, in (0, 1).

    Returns:
        tau as a float, in release units (the values `mechanism.release` returns).

    >>> from transforms.mechanisms import make
    >>> mech = make("binary_tree", 8, epsilon=1.0, max_contributions=2, interval_bound=2, seed=1)
    >>> tau = selection_threshold(mech, 1, 2, 1e-3)
    >>> tau, selection_delta(mech, tau, 1, 2) <= 1e-3 < selection_delta(mech, tau - 1, 1, 2)
    (82.0, True)
    """
    noise = _noise(mechanism)
    m = check.integer_at_least("max_keys_per_unit", max_keys_per_unit, 1)
    k = _check_bound("contribution_bound", contribution_bound, noise.lattice)
    delta = check.open_unit_interval("delta", delta)
    base = k + float(np.max(noise.slack))
    step = max(1.0, float(np.sqrt(np.max(noise.squares))) * noise.node.scale_hint
               * noise.factor)
    low, high = base, base + step  # delta(K) = 1: every noisy step has P(n_t >= 0) >= 1/2
    while _delta(noise, high, m, k) > delta:
        low, high = high, base + 2.0 * (high - base)
        if high - base > 1e15 * step:  # never for a positive delta (Chernoff decays)
            check.fail("delta", "reachable by a finite threshold", delta)
    if noise.lattice:
        low, high = math.floor(low), math.ceil(high)
        while high - low > 1:  # invariant: delta(high) <= delta, delta(low) > delta or low = K
            mid = (low + high) // 2
            if _delta(noise, float(mid), m, k) <= delta:
                high = mid
            else:
                low = mid
        return float(high)
    for _ in range(200):
        if high - low <= 1e-9 * max(1.0, abs(high)):
            break
        mid = 0.5 * (low + high)
        if _delta(noise, mid, m, k) <= delta:
            high = mid
        else:
            low = mid
    return high


def first_selected(released_values, tau: float, start: int = 0) -> Optional[int]:
    """The selection step: the first step t >= `start` whose released running total is >= tau
    (a key is published at that step and at every later one), or None.

    Args:
        released_values: the key's released values, step 0 first (`mechanism.release`).
        tau: the threshold (`selection_threshold`).
        start: the key's first step with data (the steps before it have no state).

    Returns:
        The step (an index into released_values), or None if no step reaches tau.

    >>> first_selected([3.0, 12.0, 9.0, 15.0], 10.0)
    1
    >>> first_selected([3.0, 12.0, 9.0, 15.0], 10.0, start=2)
    3
    >>> first_selected([3.0, 4.0], 10.0) is None
    True
    """
    tau = tau if tau == -math.inf else _check_tau(tau)  # -inf: every key (operator's truth)
    start = check.integer_at_least("start", start, 0)
    values = np.asarray(released_values, dtype=np.float64).reshape(-1)
    if np.any(np.isnan(values)):
        check.fail("released_values", "numbers (no NaN)", released_values)
    hits = np.nonzero(values[start:] >= tau)[0]
    return int(start + hits[0]) if hits.shape[0] else None


def select_key(mechanism, values, tau: float) -> Tuple[Optional[int], np.ndarray]:
    """One key under selection, as a streaming release runs it: no state before the key's first
    step with data (a nonzero value); from there the mechanism's state is that of a public key
    (its steps before, with running total 0, are derived and not published), it steps, and the
    key is published from its selection step on.

    Args:
        mechanism: the mechanism for the key's stream (`mechanism.for_stream(key)`).
        values: the key's per-step contributions after truncation, step 0 first.
        tau: the threshold.

    Returns:
        (selection step or None, the values published from it on: empty if None).

    >>> from transforms.mechanisms import make
    >>> mech = make("binary_tree", 8, epsilon=1.0, seed=1).for_stream("eu-west")
    >>> step, published = select_key(mech, [0, 0, 30, 5, 0, 0, 0, 0], 20.0)
    >>> step, bool(np.all(published == mech.release([0, 0, 30, 5, 0, 0, 0, 0])[step:]))
    (2, True)
    """
    tau = _check_tau(tau)
    xs = np.asarray(values, dtype=np.float64).reshape(-1)
    data = np.nonzero(xs != 0)[0]
    if not data.shape[0]:
        return None, np.zeros(0)
    first = int(data[0])
    state = mechanism.advance(mechanism.init_state(), np.zeros(first))[1]  # not published
    out = []
    for value in xs[first:]:
        released, state = mechanism.step(state, value)
        if out or released >= tau:
            out.append(released)
    if not out:
        return None, np.zeros(0)
    return xs.shape[0] - len(out), np.array(out)


def expected_selection_step(mechanism, tau: float, rate: float,
                            probability: float = 0.5) -> Optional[int]:
    """For a key whose running total grows by `rate` per step from step 0 (X_t = rate (t + 1)),
    the first step s with P(X_s + n_s >= tau) >= `probability` (bounded from below): the key is
    selected by step s with at least that probability, so s bounds that quantile of its first
    selection step from above (the default 1/2: the median). None if no step within the
    horizon gets there.

    Args:
        mechanism: the key mechanism.
        tau: the threshold (`selection_threshold`).
        rate: the key's running total per step, > 0, in release units.
        probability: in (0, 1).

    Returns:
        The step (0-based) or None.

    >>> from transforms.mechanisms import make
    >>> mech = make("binary_tree", 48, epsilon=1.0, max_contributions=6, interval_bound=6, seed=1)
    >>> tau = selection_threshold(mech, 1, 6, 1e-6)
    >>> tau, expected_selection_step(mech, tau, 30.0), expected_selection_step(mech, tau, 5.0)
    (796.0, 26, None)
    """
    noise = _noise(mechanism)
    tau = _check_tau(tau)
    rate = check.positive_finite("rate", rate)
    probability = check.open_unit_interval("probability", probability)
    totals = rate * np.arange(1, mechanism.horizon + 1, dtype=np.float64)
    c = tau - totals + noise.slack
    if noise.lattice:
        c = np.ceil(c)  # P(n >= c) = P(n >= ceil(c)) for integer n
    hits = np.nonzero(_lower(noise, c) >= probability)[0]
    return int(hits[0]) if hits.shape[0] else None


def _parameter(text: str):
    """A mechanism parameter NAME=VALUE of the command line (true/false, int, float)."""
    name, found, value = text.partition("=")
    if not found or not name:
        check.fail("param", "NAME=VALUE", text)
    if value.lower() in ("true", "false"):
        return name, value.lower() == "true"
    for kind in (int, float):
        try:
            return name, kind(value)
        except ValueError:
            pass
    check.fail("param", "NAME=VALUE with a number, true or false", text)


def main(argv=None) -> int:
    """`python3 -m transforms.mechanisms.selection`: the selection threshold of a key mechanism
    (its budget and bounds as the release calibrates the key), delta(tau), and the step by which
    a key growing by each `--rate` per step is selected with probability >= 1/2."""
    import argparse
    from .noise import ConstantNoiseSource
    from . import make
    parser = argparse.ArgumentParser(
        prog="python3 -m transforms.mechanisms.selection",
        description="Threshold of private key selection (docs/selection.md).")
    parser.add_argument("--mechanism", default="binary_tree")
    parser.add_argument("--param", action="append", default=[],
                        help="a mechanism parameter NAME=VALUE (k=11, sparsify=true); repeat")
    parser.add_argument("--horizon", type=int, default=48)
    parser.add_argument("--epsilon", type=float, help="the key mechanism's epsilon (pure DP)")
    parser.add_argument("--rho", type=float, help="the key mechanism's rho (zCDP)")
    parser.add_argument("--noise", default="discrete", choices=("discrete", "float"))
    parser.add_argument("--max-contributions", type=int, default=1)
    parser.add_argument("--interval-bound", type=int, help="default: --max-contributions")
    parser.add_argument("--contribution-bound", type=float,
                        help="K, a unit's largest running total on one key (default: k)")
    parser.add_argument("--max-keys-per-unit", type=int, action="append",
                        help="m (repeat for several)")
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--rate", type=float, action="append",
                        help="a key's running total per step (repeat for several)")
    args = parser.parse_args(argv)
    try:
        check.open_unit_interval("delta", args.delta)
        params = dict(_parameter(text) for text in args.param)
        k = args.max_contributions
        mechanism = make(args.mechanism, args.horizon, epsilon=args.epsilon, rho=args.rho,
                         max_contributions=k, interval_bound=args.interval_bound or k,
                         noise=args.noise, noise_source=ConstantNoiseSource(0.0), **params)
        bound = k if args.contribution_bound is None else args.contribution_bound
        if bound == int(bound):
            bound = int(bound)
        rates = args.rate or []
        shown = ", ".join(f"{name}={value}" for name, value in params.items())
        budget = (f"epsilon = {args.epsilon:g}" if args.rho is None
                  else f"rho = {args.rho:g}")
        print(f"{args.mechanism}({shown}), T = {args.horizon}, {budget}, "
              f"{mechanism.noise_name} noise, k = {k}, K = {bound:g}, delta = {args.delta:g}")
        print(f"noise per step: MaxSE {mechanism.max_se():.2f}")
        header = "  m        tau  delta(tau)" + "".join(
            f"  step@{rate:g}/step" for rate in rates)
        print(header)
        for m in args.max_keys_per_unit or [1]:
            tau = selection_threshold(mechanism, m, bound, args.delta)
            spent = selection_delta(mechanism, tau, m, bound)
            row = f"{m:3d} {tau:10.2f}  {spent:10.3g}"
            for rate in rates:
                step = expected_selection_step(mechanism, tau, rate)
                row += f"  {'never' if step is None else step:>{len(f'  step@{rate:g}/step') - 2}}"
            print(row)
    except check.ValidationError as error:
        print(error)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

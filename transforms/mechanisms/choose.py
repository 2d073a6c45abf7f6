"""Choosing a mechanism: the exact analytic error of every mechanism and parameter, before any
budget is spent (seed 004 Sec. 11 describes the regimes this reproduces)."""
from __future__ import annotations

import dataclasses
import functools
from typing import List, Optional, Tuple

from transforms import validation as check
from .noise import ConstantNoiseSource

METRICS = ("max", "mean")
ODD_ARITIES = tuple(range(3, 42, 2))
PLAIN_ARITIES = (2, 3, 4, 5, 6, 8)
BLT_BUFFERS = 6


@dataclasses.dataclass(frozen=True)
class Candidate:
    mechanism: str
    params: dict
    max_se: float
    mean_se: float
    sensitivity: float
    state: str
    calibration: str = "split"   # over the keys a unit touches: "split" or "joint"

    def row(self) -> dict:
        return dataclasses.asdict(self)


def candidate_specs(horizon: int, noise: str = "discrete", pure_dp: bool = False
                    ) -> List[Tuple[str, dict]]:
    specs = [("binary_tree", {"sparsify": s}) for s in (True, False)]
    specs += [("kary_tree", {"k": k, "sparsify": s}) for k in PLAIN_ARITIES[1:]
              for s in (True, False)]
    specs += [("kary_subtraction", {"k": k, "sparsify": s}) for k in ODD_ARITIES
              for s in (True, False) if k <= max(3, 2 * horizon)]
    specs += [("smooth_binary", {})]
    # the discrete square root is calibrated for zCDP and horizons up to 2^20
    if noise == "float" or (not pure_dp and horizon <= 1 << 20):
        specs += [("sqrt_toeplitz", {})]
    # the BLT has float noise only: O(d) streaming memory at near square-root error
    if noise == "float":
        specs += [("blt", {"buffers": BLT_BUFFERS, "metric": m}) for m in METRICS]
    specs += [("naive_composition", {}), ("input_perturbation", {})]
    return specs


def _state_description(name: str, noise: str = "float") -> str:
    if name == "sqrt_toeplitz" and noise == "discrete":
        return "O(T): 16 B per step (x and round(R x / g) history)"
    if name == "blt":
        return "17 B (+ d + 2 floats per stream in memory, re-derived from the seam)"
    if name in ("sqrt_toeplitz", "input_perturbation"):
        return "17 B (+ O(T) noise vector re-derived from the seam)"
    return "17 B"


def evaluate(horizon: int, privacy: dict, max_contributions: int = 1, interval_bound: int = 1,
             specs: Optional[List[Tuple[str, dict]]] = None, noise: str = "discrete"
             ) -> List[Candidate]:
    from . import make  # late: the factory imports this module's package
    rows = []
    pure_dp = "rho" not in privacy and "delta" not in privacy
    for name, params in specs or candidate_specs(horizon, noise, pure_dp):
        try:
            mechanism = make(name, horizon, **privacy, max_contributions=max_contributions,
                             interval_bound=interval_bound,
                             noise_source=ConstantNoiseSource(0.0), noise=noise, **params)
        except ValueError:
            if name == "sqrt_toeplitz" and noise == "discrete":
                continue  # its noise would not fit its sampling table: not a candidate
            raise
        rows.append(Candidate(name, mechanism.params(), mechanism.max_se(), mechanism.mean_se(),
                              mechanism.sensitivity, _state_description(name, noise)))
    return rows


@functools.lru_cache(maxsize=128)
def _evaluated(horizon, privacy_items, max_contributions, interval_bound, noise):
    """`evaluate` with the default candidates, once per process and arguments (deterministic:
    every transform built for the same release resolves the same mechanism)."""
    return tuple(evaluate(horizon, dict(privacy_items), max_contributions, interval_bound,
                          noise=noise))


def choose(horizon: int, privacy: dict, max_contributions: int = 1, interval_bound: int = 1,
           metric: str = "max", noise: str = "discrete") -> Tuple[Candidate, List[Candidate]]:
    """The candidate with the lowest MaxSE (or MeanSE) for the noise kind, and the table."""
    check.one_of("metric", metric, METRICS)
    rows = list(_evaluated(horizon, tuple(sorted(privacy.items())), max_contributions,
                           interval_bound, noise))
    key = (lambda c: (c.max_se, c.mean_se)) if metric == "max" else (
        lambda c: (c.mean_se, c.max_se))
    return min(rows, key=key), rows

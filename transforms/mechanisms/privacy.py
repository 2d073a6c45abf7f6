"""Privacy budgets and the noise calibration they imply.

Pure DP uses the Laplace mechanism with the l1 sensitivity, zCDP the Gaussian mechanism with the
l2 sensitivity (Andersson et al. 2026, Definitions 5.4 and 5.5). An (epsilon, delta) request is
served by
Gaussian noise at the largest rho with rho + 2 sqrt(rho ln(1/delta)) <= epsilon (the standard
zCDP -> approximate DP conversion), so it never claims more than rho-zCDP delivers.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from transforms import validation as check

LAPLACE = "laplace"
GAUSSIAN = "gaussian"


def rho_from_epsilon_delta(epsilon: float, delta: float) -> float:
    """Largest rho with rho + 2 sqrt(rho ln(1/delta)) <= epsilon (solved in sqrt(rho))."""
    epsilon = check.positive_finite("epsilon", epsilon)
    delta = check.open_unit_interval("delta", delta)
    log_term = math.log(1.0 / delta)
    # sqrt(L + e) - sqrt(L), written without the cancellation that loses digits when L >> e.
    root = epsilon / (math.sqrt(log_term + epsilon) + math.sqrt(log_term))
    return root * root


def epsilon_from_rho(rho: float, delta: float) -> float:
    """(epsilon, delta)-DP implied by rho-zCDP: epsilon = rho + 2 sqrt(rho ln(1/delta))."""
    rho = check.positive_finite("rho", rho)
    delta = check.open_unit_interval("delta", delta)
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


# The largest delta a release takes unless its caller opts in (`allow_large_delta`): delta is
# the probability that the guarantee fails outright (e.g. a record published in the clear).
MAX_DELTA = 1e-3


def check_small_delta(name: str, value, allowed: bool,
                      flag: str = "allow_large_delta=True") -> None:
    """Refuse a `delta` (or `selection_delta`) above MAX_DELTA unless `allowed` (other
    checks of the value are the caller's: only a number above MAX_DELTA is refused here)."""
    if (value is not None and not isinstance(value, bool) and isinstance(value, (int, float))
            and value > MAX_DELTA and not allowed):
        check.fail(name, f"<= {MAX_DELTA:g} unless {flag} (delta is the probability the "
                         f"guarantee fails outright)", value)


@dataclasses.dataclass(frozen=True)
class PrivacyBudget:
    """What one release of a mechanism spends, and which noise serves it.

    `noise` is LAPLACE (pure `epsilon`-DP) or GAUSSIAN (`rho`-zCDP; `epsilon`/`delta` are set
    too when the caller asked in (epsilon, delta) terms).
    """
    noise: str
    epsilon: Optional[float] = None
    rho: Optional[float] = None
    delta: Optional[float] = None

    @classmethod
    def resolve(cls, epsilon=None, rho=None, delta=None) -> "PrivacyBudget":
        if rho is not None:
            if epsilon is not None:
                check.fail("epsilon", "None when `rho` is given (pass exactly one of them)",
                           epsilon)
            if delta is not None:
                check.fail("delta", "None when `rho` is given", delta)
            return cls(GAUSSIAN, rho=check.positive_finite("rho", rho))
        if epsilon is None:
            check.fail("epsilon", "given when `rho` is not (pass exactly one of them)", epsilon)
        epsilon = check.positive_finite("epsilon", epsilon)
        if delta is None:
            return cls(LAPLACE, epsilon=epsilon)
        delta = check.open_unit_interval("delta", delta)
        return cls(GAUSSIAN, epsilon=epsilon, rho=rho_from_epsilon_delta(epsilon, delta),
                   delta=delta)

    @property
    def sensitivity_norm(self) -> int:
        """The p of the l_p sensitivity this budget's noise is calibrated to."""
        return 1 if self.noise == LAPLACE else 2

    def node_scale(self, sensitivity: float) -> float:
        """Laplace scale b = Delta_1 / epsilon, or Gaussian sigma = Delta_2 / sqrt(2 rho)."""
        if self.noise == LAPLACE:
            return sensitivity / self.epsilon
        return sensitivity / math.sqrt(2.0 * self.rho)

    def node_variance(self, sensitivity: float) -> float:
        scale = self.node_scale(sensitivity)
        return 2.0 * scale * scale if self.noise == LAPLACE else scale * scale

    def as_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

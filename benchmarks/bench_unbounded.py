"""What a release with no horizon costs: the variance of `log_sqrt_toeplitz` at step t = 2^k
over that of `sqrt_toeplitz` calibrated for T = t (at its last step, the same budget), and the
largest jump between consecutive steps' variances (docs/mechanisms.md "With no horizon").

    python3 benchmarks/bench_unbounded.py [--exponent 20] [--c 4 --s 64 --g 0.9]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transforms.mechanisms import make  # noqa: E402
from transforms.mechanisms.toeplitz import sqrt_coefficients  # noqa: E402


def ratios(exponent: int, c: float = 4.0, s: float = 64.0, g: float = 0.9):
    """({k: variance ratio at t = 2^k}, the largest ratio of consecutive variances from
    t = 16 on). Per unit of budget: the node variance over the squared sensitivity is the
    same for both, so each variance is the squared sensitivity times L's squared row norm."""
    horizon = 1 << exponent
    mechanism = make("log_sqrt_toeplitz", horizon, rho=0.5, noise="float", seed=0, c=c, s=s,
                     g=g)
    variance = mechanism.noise_variance() / mechanism.node_variance * \
        mechanism.sensitivity ** 2
    # the square root for T = t: column norm^2 x last row's norm^2 = (sum_{j<t} f_j^2)^2
    known = np.cumsum(sqrt_coefficients(horizon) ** 2) ** 2
    found = {k: float(variance[(1 << k) - 1] / known[(1 << k) - 1])
             for k in range(exponent + 1)}
    jump = float((variance[16:] / variance[15:-1]).max()) if horizon > 16 else 1.0
    return found, jump


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exponent", type=int, default=20)
    parser.add_argument("--c", type=float, default=4.0)
    parser.add_argument("--s", type=float, default=64.0)
    parser.add_argument("--g", type=float, default=0.9)
    args = parser.parse_args(argv)
    found, jump = ratios(args.exponent, args.c, args.s, args.g)
    shown = [k for k in found if k >= 4 and k % 2 == 0]
    print("| k | " + " | ".join(str(k) for k in shown) + " |")
    print("|---|" + "---|" * len(shown))
    print("| variance ratio | " + " | ".join(f"{found[k]:.2f}" for k in shown) + " |")
    print(f"largest jump between consecutive steps from t = 16: {100 * (jump - 1):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())

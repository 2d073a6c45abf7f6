"""What a release with no horizon costs: the variance of `log_sqrt_toeplitz` at step t = 2^k
over that of `sqrt_toeplitz` calibrated for T = t (knowing where the stream stops) and for the
release's whole reach, T = 2^20 (knowing how long it will run), both at step t and under the
same budget, and the largest jump between consecutive steps' variances (docs/mechanisms.md
"With no horizon"). `--grid` searches (c, s, g) for the defaults.

    python3 benchmarks/bench_unbounded.py [--exponent 20] [--c 4 --s 16384 --g 1.7] [--grid]
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transforms.mechanisms import MECHANISMS, make  # noqa: E402
from transforms.mechanisms.toeplitz import sqrt_coefficients  # noqa: E402

DEFAULTS = MECHANISMS["log_sqrt_toeplitz"].default_params("gaussian")
GRID = {"c": (1.0, 2.0, 4.0, 8.0, 16.0), "g": (0.6, 0.7, 0.9, 1.2, 1.7),
        "s": (64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 1 << 20)}
WITHIN = 1.5  # the variance ratio to the square root for the whole reach, at every t = 2^k


def ratios(exponent: int, c: float = DEFAULTS["c"], s: float = DEFAULTS["s"],
           g: float = DEFAULTS["g"]):
    """({k: variance ratio at t = 2^k to the square root for T = t}, {k: the same to the
    square root for T = 2^exponent}, the largest ratio of consecutive variances from t = 16
    on). Per unit of budget: the node variance over the squared sensitivity is the same for
    all, so each variance is the squared sensitivity times L's squared row norm."""
    horizon = 1 << exponent
    mechanism = make("log_sqrt_toeplitz", horizon, rho=0.5, noise="float", seed=0, c=c, s=s,
                     g=g)
    variance = mechanism.noise_variance() / mechanism.node_variance * \
        mechanism.sensitivity ** 2
    # the square root for T: column norm^2 (sum_{j<T} f_j^2) x row t's norm^2 (sum_{j<=t})
    squares = np.cumsum(sqrt_coefficients(horizon) ** 2)
    steps = range(exponent + 1)
    known = {k: float(variance[(1 << k) - 1] / squares[(1 << k) - 1] ** 2) for k in steps}
    reach = {k: float(variance[(1 << k) - 1] / (squares[-1] * squares[(1 << k) - 1]))
             for k in steps}
    jump = float((variance[16:] / variance[15:-1]).max()) if horizon > 16 else 1.0
    return known, reach, jump


def grid(exponent: int):
    """(c, s, g) of GRID whose ratio to the whole reach stays within WITHIN at every t = 2^k,
    with the smallest largest ratio to T = t known over t = 2^4 .. 2^exponent: -> (the
    parameters, that ratio), or None."""
    best = None
    for c, s, g in itertools.product(GRID["c"], GRID["s"], GRID["g"]):
        known, reach, _ = ratios(exponent, c, s, g)
        worst = max(known[k] for k in known if k >= 4)
        if max(reach.values()) <= WITHIN and (best is None or worst < best[1]):
            best = ({"c": c, "s": s, "g": g}, worst)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exponent", type=int, default=20)
    parser.add_argument("--c", type=float, default=DEFAULTS["c"])
    parser.add_argument("--s", type=float, default=DEFAULTS["s"])
    parser.add_argument("--g", type=float, default=DEFAULTS["g"])
    parser.add_argument("--grid", action="store_true",
                        help=f"search {len(list(itertools.product(*GRID.values())))} (c, s, g)")
    args = parser.parse_args(argv)
    if args.grid:
        found = grid(args.exponent)
        print("none within" if found is None else
              f"best: {found[0]} (largest ratio to T = t known, t >= 2^4: {found[1]:.2f})")
        return 0
    known, reach, jump = ratios(args.exponent, args.c, args.s, args.g)
    shown = [k for k in known if k >= 4 and k % 2 == 0]
    print("| k | " + " | ".join(str(k) for k in shown) + " |")
    print("|---|" + "---|" * len(shown))
    print("| to T = t known | " + " | ".join(f"{known[k]:.2f}" for k in shown) + " |")
    print(f"| to T = 2^{args.exponent} known | "
          + " | ".join(f"{reach[k]:.2f}" for k in shown) + " |")
    print(f"largest jump between consecutive steps from t = 16: {100 * (jump - 1):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Demo of the mechanism core: the error of every mechanism before spending budget, then a short
noisy release with confidence intervals.

    python3 -m pipelines.demo [--horizon T] [--epsilon E | --rho R] [--seed S]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from transforms.mechanisms import LAPLACE, MECHANISMS, NAMES, PrivacyBudget, make
from pipelines import logs

DEMO_PARAMS = {"kary_tree": {"k": 4}, "kary_subtraction": {}}


def error_table(horizon: int, privacy: dict, seed: int) -> list:
    rows = []
    laplace = PrivacyBudget.resolve(**privacy).noise == LAPLACE
    for name in NAMES:
        if laplace and not MECHANISMS[name].pure_dp:
            continue  # no epsilon-only calibration (log_sqrt_toeplitz)
        # continuous noise: the papers' reference values (discrete variances differ < 1 %)
        mechanism = make(name, horizon, seed=seed, noise="float", **privacy,
                         **DEMO_PARAMS.get(name, {}))
        rows.append((name, mechanism.params(), mechanism.sensitivity, mechanism.max_se(),
                     mechanism.mean_se()))
    return rows


def params_text(params: dict) -> str:
    """k=19,sparsify=True: a list parameter (BLT's decays) by its length only."""
    return ",".join(f"{k}=[{len(v)} values]" if isinstance(v, (list, tuple)) else f"{k}={v}"
                    for k, v in params.items())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--horizon", type=int, default=1000,
                        help="T, the number of steps (default 1000)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--epsilon", type=float, help="pure DP budget (default 1.0)")
    group.add_argument("--rho", type=float, help="zCDP budget (instead of --epsilon)")
    parser.add_argument("--seed", type=int, default=2026,
                        help="seed of the demo release's noise (not private; default 2026)")
    parser.add_argument("--verbose", action="store_true",
                        help="show Beam's and the library's logs (quiet by default)")
    args = parser.parse_args(argv)
    logs.configure(args.verbose)
    privacy = {"rho": args.rho} if args.rho is not None else {"epsilon": args.epsilon or 1.0}
    try:
        rows = error_table(args.horizon, privacy, args.seed)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    label = ", ".join(f"{k}={v}" for k, v in privacy.items())
    print(f"Exact noise of every mechanism, T = {args.horizon}, {label}, one unit changes one "
          f"step by at most 1:\n")
    shown = [params_text(params) for _, params, _, _, _ in rows]
    width = max(len("params"), *(len(text) for text in shown)) + 2
    print(f"{'mechanism':<20}{'params':<{width}}{'sensitivity':>12}{'MaxSE':>10}{'MeanSE':>10}")
    for (name, _, sensitivity, max_se, mean_se), text in zip(rows, shown):
        print(f"{name:<20}{text:<{width}}{sensitivity:>12.4f}{max_se:>10.3f}{mean_se:>10.3f}")
    best = min(rows, key=lambda row: row[3])
    print(f"\nLowest MaxSE: {best[0]} {params_text(best[1]) or '(no parameters)'}\n")

    horizon = min(args.horizon, 12)
    mechanism = make(best[0], horizon, seed=args.seed, **privacy, **best[1],
                     noise="float" if best[0] == "sqrt_toeplitz" else "discrete")
    counts = np.random.default_rng(args.seed).poisson(20, horizon)
    released = mechanism.release(counts)
    low, high = mechanism.confidence_interval(released, level=0.95)
    print(f"A {horizon}-step release with {best[0]} (seeded demo noise; real jobs use a secret):")
    print(f"{'step':>4}{'events':>8}{'true total':>12}{'released':>12}{'95% CI':>24}")
    for t, (x, true, value, lo, hi) in enumerate(zip(counts, np.cumsum(counts), released, low,
                                                     high), start=1):
        print(f"{t:>4}{x:>8}{true:>12}{value:>12.2f}{f'[{lo:.1f}, {hi:.1f}]':>24}")
    return 0


if __name__ == "__main__":
    logs.exit_now(main())

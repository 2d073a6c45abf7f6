"""Know the error before spending the budget: every mechanism's exact error for your horizon,
privacy budget and contribution bounds, and the recommendation.

    python3 -m pipelines.plan --horizon T (--epsilon E | --rho R | --epsilon E --delta d)
        [--max-contributions k] [--interval-bound D] [--metric max|mean] [--json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from transforms.mechanisms.choose import METRICS, choose


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, exit code 2
        raise _UsageError(message)


class _UsageError(Exception):
    pass


def _positive_int(name):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"`{name}` must be an integer >= 1; got {text!r}.")
        if value < 1:
            raise argparse.ArgumentTypeError(f"`{name}` must be an integer >= 1; got {value}.")
        return value
    return parse


def _positive_float(name, below_one=False):
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = None
        ok = value is not None and math.isfinite(value) and value > 0 and (
            not below_one or value < 1)
        if not ok:
            condition = "a number in (0, 1)" if below_one else "a positive finite number"
            raise argparse.ArgumentTypeError(f"`{name}` must be {condition}; got {text!r}.")
        return value
    return parse


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python3 -m pipelines.plan", description=__doc__.splitlines()[0])
    p.add_argument("--horizon", type=_positive_int("horizon"), required=True)
    p.add_argument("--epsilon", type=_positive_float("epsilon"))
    p.add_argument("--rho", type=_positive_float("rho"))
    p.add_argument("--delta", type=_positive_float("delta", below_one=True))
    p.add_argument("--max-contributions", type=_positive_int("max-contributions"), default=1)
    p.add_argument("--interval-bound", type=_positive_int("interval-bound"), default=1)
    p.add_argument("--metric", choices=METRICS, default="max")
    p.add_argument("--noise", choices=("discrete", "float"), default="discrete",
                   help="discrete (default, secure) or float (adds sqrt_toeplitz)")
    p.add_argument("--json", action="store_true")
    return p


def privacy_from(args) -> dict:
    if args.rho is not None and (args.epsilon is not None or args.delta is not None):
        raise _UsageError("`rho` must be given alone (not with --epsilon or --delta).")
    if args.rho is not None:
        return {"rho": args.rho}
    if args.epsilon is None and args.delta is not None:
        raise _UsageError(f"`delta` must come with --epsilon; got --delta {args.delta} alone.")
    if args.epsilon is None:
        raise _UsageError("`privacy` must be --epsilon E, --rho R or --epsilon E --delta d; "
                          "got none.")
    privacy = {"epsilon": args.epsilon}
    if args.delta is not None:
        privacy["delta"] = args.delta
    return privacy


def main(argv=None) -> int:
    try:
        args = parser().parse_args(argv)
        privacy = privacy_from(args)
        if args.horizon > 1 << 24:
            raise _UsageError(f"`horizon` must be <= {1 << 24} for planning; got {args.horizon}.")
        best, rows = choose(args.horizon, privacy, args.max_contributions, args.interval_bound,
                            args.metric, noise=args.noise)
    except (_UsageError, ValueError) as error:
        message = str(error)
        print(f"error: {message if message.endswith('.') else message + '.'}", file=sys.stderr)
        return 2
    key = "max_se" if args.metric == "max" else "mean_se"
    rows = sorted(rows, key=lambda r: getattr(r, key))
    if args.json:
        print(json.dumps({"horizon": args.horizon, "privacy": privacy,
                          "max_contributions": args.max_contributions,
                          "interval_bound": args.interval_bound, "metric": args.metric,
                          "rows": [r.row() for r in rows], "recommended": best.row()},
                         indent=2))
        return 0
    budget = ", ".join(f"{k}={v}" for k, v in privacy.items())
    print(f"T = {args.horizon}, {budget}, one unit changes a key's difference stream by a vector "
          f"of S_(D={args.interval_bound}, k={args.max_contributions}); sorted by {key}:\n")
    print(f"{'mechanism':<20}{'params':<26}{'MaxSE':>11}{'MeanSE':>11}{'sensitivity':>13}  state")
    for r in rows:
        params = ",".join(f"{k}={v}" for k, v in r.params.items() if k != "prune")
        print(f"{r.mechanism:<20}{params:<26}{r.max_se:>11.3f}{r.mean_se:>11.3f}"
              f"{r.sensitivity:>13.4f}  {r.state}")
    print(f"\nRecommended ({args.metric} error): {best.mechanism} {best.params} "
          f"(MaxSE {best.max_se:.3f}, MeanSE {best.mean_se:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

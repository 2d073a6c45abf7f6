"""Know the error before spending the budget: every mechanism's exact error for your horizon,
privacy budget and contribution bounds, and the recommendation.

    python3 -m pipelines.plan --horizon T (--epsilon E | --rho R | --epsilon E --delta d)
        [--max-contributions k] [--interval-bound D] [--max-keys-per-unit m [--split]]
        [--metric max|mean] [--noise discrete|float] [--max-state-bytes-per-key B]
        [--top N] [--json]
    python3 -m pipelines.plan ... --mean-max-value V [--value-resolution g] [--sum-share w]

With m > 1 keys per unit, each row is calibrated as the release would be: jointly (a unit's k
caps its total over all keys, as ContinualCount/ContinualSum declare: each key keeps the full
budget, up to the discrete square root's rounding term) or, with --split (per-key budgets, as
CountDistinct and DegreeCount), budget / m per key.

Rows whose only difference is an option with no effect at this horizon (e.g. `sparsify` when
no node is unused) are shown once, with that option marked `either`; an option that changes
the error keeps only its better value.

With --mean-max-value V it plans a ContinualMean (values clamped to [0, V], at most k events
per unit): the split of the budget between its sum and count parts (the default minimises the
mean's delta-method variance at the worst-case mean: 1/2), each part's recommendation at its
share and half the per-key state budget (a key holds one state per part; the sum part in
value-grid units g, default V / 100 with discrete noise), and the mean's standard error times a
key's count C at that mean.

The `state` column is one key's sealed mechanism state at the end of the horizon (bytes of Beam
state per key, and of each key's line in the scheduler's checkpoints, there about twice as
hex); rows over the per-key state budget (--max-state-bytes-per-key, default 65536, as the
transforms' `max_state_bytes_per_key`) are marked and never recommended.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from transforms.mechanisms.choose import (DEFAULT_MAX_STATE_BYTES_PER_KEY, METRICS,
                                           MIN_STATE_BYTES_PER_KEY, memory_note)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, exit code 2
        raise _UsageError(message)


class _UsageError(Exception):
    pass


def _positive_int(name, minimum=1):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"`{name}` must be an integer >= {minimum}; got {text!r}.")
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"`{name}` must be an integer >= {minimum}; got {value}.")
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
    p = _Parser(prog="python3 -m pipelines.plan", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--horizon", type=_positive_int("horizon"), required=True,
                   help="T, the number of steps the release covers")
    p.add_argument("--epsilon", type=_positive_float("epsilon"),
                   help="pure DP budget of the whole release (or with --delta: approximate DP)")
    p.add_argument("--rho", type=_positive_float("rho"), help="zCDP budget of the whole release")
    p.add_argument("--delta", type=_positive_float("delta", below_one=True),
                   help="with --epsilon: (epsilon, delta)-DP through the Gaussian mechanism")
    p.add_argument("--max-contributions", type=_positive_int("max-contributions"), default=1,
                   help="k: the l1 mass one unit adds to a key's difference stream (default 1)")
    p.add_argument("--interval-bound", type=_positive_int("interval-bound"), default=None,
                   help="D: the bound on any interval sum of that change (default k: all of a "
                        "unit's mass may fall in one interval, as in a count without a "
                        "per-step cap)")
    p.add_argument("--max-keys-per-unit", type=_positive_int("max-keys-per-unit"), default=1,
                   help="m: keys one unit can change (default 1)")
    p.add_argument("--split", action="store_true",
                   help="with m > 1: budget / m per key (no cap across keys), instead of the "
                        "joint calibration of counts and sums")
    p.add_argument("--metric", choices=METRICS, default="max",
                   help="sort and recommend by the largest (max, default) or the mean per-step "
                        "standard error")
    p.add_argument("--noise", choices=("discrete", "float"), default="discrete",
                   help="discrete (default, secure) or float (opt-in; adds sqrt_toeplitz under "
                        "pure DP)")
    p.add_argument("--max-state-bytes-per-key",
                   type=_positive_int("max-state-bytes-per-key", MIN_STATE_BYTES_PER_KEY),
                   default=DEFAULT_MAX_STATE_BYTES_PER_KEY,
                   help="B: the per-key state budget in bytes (default "
                        f"{DEFAULT_MAX_STATE_BYTES_PER_KEY}, as the transforms' "
                        "max_state_bytes_per_key); rows over it are marked and never "
                        f"recommended (at least {MIN_STATE_BYTES_PER_KEY}: what every tree "
                        "keeps)")
    p.add_argument("--mean-max-value", type=_positive_float("mean-max-value"),
                   help="V: plan a ContinualMean of values clamped to [0, V] (k: events per "
                        "unit)")
    p.add_argument("--value-resolution", type=_positive_float("value-resolution"),
                   help="g: the mean's value grid (default V / 100 with discrete noise)")
    p.add_argument("--sum-share", type=_positive_float("sum-share", below_one=True),
                   help="the mean's sum part's share of the budget (default: the worst-case "
                        "optimum)")
    p.add_argument("--top", type=_positive_int("top"),
                   help="print only the N best rows (default: all)")
    p.add_argument("--json", action="store_true",
                   help='print {"rows": [...], "recommended": {...}} instead of a table')
    return p


NO_EFFECT = "either"


def distinct_rows(rows, key: str):
    """One row per mechanism and parameters that matter: rows equal in error and sensitivity
    that differ only in an option are merged (the option shown as `either`); otherwise the
    better value of the option is kept. Sorted by `key`."""
    best = {}
    for row in sorted(rows, key=lambda r: (getattr(r, key), r.max_se, r.mean_se)):
        core = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                            for k, v in row.params.items() if k not in ("sparsify", "prune")))
        group = (row.mechanism, core)
        if group not in best:
            best[group] = row
            continue
        kept = best[group]
        same = (kept.max_se, kept.mean_se, kept.sensitivity) == (
            row.max_se, row.mean_se, row.sensitivity)
        if same:
            params = dict(kept.params)
            for option in ("sparsify", "prune"):
                if option in params and params[option] != row.params.get(option):
                    params[option] = NO_EFFECT
            best[group] = dataclasses.replace(kept, params=params)
    return list(best.values())


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


def calibrated_rows(args, privacy: dict):
    """The candidates as a release with these bounds would calibrate them."""
    from transforms.calibration import choose_calibrated
    from transforms.mechanisms.privacy import PrivacyBudget
    from transforms.streams.records import Declaration
    k, m = args.max_contributions, args.max_keys_per_unit
    declaration = Declaration(args.interval_bound, k, m, "unit",
                              joint_mass=None if args.split else k)
    return choose_calibrated(args.horizon, PrivacyBudget.resolve(**privacy), declaration,
                             args.metric, noise=args.noise,
                             max_state_bytes=args.max_state_bytes_per_key)


def mean_parts(args, privacy: dict) -> dict:
    """A ContinualMean's parts as `calibrated_rows` plans them: {part: (args, privacy)}, and
    the split (`ratio.best_split`, or --sum-share)."""
    from transforms.accountant import part_kwargs, share_budget
    from transforms.mechanisms.privacy import PrivacyBudget
    from transforms.mechanisms.ratio import best_split
    if args.interval_bound is not None:
        raise _UsageError(f"`interval-bound` must be left out with --mean-max-value (the mean's "
                          f"parts declare theirs); got {args.interval_bound}.")
    from transforms.streams.count import ContributionBounds, value_resolution
    from transforms.streams.mean import SUM, MeanProblem
    value = args.mean_max_value
    grid = value_resolution(value, args.value_resolution, args.noise)
    budget = PrivacyBudget.resolve(**privacy)
    split = best_split(0.0, value, budget.noise)
    share = split.sum_share if args.sum_share is None else args.sum_share
    budgets = share_budget(budget, {"sum": share, "count": 1.0 - share})
    k = args.max_contributions
    mass = MeanProblem(ContributionBounds(k, None, args.max_keys_per_unit), with_value=True,
                       value_grid=grid, max_value=value, part=SUM).declaration.max_contributions
    state = args.max_state_bytes_per_key // 2  # a key's two states share the budget
    if state < MIN_STATE_BYTES_PER_KEY:
        raise _UsageError(f"`max-state-bytes-per-key` must be >= {2 * MIN_STATE_BYTES_PER_KEY} "
                          f"for a mean (a key holds one state per part); got "
                          f"{args.max_state_bytes_per_key}.")
    parts = {"sum": (_with(args, max_contributions=mass, interval_bound=mass,
                           max_state_bytes_per_key=state), part_kwargs(budgets["sum"])),
             "count": (_with(args, interval_bound=k, max_state_bytes_per_key=state),
                       part_kwargs(budgets["count"]))}
    return {"parts": parts, "sum_share": share, "grid": grid,
            "split": "configured (--sum-share)" if args.sum_share is not None else
            f"{split.formula} at m = {split.reference_mean:g} (the worst case)"}


def _with(args, **changes):
    copy = argparse.Namespace(**vars(args))
    for name, value in changes.items():
        setattr(copy, name, value)
    return copy


def plan_mean(args, privacy: dict) -> int:
    """`main` for --mean-max-value: the split, each part's recommendation, the mean's error."""
    plan = mean_parts(args, privacy)
    chosen = {}
    for part, (part_args, part_privacy) in plan["parts"].items():
        chosen[part] = calibrated_rows(part_args, part_privacy)[0]
    grid = plan["grid"] or 1.0
    value = args.mean_max_value
    sum_se, count_se = chosen["sum"].max_se * grid, chosen["count"].max_se
    # delta method: sd(S^ / C^) ~ sqrt(Vs + m^2 Vc) / C, at the worst-case mean m = V
    times_count = math.sqrt(sum_se ** 2 + value ** 2 * count_se ** 2)
    if args.json:
        print(json.dumps({
            "horizon": args.horizon, "privacy": privacy, "transform": "mean",
            "max_contributions": args.max_contributions, "max_value": value,
            "value_resolution": plan["grid"], "sum_share": plan["sum_share"],
            "split": plan["split"],
            "parts": {part: {"privacy": plan["parts"][part][1], "recommended": row.row()}
                      for part, row in chosen.items()},
            "mean_se_times_count": times_count}, indent=2))
        return 0
    spent = ", ".join(f"{k}={v}" for k, v in privacy.items())
    print(f"ContinualMean, T = {args.horizon}, {spent}, at most {args.max_contributions} events "
          f"per unit, values clamped to [0, {value:g}]"
          + (f" on a grid of {plan['grid']:g}" if plan["grid"] else "") + ":")
    print(f"  budget split: sum part {plan['sum_share']:.4g}, count part "
          f"{1 - plan['sum_share']:.4g} ({plan['split']})")
    for part, row in chosen.items():
        shown = params_text(row.params)
        unit = " (values)" if part == "sum" else ""
        scale = grid if part == "sum" else 1.0
        budget = ", ".join(f"{k}={v:g}" for k, v in plan["parts"][part][1].items())
        print(f"  {part} part at {budget}: {row.mechanism} {shown}, MaxSE "
              f"{row.max_se * scale:.3f}{unit}")
    print(f"  the mean's standard error at the worst-case mean {value:g}: about "
          f"{times_count:.3f} / C for a key whose count is C (delta method)")
    return 0


def state_cell(row, budget: int, noise: str) -> str:
    """The `state` column: bytes per key, what else the mechanism holds, and the budget mark."""
    note = memory_note(row.mechanism, noise)
    text = f"{row.state_bytes:,} B" + (f" ({note})" if note else "")
    return text + (f"  OVER the {budget:,} B budget" if row.state_bytes > budget else "")


def params_text(params: dict, skip=()) -> str:
    """A mechanism's parameters as the configs write them: k=13,sparsify=True (a list, BLT's
    decays, left out)."""
    return ",".join(f"{k}={v}" for k, v in params.items()
                    if k not in skip and not isinstance(v, list))


def main(argv=None) -> int:
    try:
        args = parser().parse_args(argv)
        privacy = privacy_from(args)
        if args.horizon > 1 << 24:
            raise _UsageError(f"`horizon` must be <= {1 << 24} for planning; got {args.horizon}.")
        if args.mean_max_value is not None:
            return plan_mean(args, privacy)
        if args.interval_bound is None:  # never below what the job's count declares
            args.interval_bound = args.max_contributions
        if args.value_resolution is not None or args.sum_share is not None:
            raise _UsageError("`value-resolution` and `sum-share` must come with "
                              "--mean-max-value; got them without it.")
        best, rows = calibrated_rows(args, privacy)
    except (_UsageError, ValueError) as error:
        message = str(error)
        print(f"error: {message if message.endswith('.') else message + '.'}", file=sys.stderr)
        return 2
    key = "max_se" if args.metric == "max" else "mean_se"
    budget = args.max_state_bytes_per_key
    rows = distinct_rows(rows, key)[:args.top]
    if args.json:
        print(json.dumps({"horizon": args.horizon, "privacy": privacy,
                          "max_contributions": args.max_contributions,
                          "max_keys_per_unit": args.max_keys_per_unit,
                          "interval_bound": args.interval_bound, "metric": args.metric,
                          "max_state_bytes_per_key": budget,
                          "rows": [dict(r.row(), over_budget=r.state_bytes > budget)
                                   for r in rows], "recommended": best.row()},
                         indent=2))
        return 0
    spent = ", ".join(f"{k}={v}" for k, v in privacy.items())
    keys = ("" if args.max_keys_per_unit == 1 else
            f", on at most {args.max_keys_per_unit} keys ("
            + ("budget split over them" if args.split else
               "k caps the total over them: joint calibration") + ")")
    print(f"T = {args.horizon}, {spent}, one unit changes a key's difference stream by a vector "
          f"of S_(D={args.interval_bound}, k={args.max_contributions}){keys}; sorted by "
          f"{key}:\n")
    print(f"{'mechanism':<20}{'params':<26}{'MaxSE':>11}{'MeanSE':>11}{'sensitivity':>13}  state")
    for r in rows:
        params = params_text(r.params, skip=("prune",))
        print(f"{r.mechanism:<20}{params:<26}{r.max_se:>11.3f}{r.mean_se:>11.3f}"
              f"{r.sensitivity:>13.4f}  {state_cell(r, budget, args.noise)}")
    shown = params_text(best.params)
    print(f"\nRecommended ({args.metric} error): {best.mechanism}"
          + (f" {shown}" if shown else "")
          + f" (MaxSE {best.max_se:.3f}, MeanSE {best.mean_se:.3f})")
    over = sorted({r.mechanism for r in rows if r.state_bytes > budget})
    if over:
        print(f"Not recommended, over the per-key state budget of {budget:,} B "
              f"(--max-state-bytes-per-key): {', '.join(over)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Know the error before spending the budget: every mechanism's exact error for your horizon,
privacy budget and contribution bounds, and the recommendation.

    python3 -m pipelines.plan --horizon T (--epsilon E | --rho R | --epsilon E --delta d)
        [--max-contributions k] [--interval-bound D] [--max-keys-per-unit m [--split]]
        [--metric max|mean] [--noise discrete|float] [--max-state-bytes-per-key B]
        [--value-resolution g] [--top N] [--json]
    python3 -m pipelines.plan ... --mean-max-value V [--mean-min-value L] [--value-resolution g]
        [--sum-share w]
    python3 -m pipelines.plan --config job.yaml [--top N] [--json]

--config plans the job exactly as `pipelines.run` would run it: it builds the job's transform
(no secret, no data) and plans each stream it releases with the arguments of the plan command
the job prints (`plan_arguments`: the same calibration, bounds, keys per unit, noise, state
budget and, for a mean, budget split), then says which mechanism the job runs (the configured
one, or `auto`'s pick: the recommendation) and its MaxSE, the number the job prints. All other
options but --top and --json come from the config and cannot be given with it.

A sum with discrete noise declares its bounds in units of its value grid g (value_resolution,
default max_value / 100): its plan command carries --value-resolution g, k and D are in grid
units, and MaxSE and MeanSE are printed in the job's value units (times g), as the job prints
them (the sensitivity stays in grid units).

With m > 1 keys per unit, each row is calibrated as the release would be: jointly (a unit's k
caps its total over all keys, as ContinualCount/ContinualSum declare: each key keeps the full
budget, up to the discrete square root's rounding term) or, with --split (per-key budgets, as
CountDistinct and DegreeCount), budget / m per key.

Rows whose only difference is an option with no effect at this horizon (e.g. `sparsify` when
no node is unused) are shown once, with that option marked `either`; an option that changes
the error keeps only its better value.

With --mean-max-value V it plans a ContinualMean (values clamped to [L, V], L =
--mean-min-value, default 0, at most k events per unit): the split of the budget between its sum and count parts (the default minimises the
mean's delta-method variance at the worst-case mean: 1/2), each part's recommendation at its
share and half the per-key state budget (a key holds one state per part; the sum part in
value-grid units g, default max(|L|, V) / 100 with discrete noise), and the mean's standard
error times a key's count C at that mean.

The `state` column is one key's sealed mechanism state at the end of the horizon: the 16-byte
release/secret/key tag and the mechanism's state (bytes of Beam state per key, and of each
key's line in the scheduler's checkpoints, there about twice as hex); --json gives the same
number as `state_bytes` (and `state`, the column's text). Rows over the per-key state budget
(--max-state-bytes-per-key, default 65536, as the transforms' `max_state_bytes_per_key`) are
marked and never recommended.
"""
from __future__ import annotations

import argparse
import json
import sys

from pipelines import plan_unbounded
from pipelines.planning import (MeanPlan, UsageError, mean_json, mean_text, plan_of, privacy_from,
                                stream_json, stream_text)
from transforms import validation as check
from transforms.mechanisms.choose import (DEFAULT_MAX_STATE_BYTES_PER_KEY, METRICS,
                                           MIN_STATE_BYTES_PER_KEY)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, exit code 2
        raise UsageError(message)


def _positive_int(name, minimum=1):
    """An argument parser: the one rule (`validation.integer_at_least`); text that is not an
    integer is echoed as typed."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(check.message(
                name, f"an integer >= {minimum}", text)) from None
        try:
            return check.integer_at_least(name, value, minimum)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return parse


def _below_max(name):
    """An argument parser: a finite number (`validation.finite_number`'s rule; that it is below
    --mean-max-value is checked with the other options)."""
    def parse(text):
        try:
            return check.finite_number(name, float(text))
        except ValueError:
            raise argparse.ArgumentTypeError(check.message(name, "a finite number", text))
    return parse


def _positive_float(name, below_one=False):
    """An argument parser: the one rule (`validation.is_positive_finite` or
    `is_in_open_unit_interval`), the text echoed as typed."""
    rule, condition = (check.is_in_open_unit_interval, check.OPEN_UNIT_INTERVAL) if below_one \
        else (check.is_positive_finite, check.POSITIVE_FINITE)

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = None
        if value is None or not rule(value):
            raise argparse.ArgumentTypeError(check.message(name, condition, text))
        return value
    return parse


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python3 -m pipelines.plan", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config",
                   help="a job's YAML config (or demo:<job>): plan exactly what the job runs "
                        "(every option but --top and --json comes from it)")
    p.add_argument("--horizon", type=_positive_int("horizon"),
                   help="T, the number of steps the release covers (required without --config)")
    p.add_argument("--epsilon", type=_positive_float("epsilon"),
                   help="pure DP budget of the whole release (or with --delta: approximate DP)")
    p.add_argument("--rho", type=_positive_float("rho"), help="zCDP budget of the whole release")
    p.add_argument("--gate-share", type=_positive_float("gate-share", below_one=True),
                   help="the input gate's share of the budget (pipelines.run's "
                        "privacy.gate_share, default 0.02 there): the rest is planned")
    p.add_argument("--delta", type=_positive_float("delta", below_one=True),
                   help="with --epsilon: (epsilon, delta)-DP through the Gaussian mechanism")
    p.add_argument("--max-contributions", type=_positive_int("max-contributions"),
                   help="k: the l1 mass one unit adds to a key's difference stream (default 1)")
    p.add_argument("--interval-bound", type=_positive_int("interval-bound"), default=None,
                   help="D: the bound on any interval sum of that change (default k: all of a "
                        "unit's mass may fall in one interval, as in a count without a "
                        "per-step cap)")
    p.add_argument("--max-keys-per-unit", type=_positive_int("max-keys-per-unit"),
                   help="m: keys one unit can change (default 1)")
    p.add_argument("--split", action="store_true",
                   help="with m > 1: budget / m per key (no cap across keys), instead of the "
                        "joint calibration of counts and sums")
    p.add_argument("--metric", choices=METRICS,
                   help="sort and recommend by the largest (max, default) or the mean per-step "
                        "standard error")
    p.add_argument("--noise", choices=("discrete", "float"),
                   help="discrete (default, secure) or float (opt-in; adds sqrt_toeplitz under "
                        "pure DP)")
    p.add_argument("--max-state-bytes-per-key",
                   type=_positive_int("max-state-bytes-per-key", MIN_STATE_BYTES_PER_KEY),
                   help="B: the per-key state budget in bytes (default "
                        f"{DEFAULT_MAX_STATE_BYTES_PER_KEY}, as the transforms' "
                        "max_state_bytes_per_key); rows over it are marked and never "
                        f"recommended (at least {MIN_STATE_BYTES_PER_KEY}: what every tree "
                        "keeps)")
    p.add_argument("--mean-max-value", type=_positive_float("mean-max-value"),
                   help="V: plan a ContinualMean of values clamped to [0, V] (k: events per "
                        "unit)")
    p.add_argument("--mean-min-value", type=_below_max("mean-min-value"),
                   help="L: with --mean-max-value, the smallest value kept (default 0; a "
                        "negative L keeps signed values: a mean of delays, of changes)")
    p.add_argument("--value-resolution", type=_positive_float("value-resolution"),
                   help="g: with --mean-max-value, the mean's value grid (default V / 100 with "
                        "discrete noise); without it, a sum's grid: k and D are in grid units "
                        "and the errors are printed in value units (times g), as the sum job "
                        "prints them")
    p.add_argument("--sum-share", type=_positive_float("sum-share", below_one=True),
                   help="the mean's sum part's share of the budget (default: the worst-case "
                        "optimum)")
    p.add_argument("--selection-delta", type=_positive_float("selection-delta", below_one=True),
                   help="plan private key selection (no public keys) spending this delta on "
                        "top of the budget above (docs/selection.md): the threshold of the "
                        "recommended mechanism and when keys get selected")
    p.add_argument("--rate", type=_positive_float("rate"), action="append",
                   help="with --selection-delta: a key's running total per step (value units); "
                        "prints the step by which it is selected with probability >= 1/2 "
                        "(repeat; default: four rates from the threshold)")
    p.add_argument("--unbounded", action="store_true",
                   help="a release with no horizon: with --at, the horizon-free mechanism's "
                        "stddev at those steps beside the best for a horizon known in advance")
    p.add_argument("--at", help="with --unbounded: the steps t, comma-separated "
                                "(e.g. 24,168,8760)")
    p.add_argument("--top", type=_positive_int("top"),
                   help="print only the N best rows (default: all)")
    p.add_argument("--json", action="store_true",
                   help='print {"rows": [...], "recommended": {...}} instead of a table (with '
                        '--config: {"streams": [...]}, each with the job\'s row in "runs")')
    return p


# the options a config sets (`--config` takes none of them); None / False: not given
CONFIG_SETS = ("horizon", "epsilon", "rho", "delta", "max_contributions", "interval_bound",
               "max_keys_per_unit", "split", "metric", "noise", "max_state_bytes_per_key",
               "mean_max_value", "mean_min_value", "value_resolution", "sum_share",
               "selection_delta")


def main(argv=None) -> int:
    try:
        args = parser().parse_args(argv)
        if args.config is not None:
            from pipelines import plan_config  # Beam: only a config's plan imports it
            given = [name for name in CONFIG_SETS if getattr(args, name) not in (None, False)]
            if given:
                raise UsageError("`config` must be given without " + ", ".join(
                    "--" + name.replace("_", "-") for name in given) + " (the config sets "
                    "them; only --top and --json go with it); got " + " ".join(
                    "--" + name.replace("_", "-") for name in given) + ".")
            again = plan_config.unbounded_arguments(args.config)
            if again is not None:  # no horizon: its stddev at a day, a week and a year
                return main(again + (["--json"] if args.json else []))
            planned = plan_config.plan_config(args, parser().parse_args)
            text = (json.dumps(plan_config.config_json(planned), indent=2) if args.json
                    else plan_config.config_text(planned))
        elif args.unbounded or args.at is not None:
            if not (args.unbounded and args.at is not None):
                raise UsageError("`unbounded` must come with --at (and --at with --unbounded); "
                                 f"got {'--unbounded' if args.unbounded else '--at'} alone.")
            if args.mean_max_value is not None or args.selection_delta is not None:
                raise UsageError("`unbounded` must be left out with --mean-max-value or "
                                 "--selection-delta (a count or sum only, for now); got both.")
            steps = plan_unbounded.steps_at(args.at)
            privacy = privacy_from(args)
            rows = plan_unbounded.unbounded_plan(args, privacy, steps)
            text = (json.dumps({"unbounded": rows}, indent=2) if args.json
                    else plan_unbounded.unbounded_text(rows, privacy))
        else:
            plan = plan_of(args)
            if isinstance(plan, MeanPlan):
                text = json.dumps(mean_json(plan), indent=2) if args.json else mean_text(plan)
            else:
                text = (json.dumps(stream_json(plan), indent=2) if args.json
                        else stream_text(plan))
    except (UsageError, ValueError) as error:
        message = str(error)
        print(f"error: {message if message.endswith('.') else message + '.'}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

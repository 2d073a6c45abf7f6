"""Know the error before spending the budget: every mechanism's exact error for your horizon,
privacy budget and contribution bounds, and the recommendation.

    python3 -m pipelines.plan --horizon T (--epsilon E | --rho R | --epsilon E --delta d)
        [--max-contributions k] [--interval-bound D] [--max-keys-per-unit m [--split]]
        [--metric max|mean] [--noise discrete|float] [--max-state-bytes-per-key B]
        [--value-resolution g] [--top N] [--json]
    python3 -m pipelines.plan ... --mean-max-value V [--value-resolution g] [--sum-share w]
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

With --mean-max-value V it plans a ContinualMean (values clamped to [0, V], at most k events
per unit): the split of the budget between its sum and count parts (the default minimises the
mean's delta-method variance at the worst-case mean: 1/2), each part's recommendation at its
share and half the per-key state budget (a key holds one state per part; the sum part in
value-grid units g, default V / 100 with discrete noise), and the mean's standard error times a
key's count C at that mean.

The `state` column is one key's sealed mechanism state at the end of the horizon: the 16-byte
release/secret/key tag and the mechanism's state (bytes of Beam state per key, and of each
key's line in the scheduler's checkpoints, there about twice as hex); --json gives the same
number as `state_bytes` (and `state`, the column's text). Rows over the per-key state budget
(--max-state-bytes-per-key, default 65536, as the transforms' `max_state_bytes_per_key`) are
marked and never recommended.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Optional

from pipelines import config as job_config
from pipelines.plan_command import COMMAND, plan_arguments
from transforms import validation as check
from transforms.accountant import gate_budget, part_kwargs, share_budget
from transforms.calibration import (SPLIT, calibrate, choose_calibrated, full_privacy,
                                    split_privacy)
from transforms.mechanisms import ConstantNoiseSource, make
from transforms.mechanisms.choose import (DEFAULT_MAX_STATE_BYTES_PER_KEY, METRICS,
                                           MIN_STATE_BYTES_PER_KEY, memory_note)
from transforms.mechanisms.privacy import PrivacyBudget
from transforms.mechanisms.ratio import best_split
from transforms.mechanisms.selection import (expected_selection_step, selection_delta,
                                             selection_threshold)
from transforms.release import NoNoise
from transforms.streams.count import ContributionBounds, value_resolution
from transforms.streams.mean import SUM, MeanProblem
from transforms.streams.records import Declaration


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, exit code 2
        raise _UsageError(message)


class _UsageError(Exception):
    pass


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
    p.add_argument("--top", type=_positive_int("top"),
                   help="print only the N best rows (default: all)")
    p.add_argument("--json", action="store_true",
                   help='print {"rows": [...], "recommended": {...}} instead of a table (with '
                        '--config: {"streams": [...]}, each with the job\'s row in "runs")')
    return p


# the options a config sets (`--config` takes none of them); None / False: not given
CONFIG_SETS = ("horizon", "epsilon", "rho", "delta", "max_contributions", "interval_bound",
               "max_keys_per_unit", "split", "metric", "noise", "max_state_bytes_per_key",
               "mean_max_value", "value_resolution", "sum_share", "selection_delta")
DEFAULTS = {"max_contributions": 1, "max_keys_per_unit": 1, "metric": "max",
            "noise": "discrete", "max_state_bytes_per_key": DEFAULT_MAX_STATE_BYTES_PER_KEY}


def with_defaults(args):
    """`args` with the defaults of the options left out (they are None when parsed, so that
    `--config` can tell what was given)."""
    if args.horizon is None:
        raise _UsageError("`horizon` must be given (or --config job.yaml); got none.")
    for name, value in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


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
    return counting_privacy(privacy, getattr(args, "gate_share", None))


def counting_privacy(privacy: dict, gate_share) -> dict:
    """The counting budget of a release whose input gate takes `gate_share` of `privacy`
    (`transforms.accountant.gate_budget`, as the job splits it), or `privacy` without a gate."""
    if gate_share is None:
        return privacy
    try:
        _, counting = gate_budget(PrivacyBudget.resolve(**privacy), gate_share)
    except ValueError as error:
        raise _UsageError(str(error)) from None
    return part_kwargs(counting)


def calibrated_rows(args, privacy: dict):
    """The candidates as a release with these bounds would calibrate them."""
    k, m = args.max_contributions, args.max_keys_per_unit
    declaration = Declaration(args.interval_bound, k, m, "unit",
                              joint_mass=None if args.split else k)
    return choose_calibrated(args.horizon, PrivacyBudget.resolve(**privacy), declaration,
                             args.metric, noise=args.noise,
                             max_state_bytes=args.max_state_bytes_per_key)


def mean_parts(args, privacy: dict) -> dict:
    """A ContinualMean's parts as `calibrated_rows` plans them: {part: (args, privacy)}, and
    the split (`ratio.best_split`, or --sum-share)."""
    if args.interval_bound is not None:
        raise _UsageError(f"`interval-bound` must be left out with --mean-max-value (the mean's "
                          f"parts declare theirs); got {args.interval_bound}.")
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


# ----- one released stream (a count, a sum, a distinct count, ...) -----------------------------
@dataclasses.dataclass
class StreamPlan:
    """The table of one stream: its arguments, budget, the recommendation (`auto`'s pick) and
    every candidate; `scale` turns the declaration's units into the job's value units (a sum's
    grid g, else 1)."""
    args: argparse.Namespace
    privacy: dict
    best: object
    rows: list
    selection: Optional[dict] = None  # --selection-delta: `selection_plan`

    @property
    def scale(self) -> float:
        return self.args.value_resolution or 1.0

    @property
    def key(self) -> str:
        return "max_se" if self.args.metric == "max" else "mean_se"

    def shown(self) -> list:
        return distinct_rows(self.rows, self.key)[:self.args.top]

    def find(self, name: str, params: dict):
        """The table's row of `name` with exactly these parameters (None when not a
        candidate)."""
        return next((r for r in self.rows if r.mechanism == name and r.params == params), None)


def plan_stream(args, privacy: dict) -> StreamPlan:
    if args.interval_bound is None:  # never below what the job's count declares
        args.interval_bound = args.max_contributions
    if args.sum_share is not None:
        raise _UsageError("`sum-share` must come with --mean-max-value; got it without it.")
    if args.value_resolution is not None and args.noise == "float":
        raise _UsageError(f"`value-resolution` must be left out with --noise float unless "
                          f"with --mean-max-value (a sum has no grid then); got "
                          f"{args.value_resolution}.")
    best, rows = calibrated_rows(args, privacy)
    plan = StreamPlan(args, privacy, best, rows)
    if args.selection_delta is not None:
        plan.selection = selection_plan(key_mechanism(args, privacy, best), args,
                                        args.selection_delta)
    return plan


def key_mechanism(args, privacy: dict, row):
    """The key mechanism of `row` as the release calibrates it (split or joint), zero noise."""
    k, m, d = args.max_contributions, args.max_keys_per_unit, args.interval_bound
    declaration = Declaration(d, k, m, "unit", joint_mass=None if args.split else k)
    budget = PrivacyBudget.resolve(**privacy)

    def build(key_privacy):
        return make(row.mechanism, args.horizon, **key_privacy, max_contributions=k,
                    interval_bound=d, noise_source=ConstantNoiseSource(0.0), noise=args.noise,
                    **row.params)
    if row.calibration == SPLIT:
        return build(split_privacy(declaration, budget))
    return build(calibrate(build(full_privacy(budget)), declaration, budget,
                           row.sensitivity).key_privacy)


def selection_plan(mechanism, args, delta: float, tau: Optional[float] = None) -> dict:
    """Private key selection with `mechanism` (docs/selection.md): its threshold tau for
    `delta` (or the job's own `tau`), in value units, and for each rate (value units per
    step; default four rates from tau) the step by which a key growing at that rate is
    selected with probability >= 1/2 (None: not within the horizon)."""
    m, bound = args.max_keys_per_unit, args.interval_bound
    if tau is None:
        tau = selection_threshold(mechanism, m, bound, delta)
    scale = args.value_resolution or 1.0
    rates = args.rate or [float(f"{tau * scale / args.horizon * f:.2g}")
                          for f in (1.5, 3.0, 6.0, 12.0)]
    return {"delta": delta, "max_keys_per_unit": m, "contribution_bound": bound * scale,
            "threshold": tau * scale,
            "delta_spent": selection_delta(mechanism, tau, m, bound),
            "selected_by": [{"rate": rate, "step": expected_selection_step(
                mechanism, tau, rate / scale)} for rate in rates]}


def selection_text(selection: dict) -> str:
    rates = selection["selected_by"]
    cells = [(f"{r['rate']:g}", "never" if r["step"] is None else str(r["step"]))
             for r in rates]
    width = max(len(c) for pair in cells for c in pair) + 2
    return "\n".join([
        f"Key selection (no public keys; docs/selection.md): delta {selection['delta']:g} on "
        f"top of the budget, one unit on at most {selection['max_keys_per_unit']} key(s) with "
        f"a running total of at most {selection['contribution_bound']:g} each",
        f"  threshold {selection['threshold']:g}: a key is published from the first step its "
        f"noisy running total reaches it (delta(threshold) = {selection['delta_spent']:.3g})",
        "  a key whose running total grows by r per step is selected by step s with "
        "probability >= 1/2:",
        "    r per step" + "".join(f"{a:>{width}}" for a, _ in cells),
        "    step s    " + "".join(f"{b:>{width}}" for _, b in cells)])


def row_json(row, budget: int, noise: str, scale: float = 1.0) -> dict:
    """A row as --json prints it: MaxSE and MeanSE in value units (times a sum's grid), the
    sensitivity in the declaration's units, the state as the table shows it (`state_bytes`, and
    `state`: the column's text without the budget mark, `over_budget`)."""
    data = row.row()
    data.update(max_se=row.max_se * scale, mean_se=row.mean_se * scale,
                state=state_text(row, noise), over_budget=row.state_bytes > budget)
    return data


def stream_json(plan: StreamPlan) -> dict:
    args = plan.args
    budget = args.max_state_bytes_per_key
    return {"horizon": args.horizon, "privacy": plan.privacy,
            "max_contributions": args.max_contributions,
            "max_keys_per_unit": args.max_keys_per_unit,
            "interval_bound": args.interval_bound, "metric": args.metric,
            "max_state_bytes_per_key": budget, "value_resolution": args.value_resolution,
            "rows": [row_json(r, budget, args.noise, plan.scale) for r in plan.shown()],
            "recommended": row_json(plan.best, budget, args.noise, plan.scale),
            **({"selection": plan.selection} if plan.selection is not None else {})}


def stream_text(plan: StreamPlan) -> str:
    args, scale = plan.args, plan.scale
    budget = args.max_state_bytes_per_key
    spent = ", ".join(f"{k}={v}" for k, v in plan.privacy.items())
    keys = ("" if args.max_keys_per_unit == 1 else
            f", on at most {args.max_keys_per_unit} keys ("
            + ("budget split over them" if args.split else
               "k caps the total over them: joint calibration") + ")")
    g = args.value_resolution
    grid = ("" if g is None else
            f"; a sum on the value grid g = {g:g}: D and k in grid units (k g = "
            f"{args.max_contributions * g:g}), MaxSE and MeanSE in value units (times g), the "
            f"sensitivity in grid units")
    lines = [f"T = {args.horizon}, {spent}, one unit changes a key's difference stream by a "
             f"vector of S_(D={args.interval_bound}, k={args.max_contributions}){keys}{grid}; "
             f"sorted by {plan.key}:", "",
             f"{'mechanism':<20}{'params':<26}{'MaxSE':>11}{'MeanSE':>11}{'sensitivity':>13}"
             f"  state"]
    rows = plan.shown()
    for r in rows:
        params = params_text(r.params, skip=("prune",))
        lines.append(f"{r.mechanism:<20}{params:<26}{r.max_se * scale:>11.3f}"
                     f"{r.mean_se * scale:>11.3f}{r.sensitivity:>13.4f}  "
                     f"{state_cell(r, budget, args.noise)}")
    best = plan.best
    shown = params_text(best.params)
    lines += ["", f"Recommended ({args.metric} error): {best.mechanism}"
              + (f" {shown}" if shown else "")
              + f" (MaxSE {best.max_se * scale:.3f}, MeanSE {best.mean_se * scale:.3f})"]
    over = sorted({r.mechanism for r in rows if r.state_bytes > budget})
    if over:
        lines.append(f"Not recommended, over the per-key state budget of {budget:,} B "
                     f"(--max-state-bytes-per-key): {', '.join(over)}")
    if plan.selection is not None:
        lines += ["", selection_text(plan.selection)]
    return "\n".join(lines)


# ----- a ContinualMean: its split and both parts -----------------------------------------------
@dataclasses.dataclass
class MeanPlan:
    """A mean's split and each part's table (`StreamPlan`, the sum part in value units)."""
    args: argparse.Namespace
    privacy: dict
    split: dict
    parts: dict

    def times_count(self) -> float:
        """`se_times_count` of the recommended parts."""
        return se_times_count(self.parts["sum"].best.max_se * self.parts["sum"].scale,
                              self.parts["count"].best.max_se, self.args.mean_max_value)


def se_times_count(sum_se: float, count_se: float, max_value: float) -> float:
    """The mean's standard error times a key's count C at the worst-case mean V (delta method:
    sqrt(Vs + V^2 Vc)), of the parts' MaxSE (the sum's in value units)."""
    return math.sqrt(sum_se ** 2 + max_value ** 2 * count_se ** 2)


def plan_mean(args, privacy: dict) -> MeanPlan:
    split = mean_parts(args, privacy)
    parts = {}
    for part, (part_args, part_privacy) in split["parts"].items():
        part_args.value_resolution = split["grid"] if part == "sum" else None
        part_args.top = args.top
        parts[part] = StreamPlan(part_args, part_privacy, *calibrated_rows(part_args,
                                                                           part_privacy))
    return MeanPlan(args, privacy, split, parts)


def mean_json(plan: MeanPlan) -> dict:
    args, split = plan.args, plan.split
    return {"horizon": args.horizon, "privacy": plan.privacy, "transform": "mean",
            "max_contributions": args.max_contributions, "max_value": args.mean_max_value,
            "value_resolution": split["grid"], "sum_share": split["sum_share"],
            "split": split["split"],
            "parts": {part: {"privacy": split["parts"][part][1],
                             "recommended": row_json(p.best, p.args.max_state_bytes_per_key,
                                                     p.args.noise, p.scale)}
                      for part, p in plan.parts.items()},
            "mean_se_times_count": plan.times_count()}


def mean_text(plan: MeanPlan) -> str:
    args, split = plan.args, plan.split
    value = args.mean_max_value
    spent = ", ".join(f"{k}={v}" for k, v in plan.privacy.items())
    lines = [f"ContinualMean, T = {args.horizon}, {spent}, at most {args.max_contributions} "
             f"events per unit, values clamped to [0, {value:g}]"
             + (f" on a grid of {split['grid']:g}" if split["grid"] else "") + ":",
             f"  budget split: sum part {split['sum_share']:.4g}, count part "
             f"{1 - split['sum_share']:.4g} ({split['split']})"]
    for part, p in plan.parts.items():
        row = p.best
        unit = " (values)" if part == "sum" else ""
        budget = ", ".join(f"{k}={v:g}" for k, v in split["parts"][part][1].items())
        lines.append(f"  {part} part at {budget}: {row.mechanism} {params_text(row.params)}, "
                     f"MaxSE {row.max_se * p.scale:.3f}{unit}")
    times_count = plan.times_count()
    lines.append(f"  the mean's standard error at the worst-case mean {value:g}: about "
                 f"{times_count:.3f} / C for a key whose count is C (delta method)")
    return "\n".join(lines)


def state_text(row, noise: str) -> str:
    """One key's sealed state as the `state` column shows it: bytes, and what else the
    mechanism holds."""
    note = memory_note(row.mechanism, noise)
    return f"{row.state_bytes:,} B" + (f" ({note})" if note else "")


def state_cell(row, budget: int, noise: str) -> str:
    """The `state` column: bytes per key, what else the mechanism holds, and the budget mark."""
    text = state_text(row, noise)
    return text + (f"  OVER the {budget:,} B budget" if row.state_bytes > budget else "")


def params_text(params: dict, skip=()) -> str:
    """A mechanism's parameters as the configs write them: k=13,sparsify=True (a list, BLT's
    decays, left out)."""
    return ",".join(f"{k}={v}" for k, v in params.items()
                    if k not in skip and not isinstance(v, list))


def plan_of(args):
    """The plan of the given options: a `MeanPlan` with --mean-max-value, else a
    `StreamPlan`."""
    with_defaults(args)
    privacy = privacy_from(args)
    if args.horizon > 1 << 24:
        raise _UsageError(f"`horizon` must be <= {1 << 24} for planning; got {args.horizon}.")
    if args.rate and args.selection_delta is None:
        raise _UsageError(f"`rate` must come with --selection-delta; got --rate "
                          f"{args.rate[0]:g} without it.")
    if args.mean_max_value is not None:
        if args.selection_delta is not None:
            raise _UsageError(f"`selection-delta` must be left out with --mean-max-value (a "
                              f"mean needs public keys); got {args.selection_delta:g}.")
        return plan_mean(args, privacy)
    return plan_stream(args, privacy)


# ----- --config: the job's own streams ---------------------------------------------------------


def job_transform(path: str):
    """(the job, its transform) as `pipelines.run` builds it, with zero noise and no secret
    (`pipelines.report.true_totals` builds it so too): its calibration, bounds and mechanism
    are the job's."""
    import logging

    from pipelines import run as job_run  # Beam: only a config's plan imports it
    job = job_config.load(path)
    job = job.replace(secret=job_config.SecretSpec(insecure=True))
    quiet = logging.getLogger("transforms")  # no release is made: no fixed-seed warning
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return job, job_run.build_transform(job, noise_source=NoNoise())
    finally:
        quiet.setLevel(level)


def own_row(release) -> dict:
    """The row of what `release` (a transform, or a mean's part) runs, from its own mechanism
    with zero noise, for a configured mechanism that is no candidate of the table."""
    mechanism = release.config.build(noise_source=ConstantNoiseSource(0.0))
    return {"mechanism": release.config.mechanism, "params": dict(release.config.params),
            "max_se": mechanism.max_se(), "mean_se": mechanism.mean_se(),
            "sensitivity": mechanism.sensitivity, "calibration": release.calibration.kind,
            "state_bytes": release.state_bytes_per_key}


def runs_row(plan: StreamPlan, name: str, params: dict, chosen: str, release=None) -> dict:
    """The job's row in value units: the table's row of (name, params), or (not a candidate)
    the mechanism `release` runs."""
    row = plan.find(name, params)
    budget, noise = plan.args.max_state_bytes_per_key, plan.args.noise
    if row is not None:
        data = row_json(row, budget, noise, plan.scale)
    elif release is not None:
        data = own_row(release)
        data.update(max_se=data["max_se"] * plan.scale, mean_se=data["mean_se"] * plan.scale,
                    over_budget=data["state_bytes"] > budget,
                    state=f"{data['state_bytes']:,} B")
    else:
        raise _UsageError(f"`mechanism` must be a candidate of the plan; got {name} {params}.")
    data["chosen"] = chosen
    return data


def plan_config(args) -> dict:
    """--config: each stream the job releases, planned with its `plan_arguments`, and the
    row of the mechanism the job runs (`runs`, in value units: MaxSE is the job's)."""
    from pipelines import gate as input_gate  # Beam: only a config's plan imports it
    given = [name for name in CONFIG_SETS if getattr(args, name) not in (None, False)]
    if given:
        raise _UsageError("`config` must be given without " + ", ".join(
            "--" + name.replace("_", "-") for name in given) + " (the config sets them; only "
            "--top and --json go with it); got " + " ".join(
            "--" + name.replace("_", "-") for name in given) + ".")
    job, transform = job_transform(args.config)
    chosen = "auto" if job.mechanism.name == "auto" else "configured"
    names, params = transform.resolved_mechanism
    streams = []
    for label, descriptor in transform.plan_declarations():
        arguments = plan_arguments(descriptor, job.mechanism.max_state_bytes_per_key)
        stream_args = parser().parse_args(arguments + (["--top", str(args.top)]
                                                       if args.top else []))
        plan = plan_of(stream_args)
        if isinstance(plan, MeanPlan):
            rows = {part: runs_row(p, names[part], params[part], chosen,
                                   getattr(transform, "parts", {}).get(part))
                    for part, p in plan.parts.items()}
            runs = {"parts": rows, "chosen": chosen, "se_times_count": se_times_count(
                rows["sum"]["max_se"], rows["count"]["max_se"], plan.args.mean_max_value)}
        else:
            runs = runs_row(plan, names, params, chosen, transform if not label else None)
            if getattr(transform, "selects", False):  # the job's own mechanism and tau
                plan.selection = selection_plan(
                    transform.config.build(noise_source=ConstantNoiseSource(0.0)),
                    plan.args, transform.selection["delta"], transform.selection["threshold"])
        streams.append({"label": label, "command": " ".join([COMMAND, *arguments]),
                        "plan": plan, "runs": runs})
    return {"config": args.config, "job": job.job, "transform": job.transform,
            "mechanism": job.mechanism.name if chosen == "auto" else
            {"name": job.mechanism.name, "params": job.mechanism.params},
            "streams": streams, "gate": input_gate.plan_of(job, transform)}


def config_json(planned: dict) -> dict:
    streams = []
    for stream in planned["streams"]:
        plan = stream["plan"]
        body = mean_json(plan) if isinstance(plan, MeanPlan) else stream_json(plan)
        streams.append({"label": stream["label"], "command": stream["command"], **body,
                        "runs": stream["runs"]})
    return dict(planned, streams=streams)


def _runs_text(runs: dict, scale_note: str) -> str:
    shown = params_text(runs["params"])
    why = "auto's pick: the recommendation" if runs["chosen"] == "auto" else "configured"
    return (f"{runs['mechanism']}" + (f" {shown}" if shown else "")
            + f" ({why}): MaxSE {runs['max_se']:.3f}, MeanSE {runs['mean_se']:.3f}"
            f"{scale_note}, {runs['state_bytes']:,} B of state per key")


def config_text(planned: dict) -> str:
    from pipelines import gate as input_gate  # Beam: only a config's plan imports it
    mechanism = planned["mechanism"]
    configured = mechanism if mechanism == "auto" else (
        mechanism["name"] + (f" {json.dumps(mechanism['params'], sort_keys=True)}"
                             if mechanism["params"] else ""))
    out = [f"job {planned['job']} ({planned['config']}): {planned['transform']}, mechanism "
           f"{configured}", input_gate.plan_text(planned.get("gate"))]
    for stream in planned["streams"]:
        plan, runs = stream["plan"], stream["runs"]
        label = f"{stream['label']}: " if stream["label"] else ""
        out += [f"{label}the job's plan command (the same table): {stream['command']}", ""]
        if isinstance(plan, MeanPlan):
            out.append(mean_text(plan))
            parts = runs["parts"]
            grid = plan.split["grid"]
            out += ["", "The job runs (its summary prints these MaxSE and the mean's error):"]
            out += [f"  {part} part: " + _runs_text(row, "" if part == "count" else (
                " in value units" + (f" (grid g = {grid:g})" if grid else "")))
                for part, row in parts.items()]
            out.append(f"  the mean's standard error about {runs['se_times_count']:.3f} / C for "
                       f"a key whose count is C")
            if runs["chosen"] == "configured":
                out.append("auto would pick each part's recommendation above")
            continue
        out.append(stream_text(plan))
        grid = plan.args.value_resolution
        note = f" in value units (grid g = {grid:g})" if grid is not None else ""
        out += ["", f"The job runs {_runs_text(runs, note)} (its summary prints this MaxSE)"]
        if runs["chosen"] == "configured":
            best = plan.best
            out.append(f"auto would pick {best.mechanism} {params_text(best.params)} (MaxSE "
                       f"{best.max_se * plan.scale:.3f})")
    return "\n".join(out)


def main(argv=None) -> int:
    try:
        args = parser().parse_args(argv)
        if args.config is not None:
            planned = plan_config(args)
            text = (json.dumps(config_json(planned), indent=2) if args.json
                    else config_text(planned))
        else:
            plan = plan_of(args)
            if isinstance(plan, MeanPlan):
                text = json.dumps(mean_json(plan), indent=2) if args.json else mean_text(plan)
            else:
                text = (json.dumps(stream_json(plan), indent=2) if args.json
                        else stream_text(plan))
    except (_UsageError, ValueError) as error:
        message = str(error)
        print(f"error: {message if message.endswith('.') else message + '.'}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

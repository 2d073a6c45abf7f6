"""The planner, Beam-free: a stream's candidate mechanisms calibrated as a release with these
bounds would be, their exact errors and state, key selection's threshold, a mean's parts
(`pipelines.plan` is its command line; `pipelines.plan_config` plans a job's own streams).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Optional

from transforms.accountant import gate_budget, part_kwargs, share_budget
from transforms.calibration import (SPLIT, calibrate, choose_calibrated, full_privacy,
                                    split_privacy)
from transforms.mechanisms import ConstantNoiseSource, make
from transforms.mechanisms.choose import (DEFAULT_MAX_STATE_BYTES_PER_KEY,
                                           MIN_STATE_BYTES_PER_KEY, memory_note)
from transforms.mechanisms.privacy import PrivacyBudget
from transforms.mechanisms.ratio import best_split
from transforms.mechanisms.selection import (expected_selection_step, selection_delta,
                                             selection_threshold)
from transforms.streams.count import ContributionBounds, magnitude, value_resolution
from transforms.streams.mean import SUM, MeanProblem
from transforms.streams.records import Declaration


class UsageError(Exception):
    pass


DEFAULTS = {"max_contributions": 1, "max_keys_per_unit": 1, "metric": "max",
            "noise": "discrete", "max_state_bytes_per_key": DEFAULT_MAX_STATE_BYTES_PER_KEY}


def with_defaults(args):
    """`args` with the defaults of the options left out (they are None when parsed, so that
    `--config` can tell what was given)."""
    if args.horizon is None:
        raise UsageError("`horizon` must be given (or --config job.yaml); got none.")
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


def no_effect_note(best, rows) -> str:
    """Where the table shows the recommendation's row with an option `either` (no effect at
    this horizon), the recommendation line (which names the value the job runs) says so."""
    merged = [option for row in rows if row.mechanism == best.mechanism
              and all(row.params.get(k) == v for k, v in best.params.items()
                      if k not in ("sparsify", "prune"))
              for option in ("sparsify", "prune") if row.params.get(option) == NO_EFFECT]
    if not merged:
        return ""
    return (f"; {' and '.join(merged)} {'have' if len(merged) > 1 else 'has'} no effect here "
            f"(`{NO_EFFECT}` in the table)")


def privacy_from(args) -> dict:
    if args.rho is not None and (args.epsilon is not None or args.delta is not None):
        raise UsageError("`rho` must be given alone (not with --epsilon or --delta).")
    if args.rho is not None:
        return {"rho": args.rho}
    if args.epsilon is None and args.delta is not None:
        raise UsageError(f"`delta` must come with --epsilon; got --delta {args.delta} alone.")
    if args.epsilon is None:
        raise UsageError("`privacy` must be --epsilon E, --rho R or --epsilon E --delta d; "
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
        raise UsageError(str(error)) from None
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
        raise UsageError(f"`interval-bound` must be left out with --mean-max-value (the mean's "
                          f"parts declare theirs); got {args.interval_bound}.")
    value, least = args.mean_max_value, mean_min_value(args)
    grid = value_resolution(value, args.value_resolution, args.noise, min_value=least or None)
    budget = PrivacyBudget.resolve(**privacy)
    split = best_split(least, value, budget.noise)
    share = split.sum_share if args.sum_share is None else args.sum_share
    budgets = share_budget(budget, {"sum": share, "count": 1.0 - share})
    k = args.max_contributions
    mass = MeanProblem(ContributionBounds(k, None, args.max_keys_per_unit), with_value=True,
                       value_grid=grid, max_value=value, min_value=least or None,
                       part=SUM).declaration.max_contributions
    state = args.max_state_bytes_per_key // 2  # a key's two states share the budget
    if state < MIN_STATE_BYTES_PER_KEY:
        raise UsageError(f"`max-state-bytes-per-key` must be >= {2 * MIN_STATE_BYTES_PER_KEY} "
                          f"for a mean (a key holds one state per part); got "
                          f"{args.max_state_bytes_per_key}.")
    parts = {"sum": (with_changes(args, max_contributions=mass, interval_bound=mass,
                           max_state_bytes_per_key=state), part_kwargs(budgets["sum"])),
             "count": (with_changes(args, interval_bound=k, max_state_bytes_per_key=state),
                       part_kwargs(budgets["count"]))}
    return {"parts": parts, "sum_share": share, "grid": grid,
            "split": "configured (--sum-share)" if args.sum_share is not None else
            f"{split.formula} at m = {split.reference_mean:g} (the worst case)"}


def with_changes(args, **changes):
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
        raise UsageError("`sum-share` must come with --mean-max-value; got it without it.")
    if getattr(args, "mean_min_value", None) is not None:
        raise UsageError(f"`mean-min-value` must come with --mean-max-value; got "
                          f"{args.mean_min_value:g} without it.")
    if args.value_resolution is not None and args.noise == "float":
        raise UsageError(f"`value-resolution` must be left out with --noise float unless "
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
              + f" (MaxSE {best.max_se * scale:.3f}, MeanSE {best.mean_se * scale:.3f})"
              + no_effect_note(best, rows)]
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
                              self.parts["count"].best.max_se, mean_magnitude(self.args))


def mean_min_value(args) -> float:
    """--mean-min-value (0 when not given), checked below --mean-max-value."""
    least = getattr(args, "mean_min_value", None) or 0.0
    if not least < args.mean_max_value:
        raise UsageError(f"`mean-min-value` must be below --mean-max-value "
                          f"({args.mean_max_value:g}); got {least:g}.")
    return least


def mean_magnitude(args) -> float:
    """The worst-case |mean| of a planned mean: max(|L|, V)."""
    return magnitude(args.mean_max_value, mean_min_value(args))


def se_times_count(sum_se: float, count_se: float, max_value: float) -> float:
    """The mean's standard error times a key's count C at the worst-case mean M = max(|L|, V)
    (delta method: sqrt(Vs + M^2 Vc)), of the parts' MaxSE (the sum's in value units)."""
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
            "min_value": mean_min_value(args),
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
             f"events per unit, values clamped to [{mean_min_value(args):g}, {value:g}]"
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
    lines.append(f"  the mean's standard error at the worst-case mean {mean_magnitude(args):g}: "
                 f"about {times_count:.3f} / C for a key whose count is C (delta method)")
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
        raise UsageError(f"`horizon` must be <= {1 << 24} for planning; got {args.horizon}.")
    if args.rate and args.selection_delta is None:
        raise UsageError(f"`rate` must come with --selection-delta; got --rate "
                          f"{args.rate[0]:g} without it.")
    if args.mean_max_value is not None:
        if args.selection_delta is not None:
            raise UsageError(f"`selection-delta` must be left out with --mean-max-value (a "
                              f"mean needs public keys); got {args.selection_delta:g}.")
        return plan_mean(args, privacy)
    return plan_stream(args, privacy)

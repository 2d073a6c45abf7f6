"""`plan --unbounded --at t1,t2,...`: what a release with no horizon costs at the steps an
operator cares about. For each step t it prints the standard deviation at step t of the
horizon-free mechanism (`log_sqrt_toeplitz`, calibrated as the release would calibrate it: the
same bounds, keys per unit and noise) beside the MaxSE of the best mechanism for a horizon T = t
known in advance (the plan's recommendation at T = t), and their ratio; under float noise also
the hybrid mechanism's stddev at t (Chan, Shi and Song 2011, the classic reduction).

    python3 -m pipelines.plan --unbounded --at 24,168,8760 --rho 0.5 [bounds ...]
"""
from __future__ import annotations

import math
import types

from pipelines.planning import (UsageError, key_mechanism, plan_stream, with_changes,
                                with_defaults)
from transforms.calibration import JOINT, SPLIT
from transforms.mechanisms import MECHANISMS, PrivacyBudget, make
from transforms.mechanisms.choose import state_bytes_per_key
from transforms.mechanisms.privacy import LAPLACE

UNBOUNDED = "log_sqrt_toeplitz"
BASELINE = "hybrid"  # Chan, Shi and Song's reduction, shown beside it under float noise

MAX_STEP = 1 << 20  # the discrete release's limit (`SqrtToeplitz`)


def steps_at(text: str) -> list:
    """'24,168,8760' -> [24, 168, 8760] (distinct, ascending, each in [1, 2^20])."""
    try:
        steps = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        steps = []
    if not steps or steps[0] < 1 or steps[-1] > MAX_STEP:
        raise UsageError(f"`at` must be steps t, comma-separated integers in [1, {MAX_STEP}]; "
                         f"got {text!r}.")
    return steps


def unbounded_plan(args, privacy: dict, steps: list) -> list:
    """Per step t: {"step", "stddev" (horizon-free, at t), "state_bytes" (its sealed per-key
    state at t), "known" (the recommendation for T = t: mechanism, params, max_se), "ratio"};
    values in the job's units."""
    if PrivacyBudget.resolve(**privacy).noise == LAPLACE or MECHANISMS[UNBOUNDED].pure_dp:
        raise UsageError(f"`unbounded` must come with --rho, or --epsilon and --delta ("
                         f"{UNBOUNDED} has no pure-DP calibration); got "
                         f"{', '.join(f'--{k} {v:g}' for k, v in privacy.items())}.")
    args.horizon = args.horizon or steps[-1]
    with_defaults(args)
    scale = args.value_resolution or 1.0
    # one mechanism for the largest step: the horizon-free one's first t steps are the same
    # for every horizon (its variance too), so one build serves every t
    longest = with_changes(args, horizon=steps[-1])
    if longest.interval_bound is None:
        longest.interval_bound = longest.max_contributions

    def variance_of(name):  # per step, as the release would calibrate `name` for one key
        probe = make(name, steps[-1], **privacy, max_contributions=longest.max_contributions,
                     interval_bound=longest.interval_bound, noise=args.noise, seed=0)
        row = types.SimpleNamespace(mechanism=name, params={},
                                    calibration=SPLIT if args.split else JOINT,
                                    sensitivity=probe.sensitivity)
        return key_mechanism(longest, privacy, row).noise_variance()

    variance = variance_of(UNBOUNDED)
    # the hybrid mechanism (Gaussian float noise only): the baseline
    baseline = variance_of(BASELINE) if args.noise == "float" else None
    out = []
    for t in steps:
        known = plan_stream(with_changes(args, horizon=t, interval_bound=args.interval_bound),
                            privacy).best
        stddev = math.sqrt(float(variance[t - 1])) * scale
        out.append({"step": t, "stddev": stddev,
                    "state_bytes": state_bytes_per_key(UNBOUNDED, t, args.noise, t),
                    "known": {"mechanism": known.mechanism, "params": dict(known.params),
                              "max_se": known.max_se * scale},
                    "ratio": stddev / (known.max_se * scale) if known.max_se else math.inf})
        if baseline is not None:
            out[-1][BASELINE] = math.sqrt(float(baseline[t - 1])) * scale
    return out


def unbounded_text(rows: list, privacy: dict) -> str:
    spent = ", ".join(f"{k}={v}" for k, v in privacy.items())
    lines = [f"With no horizon ({UNBOUNDED}, {spent}): its stddev at step t beside the best "
             f"MaxSE for a horizon T = t known in advance:", "",
             f"{'step t':>10}{'stddev at t':>14}{'state at t':>13}{'known T = t':>14}  "
             f"{'(mechanism)':<22}{'ratio':>7}"]
    hybrid = bool(rows) and BASELINE in rows[0]
    if hybrid:
        lines[-1] += f"{BASELINE:>10}"
    for row in rows:
        known = row["known"]
        lines.append(f"{row['step']:>10}{row['stddev']:>14.3f}{row['state_bytes']:>11,} B"
                     f"{known['max_se']:>14.3f}  {known['mechanism']:<22}{row['ratio']:>7.2f}"
                     + (f"{row[BASELINE]:>10.3f}" if hybrid else ""))
    lines += ["", "State: one key's, sealed (discrete noise keeps the input history, 16 B per "
                  "step; float noise 33 B). The known-T column respects "
                  "--max-state-bytes-per-key; the horizon-free column does not."]
    if hybrid:
        lines.append(f"{BASELINE}: Chan, Shi and Song's mechanism for streams of unknown length "
                     f"(its stddev at t), the classic answer.")
    return "\n".join(lines)

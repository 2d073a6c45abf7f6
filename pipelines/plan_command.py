"""The `pipelines.plan` command of a released stream, from its descriptor: the one rule behind
the command a job prints (`pipelines.run.plan_command`) and `plan --config` (`pipelines.plan`).
A module of its own, so that `run` and `plan` need not import each other."""
from __future__ import annotations

from transforms.mechanisms.choose import DEFAULT_MAX_STATE_BYTES_PER_KEY
from transforms.steps import UNBOUNDED, UNBOUNDED_STEPS

_AT_SECONDS = (86400.0, 7 * 86400.0, 365 * 86400.0)  # with no horizon: a day, a week, a year


def _number(value) -> str:
    """A number as a plan command writes it: %g when that is exact, else all its digits."""
    short = f"{value:g}"
    return short if float(short) == float(value) else repr(float(value))


def noise_kind(descriptor: dict) -> str:
    """The `noise=` a release was built with ("discrete" or "float"), from its descriptor's
    noise law."""
    return "float" if descriptor["noise"] in ("laplace", "gaussian") else "discrete"


def horizon_arguments(descriptor: dict) -> list:
    """--horizon T; with no horizon, --unbounded --at the steps a day, a week and a year
    after the origin (`pipelines.plan_unbounded`)."""
    if descriptor["horizon"] != UNBOUNDED:
        return ["--horizon", str(descriptor["horizon"])]
    size = descriptor["step_seconds"]
    at = sorted({min(max(1, round(s / size)), UNBOUNDED_STEPS) for s in _AT_SECONDS})
    return ["--unbounded", "--at", ",".join(map(str, at))]


def plan_arguments(descriptor: dict, max_state_bytes_per_key: int = None) -> list:
    """The `pipelines.plan` arguments that plan one released stream as the release calibrated
    it, from its descriptor (the state budget is not in the descriptor: pass it when it is not
    the default). The job's printed plan command (`pipelines.run.plan_command`) and
    `plan --config` both use these."""
    total = descriptor["budget"]
    if total.get("delta") is not None:
        budget = ["--epsilon", _number(total["epsilon"]), "--delta", _number(total["delta"])]
    elif total.get("epsilon") is not None:
        budget = ["--epsilon", _number(total["epsilon"])]
    else:
        budget = ["--rho", _number(total["rho"])]
    state = (["--max-state-bytes-per-key", str(max_state_bytes_per_key)]
             if max_state_bytes_per_key not in (None, DEFAULT_MAX_STATE_BYTES_PER_KEY) else [])
    noise = ["--noise", "float"] if noise_kind(descriptor) == "float" else []
    if "parts" in descriptor:  # a mean: its split and both parts' tables
        bounds = descriptor["bounds"]
        grid = bounds.get("value_resolution")
        least = bounds.get("min_value", 0.0)
        default_grid = None if noise else max(bounds["max_value"], abs(least)) / 100.0
        return (horizon_arguments(descriptor) + [*budget,
                 "--max-contributions", str(bounds["max_contributions"]),
                 "--mean-max-value", _number(bounds["max_value"])]
                + (["--mean-min-value", _number(least)] if least else [])
                + (["--max-keys-per-unit", str(bounds["max_keys_per_unit"])]
                   if bounds["max_keys_per_unit"] > 1 else [])
                + (["--value-resolution", _number(grid)] if grid != default_grid else [])
                + (["--sum-share", _number(descriptor["sum_share"])]
                   if descriptor.get("split") == "configured" else []) + noise + state
                # a mean's budget is its whole one: the input gate's share comes off it
                + (["--gate-share", _number(descriptor["gate"]["share"])]
                   if descriptor.get("gate") else []))
    declaration = descriptor["declaration"]
    keys = declaration["keys_per_unit"]
    scale = descriptor.get("value_scale", 1.0)
    return (horizon_arguments(descriptor) + [*budget,
             "--max-contributions", str(declaration["max_contributions"]),
             "--interval-bound", str(declaration["interval_bound"])]
            + (["--max-keys-per-unit", str(keys)] if keys > 1 else [])
            + (["--split"] if keys > 1 and declaration.get("joint_mass") is None else [])
            + (["--value-resolution", _number(scale)] if scale != 1.0 else [])
            + noise + state
            + (["--selection-delta", _number(descriptor["selection"]["delta"])]
               if descriptor.get("selection") else []))


COMMAND = "python3 -m pipelines.plan"

"""The operator summary of a run: exact counts of the data for the operator only (NOT private:
never published): events that entered truncation, what each bound cut, values clamped, keys
dropped, dead letters by reason, and the warnings they call for (`pipelines.run` prints it and
writes it to the operator folder's summary.json).
"""
from __future__ import annotations

import math
from typing import Optional

from pipelines import commit
from transforms import registry
from transforms.assign import CLAMPED
from transforms.messages import KEY_INPUT, KEY_KEPT
from transforms.streams.records import label


def operator_summary(result, operator_folder: str, job=None, config_path: str = None) -> dict:
    """Exact counts of the data for the operator (NOT private: never publish them): events
    that entered truncation, what each bound cut, and dead letters by reason; with `job` (and
    the `config_path` it was loaded from), `truncation_warning` when the bounds cut more than
    half the events (`truncation_warning`)."""
    counters, measured = {}, False
    try:
        for counter in result.metrics().query()["counters"]:
            if counter.key.metric.namespace == "continual_release":
                name = counter.key.metric.name
                # Spark's portable runner reports attempted counts only (no bundle retried
                # locally; on a cluster a retried bundle may count twice)
                value = counter.committed if counter.committed is not None else \
                    counter.attempted
                counters[name] = counters.get(name, 0) + int(value or 0)
        measured = True
    except (AttributeError, NotImplementedError, KeyError):  # a runner without metrics
        pass
    summary = {"events_in_window": counters.get("events_in_window", 0 if measured else None),
               "truncated": {k[len("truncated_by_"):]: v for k, v in counters.items()
                             if k.startswith("truncated_by_")},
               "dropped_non_public_keys": counters.get("dropped_non_public_keys", 0),
               "kept_public_keys": counters.get("kept_public_keys", 0),
               **({"keys_with_data": counters["selection_keys_with_data"],
                   "keys_selected": counters.get("selection_keys_published", 0)}
                  if "selection_keys_with_data" in counters else {}),
               **commit.dead_letters_by_code(operator_folder)}
    worst = worst_keys(counters)
    if worst is not None:  # public keys' input and kept amounts: the most cut first
        summary["worst_keys"] = worst
    if any(name in counters for name in CLAMPED):  # a sum's or mean's values, clamped
        summary["clamped"] = {name: counters.get(name, 0) for name in CLAMPED}
    if "gate_units" in counters:  # units the input gate counted (one vote each)
        summary["units"] = counters["gate_units"]
    if job is not None:
        summary["truncation_warning"] = truncation_warning(summary, job, config_path)
        summary["keys_warning"] = keys_warning(summary)
        summary["horizon_warning"] = horizon_warning(summary, job)
        summary["delta_note"] = delta_note(summary, job)
    return summary


WORST_KEYS = 5  # keys the summary lists, the largest share of their input cut first


def worst_keys(counters: dict) -> Optional[list]:
    """The public keys whose input truncation cut most, as a share (`messages.count_keys`: in
    events, or grid units of value for a sum or mean), worst first; None when the run counted
    none (no diagnostics, keys selected privately, signed or float-noise values)."""
    given = {name[len(KEY_INPUT):]: n for name, n in counters.items()
             if name.startswith(KEY_INPUT)}
    if not given:
        return None
    rows = []
    for key, amount in given.items():
        kept = counters.get(KEY_KEPT + key, 0)
        if amount and kept < amount:
            rows.append({"key": key, "input": amount, "kept": kept,
                         "share_cut": round(1.0 - kept / amount, 4)})
    rows.sort(key=lambda row: (-row["share_cut"], row["key"]))
    return rows[:WORST_KEYS]


def delta_note(summary: dict, job) -> Optional[str]:
    """delta beside 1 / units (operator-only: the number of units is the data's): a delta near
    1 / n lets the guarantee fail for about one of n people outright."""
    delta = job.privacy.delta if job.privacy.delta is not None else job.privacy.selection_delta
    units = summary.get("units")
    if delta is None or not units:
        return None
    return (f"operator-only (NOT private): delta {delta:g} beside 1 / units = 1 / {units} = "
            f"{1.0 / units:.2g}" + (" (WARNING: delta should be far below 1 / units)"
                                     if delta * units > 0.1 else ""))


def horizon_warning(summary: dict, job) -> Optional[str]:
    """One line when events fall outside the horizon and none in it (operator-only: exact
    counts): a mistyped steps.origin or a timestamp format that reads the times wrong leaves
    a release of noise (a source that also holds history beyond the horizon has some in it)."""
    outside = summary.get("dead_letters", {}).get("outside_horizon", 0)
    inside = summary.get("events_in_window")
    if not outside or inside != 0:
        return None
    steps = job.steps.time_steps()
    return (f"WARNING (operator-only, NOT private): {outside} events fall outside the horizon "
            f"[{steps.iso(steps.origin)}, {steps.iso(steps.stop)}), {inside} in it: check "
            f"steps.origin and input.timestamp_format")


def keys_warning(summary: dict):
    """One line when most (key, step) totals with data belong to keys that are not public
    (dropped: the release is mostly noise on keys without data), naming what to check; else
    None (operator-only: exact counts)."""
    dropped = summary.get("dropped_non_public_keys") or 0
    kept = summary.get("kept_public_keys") or 0
    if dropped <= kept:
        return None
    return (f"WARNING (operator-only, NOT private): {dropped} of the {dropped + kept} (key, "
            f"step) totals with data ({100.0 * dropped / (dropped + kept):.1f} %) are of keys "
            f"not in public_keys and were dropped: check input.fields.key and public_keys "
            f"(spelling, case, type)")


def truncation_warning(summary: dict, job, config_path: str = None):
    """One line when the contribution bounds cut more than half the events that entered
    truncation (operator-only: exact counts), naming the share, the bound that cut most and the
    `pipelines.caps` command that shows what other values of it would cut and cost; else
    None."""
    events, truncated = summary.get("events_in_window"), summary.get("truncated") or {}
    cut = sum(truncated.values())
    if not events or cut * 2 <= events:
        return None
    reason = max(sorted(truncated), key=lambda name: truncated[name])
    bound = registry.SPECS[job.transform].cut_by.get(reason, reason)
    value = job.bounds.get(bound)
    if isinstance(value, int) and not isinstance(value, bool):
        # a sum's mass below one full value: try whole values (max_value per event) too
        step = max(value, math.ceil(job.bounds["max_value"])) \
            if bound == "max_contributions" and job.transform == "sum" else value
        tried = sorted({value, *(step * f for f in (1, 2, 4, 8))})
        vary = f" --vary {bound}=" + ",".join(str(v) for v in tried)
    else:
        vary = f" --vary {bound}=V1,V2,..."
    config = config_path or "<the job's config>"
    command = f"python3 -m pipelines.caps --config {config}{vary}"
    if job.transform == "mean":
        command += (" (on a copy of the config with `transform: count`, its value field and "
                    "max_value left out: a mean keeps a count's events)")
    elif not registry.can(job.transform, registry.CAPS):
        command = (f"pipelines.caps (on a {' or '.join(registry.able(registry.CAPS))} "
                   f"config)")
    return (f"WARNING (operator-only, NOT private): the contribution bounds cut "
            f"{100.0 * cut / events:.1f} % of the {events} events that entered truncation "
            f"(most by {bound}: "
            f"{truncated[reason]}); the released totals leave them out, a bias the noise does "
            f"not show: see what other caps would cut and cost with {command}")


def describe(summary: dict, where: str = "in the horizon") -> str:
    """The operator summary's lines after its heading: events and what the bounds cut, the keys
    cut most, values clamped, keys selected, dead letters (one indented line each)."""
    events, truncated, parts = summary["events_in_window"], summary["truncated"], []
    if events is not None:
        cut = sum(truncated.values())
        parts.append(f"{events} events {where}, {cut} ({100.0 * cut / max(events, 1):.1f}"
                     f" %) cut by the contribution bounds"
                     + (f" ({', '.join(f'{k}: {v}' for k, v in truncated.items())})"
                        if truncated else ""))
    worst = summary.get("worst_keys")
    if worst:
        parts.append("keys cut most: " + ", ".join(
            f"{label(row['key'])} {100.0 * row['share_cut']:.1f} % "
            f"({row['input'] - row['kept']} of {row['input']})" for row in worst[:3]))
    clamped = summary.get("clamped")
    if clamped:
        below, above = (clamped.get(name, 0) for name in CLAMPED)
        parts.append(f"{below + above} values clamped ({below} below min_value, {above} "
                     f"above max_value)")
    if "keys_with_data" in summary:  # keys selected privately
        parts.append(f"{summary['keys_with_data']} keys with data (in the release so far), "
                     f"{summary['keys_selected']} of them selected")
    dead, top = summary["dead_letters"], next(iter(summary["dead_letters"]), None)
    shown = "; ".join(f"{k}: {v}" for k, v in list(dead.items())[:4]) + (
        f"; {len(dead) - 4} more codes in summary.json" if len(dead) > 4 else "") + (
        f"; the first {top}: {summary.get('dead_letter_examples', {}).get(top, '')[:120]}")
    parts.append(f"{sum(dead.values())} dead letters" + ("" if where == "in the horizon" else
                 " of the whole input") + (f" ({shown})" if dead else ""))
    return "\n  " + "\n  ".join(parts)  # one part a line, each under 200 characters

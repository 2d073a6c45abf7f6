"""`pipelines.plan --config`: the streams a job releases, each planned with the arguments
its descriptor gives (`plan_command.plan_arguments`), the row of the mechanism the job runs,
and the job's input gate, from the job's release plan (`transforms.release_plan`: Beam-free,
no secret); with a budget, what the release would bring its source's ledger to (read with
the configured secret, nothing recorded).
"""
from __future__ import annotations

import json

from pipelines import budget
from pipelines import config as job_config
from pipelines import gate as input_gate
from pipelines import job_release
from pipelines.planning import (MeanPlan, StreamPlan, UsageError, mean_json, mean_magnitude,
                                mean_text, params_text, plan_of, row_json, se_times_count,
                                selection_plan, stream_json, stream_text)
from pipelines.plan_command import COMMAND, plan_arguments


def job_plan(path: str):
    """(the job, its release plan) as `pipelines.run` would release it: its calibration, bounds
    and mechanism are the job's."""
    job = job_config.load(path)
    return job, job_release.release_plan(job)


def unbounded_arguments(path: str):
    """The `--unbounded --at ...` plan arguments of a job with no horizon (its one stream's
    `plan_arguments`), else None."""
    job, release = job_plan(path)
    if not job.steps.unbounded:
        return None
    return plan_arguments(release.descriptor, job.mechanism.max_state_bytes_per_key)


def own_row(release) -> dict:
    """The row of what `release` (a plan, or a mean's part's) runs, from its own mechanism with
    zero noise, for a configured mechanism that is no candidate of the table."""
    mechanism = release.zero_noise
    return {"mechanism": release.mechanism, "params": dict(release.params),
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
        raise UsageError(f"`mechanism` must be a candidate of the plan; got {name} {params}.")
    data["chosen"] = chosen
    return data


def plan_config(args, parse) -> dict:
    """--config: each stream the job releases, planned with its `plan_arguments` (`parse`: the
    command line's parser, `pipelines.plan`), and the row of the mechanism the job runs
    (`runs`, in value units: MaxSE is the job's)."""
    job, release = job_plan(args.config)
    chosen = "auto" if job.mechanism.name == "auto" else "configured"
    names, params = release.resolved_mechanism
    streams = []
    for label, descriptor in release.plan_declarations():
        arguments = plan_arguments(descriptor, job.mechanism.max_state_bytes_per_key)
        stream_args = parse(arguments + (["--top", str(args.top)] if args.top else []))
        plan = plan_of(stream_args)
        if isinstance(plan, MeanPlan):
            rows = {part: runs_row(p, names[part], params[part], chosen,
                                   release.parts.get(part))
                    for part, p in plan.parts.items()}
            runs = {"parts": rows, "chosen": chosen, "se_times_count": se_times_count(
                rows["sum"]["max_se"], rows["count"]["max_se"], mean_magnitude(plan.args))}
        else:
            runs = runs_row(plan, names, params, chosen, release if not label else None)
            if release.selects:  # the job's own mechanism and tau
                plan.selection = selection_plan(
                    release.zero_noise, plan.args, release.selection["delta"],
                    release.selection["threshold"])
        streams.append({"label": label, "command": " ".join([COMMAND, *arguments]),
                        "plan": plan, "runs": runs})
    return {"config": args.config, "job": job.job, "transform": job.transform,
            "mechanism": job.mechanism.name if chosen == "auto" else
            {"name": job.mechanism.name, "params": job.mechanism.params},
            "streams": streams, "gate": input_gate.plan_of(job, release),
            "budget": budget.preview(job, release.budget_spent, release.selects)}


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
    mechanism = planned["mechanism"]
    configured = mechanism if mechanism == "auto" else (
        mechanism["name"] + (f" {json.dumps(mechanism['params'], sort_keys=True)}"
                             if mechanism["params"] else ""))
    out = [f"job {planned['job']} ({planned['config']}): {planned['transform']}, mechanism "
           f"{configured}", input_gate.plan_text(planned.get("gate"))]
    if planned.get("budget"):
        out.append(budget.preview_text(planned["budget"]))
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

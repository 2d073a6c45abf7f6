"""Choose contribution caps: for each candidate value of a bound, how much of YOUR data the
truncation would cut (bias) next to the noise it buys (MaxSE).

    python3 -m pipelines.caps --config configs/active_users.yaml \
        --vary max_contributions=2,4,6,8,12 [--vary max_contributions_per_step=1,2]
        [--sample-units N] [--json]

NOT PRIVATE: the "cut" columns are exact counts of the input (or of a sample of its units):
an exploration for the operator on data they may look at, never to be published. A cap chosen
by looking at the data is itself data-dependent; use a past period's data, or a public sample,
to choose the caps of a release. The MaxSE column is the release's noise for that cap
(data-independent; what `pipelines.plan` computes for the same budget and bounds).

Every candidate runs the job's own truncation machine (`transforms.streams.units`) on every
sampled unit, so the counts are what the job would cut, by bound.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import itertools
import json
import os
import sys
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import config as job_config
from pipelines import io, logs
from pipelines import job_release
from transforms import registry
from transforms.stages import AssignSteps
from transforms.streams import codec
from transforms.streams.units import advance_unit, sorted_payloads, steps_to_run
from transforms.validation import fail

MAX_CANDIDATES = 64


def parse_vary(given, job: job_config.JobConfig) -> dict:
    """["max_contributions=2,4", ...] -> {bound: [values]} for the job's integer bounds."""
    varied = {}
    for item in given or []:
        name, _, values = item.partition("=")
        bounds = registry.SPECS[job.transform].bounds
        if name not in bounds or name in ("semantics",):
            fail("vary", "NAME=V1,V2,... with NAME one of the transform's bounds ("
                 + ", ".join(b for b in bounds if b != "semantics") + ")", item)
        try:
            parsed = [None if v.strip() == "none" else int(v) for v in values.split(",")]
        except ValueError:
            parsed = None
        if not parsed or any(v is not None and v < 1 for v in parsed):
            fail(f"vary {name}", "a comma-separated list of integers >= 1 (or none)", values)
        varied[name] = parsed
    if not varied:
        fail("vary", "given at least once (e.g. --vary max_contributions=2,4,8)", None)
    return varied


def candidates(job: job_config.JobConfig, varied: dict):
    names = sorted(varied)
    combos = list(itertools.product(*(varied[n] for n in names)))
    if len(combos) > MAX_CANDIDATES:
        fail("vary", f"at most {MAX_CANDIDATES} combinations", len(combos))
    for combo in combos:
        yield dict(job.bounds, **dict(zip(names, combo)))


def unit_histories(job: job_config.JobConfig, plan, sample_units: int) -> list:
    """[(unit, {step: payloads})] of the input (at most `sample_units` units, the ones with the
    smallest keyed hash: a uniform sample that does not depend on bundle order)."""
    folder = tempfile.mkdtemp(prefix="caps-")
    out = os.path.join(folder, "units.jsonl")
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        elements, _ = io.read_elements(pipeline, job)
        problem, steps = plan.truncation.problem, plan.spec.steps
        events = (elements | "Steps" >> AssignSteps(problem, steps)).main
        # (unit, Event) for the horizon's steps
        histories = (events | "ByUnit" >> beam.GroupByKey()
                     | "PerStep" >> beam.MapTuple(lambda unit, evs: (unit, sorted_payloads(evs))))
        # (unit, {step: payloads in the job's order})
        (histories
         | "Sample" >> beam.combiners.Top.Of(sample_units, key=lambda kv: _rank(kv[0]),
                                             reverse=True)
         | "Save" >> beam.Map(_save, out))
    try:
        with open(out, encoding="utf-8") as handle:  # versioned JSON (no pickle)
            return [codec.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []
    finally:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)  # exact data: never left behind


def _rank(unit) -> bytes:
    return hashlib.sha256(repr(unit).encode("utf-8")).digest()


def _save(histories, path):
    with open(path, "w", encoding="utf-8") as handle:
        for history in sorted(histories, key=lambda kv: _rank(kv[0])):
            handle.write(codec.dumps(history) + "\n")


WORST_KEYS = 5  # keys listed per candidate, the largest share cut first


def cut_by(problem, histories) -> dict:
    """Events and, by bound, events the problem's machine drops over the histories; and per
    key, where a key's input and kept amounts measure what was cut exactly
    (`Problem.exact_key_masses`: counts, and sums and means of non-negative values on their
    grid), the share of the key's input (events, or value mass) the contributions leave out,
    the worst keys first (the run's operator summary counts the same)."""
    events, dropped = 0, collections.Counter()
    given, kept = collections.Counter(), collections.Counter()
    per_key = problem.exact_key_masses
    for unit, by_step in histories:
        events += sum(len(p) for p in by_step.values())
        run = advance_unit(problem, unit, problem.init_state(), by_step,
                           steps_to_run(problem, by_step, 0, max(by_step, default=-1) + 1))
        dropped.update(run.dropped)
        if not per_key:
            continue
        for payloads in by_step.values():
            for payload in payloads:
                given[payload[0]] += problem.key_mass(payload)
        for key, _, value in run.contributions:
            kept[key] += value
    shares = sorted(((1.0 - kept[key] / given[key], str(key)) for key in given if given[key]),
                    reverse=True)
    return {"events": events, "cut": dict(dropped),
            "worst_keys": [{"key": key, "share_cut": round(share, 4)}
                           for share, key in shares[:WORST_KEYS] if share > 0]}


def max_se(plan) -> float:
    """The release's largest per-step standard deviation for these bounds (data-free)."""
    return float(max(plan.zero_noise.noise_std())) * plan.truncation.value_scale


def explore(job: job_config.JobConfig, varied: dict, sample_units: int) -> list:
    job = job.replace(secret=job_config.SecretSpec(insecure=True))
    histories = unit_histories(job, job_release.release_plan(job), sample_units)
    rows = []
    for bounds in candidates(job, varied):
        plan = job_release.release_plan(dataclasses.replace(job, bounds=bounds))
        counts = cut_by(plan.truncation.problem, histories)
        rows.append({"bounds": {n: bounds[n] for n in sorted(varied)},
                     "mechanism": plan.mechanism,
                     "max_se": max_se(plan), "units_sampled": len(histories),
                     "events_not_private": counts["events"],
                     "cut_not_private": counts["cut"],
                     "worst_keys_not_private": counts["worst_keys"]})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.caps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the job's YAML config (or demo:<job>)")
    parser.add_argument("--vary", action="append", metavar="BOUND=V1,V2,...",
                        help="a bound of the transform and the values to try (repeatable: "
                             "every combination is tried)")
    parser.add_argument("--sample-units", type=int, default=100_000,
                        help="look at most at this many units (a uniform sample by keyed "
                             "hash; default 100000)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--verbose", action="store_true",
                        help="show Beam's own logs (quiet by default)")
    args = parser.parse_args(argv)
    logs.configure(args.verbose)
    try:
        job = job_config.load(args.config)
        if not registry.can(job.transform, registry.CAPS):
            fail("transform", f"one with contribution caps ("
                              f"{', '.join(registry.able(registry.CAPS))}; a mean's caps are "
                              f"a count's: run caps on its config with `transform: count` and "
                              f"the value field left out)", job.transform)
        if args.sample_units < 1:
            fail("sample-units", "an integer >= 1", args.sample_units)
        varied = parse_vary(args.vary, job)
        io.preflight(job.replace(secret=job_config.SecretSpec(insecure=True)), True)
        rows = explore(job, varied, args.sample_units)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"job": job.job, "not_private": True, "rows": rows}, indent=2))
        return 0
    print(f"job {job.job}: truncation (exact counts of the data: NOT PRIVATE, for the operator "
          f"only) against noise (MaxSE), {rows[0]['units_sampled']} units, "
          f"{rows[0]['events_not_private']} events in the horizon\n")
    labels = [", ".join(f"{k}={v}" for k, v in row["bounds"].items()) for row in rows]
    width = max(len(label) for label in labels) + 2
    print(f"{'bounds':<{width}}{'cut (NOT private)':>18}{'MaxSE':>10}  by bound")
    for bounds, row in zip(labels, rows):
        cut = sum(row["cut_not_private"].values())
        share = 100.0 * cut / max(row["events_not_private"], 1)
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(row["cut_not_private"].items()))
        print(f"{bounds:<{width}}{f'{cut} ({share:.1f} %)':>18}{row['max_se']:>10.2f}  {reasons}")
        worst = ", ".join(f"{k['key']} {100 * k['share_cut']:.1f} %"
                          for k in row["worst_keys_not_private"][:3])
        if worst:
            print(f"{'':<{width}}{'':>18}{'':>10}  worst keys (share of their input cut): "
                  f"{worst}")
    print("\nLarger caps cut less (less bias) and cost more noise; a cap chosen on this data "
          "is data-dependent: choose on past or public data.")
    return 0


if __name__ == "__main__":
    logs.exit_now(main())

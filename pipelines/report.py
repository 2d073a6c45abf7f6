"""Charts and a summary of one release's records.

    python3 -m pipelines.report --input output/active-users --out report/ \
        [--truth-config configs/active_users.yaml]

`--input` is one release: a run's public folder (`output.path/<job>/`), a scheduled release's
folder (`output.path/<job>-scheduled/<release id>/`), the scheduler's state directory (its
committed checkpoints) or a glob of records files. Records of
several releases, or two different values for one (key, step), are refused in one line.

Writes one PNG per key (noisy running total over time with its confidence band; with
--truth-config, also the true running total, recomputed with the same truncation and zero
noise: for demo data only, NOT private) and `summary.md` (release, mechanism, privacy, MaxSE).
Needs matplotlib (`pip install -e ".[report]"`).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import hashlib
import json
import math
import os
import re
import sys
from typing import Dict, List, Optional

import pyarrow.parquet as pq
from pipelines.checkpoints import LEDGER, committed_checkpoints
from transforms.release import key_text
from pipelines import config as job_config
from pipelines import job_release
from pipelines import run as job_run
from transforms.release import NoNoise
from pipelines.plan_command import noise_kind
from transforms.mechanisms import ConstantNoiseSource, make
from pipelines import logs

FORMATS = (".parquet", ".jsonl")   # one format is read when several are present (CSV: untyped)


def records_files(given: str) -> List[str]:
    """The records files of `given` (a folder, a scheduler's state directory, or a glob): of
    one format, Parquet first, then JSON lines (the same records are written in every
    configured format). A state directory gives its committed checkpoints' records."""
    if os.path.isdir(os.path.join(given, "commits")):
        return sorted(path for _, folder in committed_checkpoints(given)
                      for path in glob.glob(os.path.join(folder, "records-*.jsonl")))
    pattern = os.path.join(given, "records-*") if os.path.isdir(given) else given
    names = [p for p in glob.glob(pattern) if not os.path.basename(p).startswith(".")]
    for suffix in FORMATS:
        chosen = sorted(p for p in names if p.endswith(suffix))
        if chosen:
            return chosen
    return []


def read_records(given: str) -> List[dict]:
    files = records_files(given)
    if not files:
        raise ValueError(f"`input` must be a release folder or a glob matching at least one "
                         f"Parquet or JSON lines records file; got {given!r}.")
    rows = []
    for path in files:
        if path.endswith(".parquet"):
            rows.extend(pq.read_table(path).to_pylist())
        else:
            with open(path, encoding="utf-8") as handle:
                rows.extend(json.loads(line) for line in handle if line.strip())
    if not rows:
        raise ValueError(f"`input` must hold at least one record; got {len(files)} empty "
                         f"records file(s) (a release that selects its keys publishes a key "
                         f"only once it is selected: none is yet).")
    return one_release(rows)


def one_release(rows: List[dict]) -> List[dict]:
    """The rows of exactly one release, each (key, step) once (identical copies, e.g. the same
    records in two formats, are merged); anything else is a one-line error."""
    releases = sorted({str(r.get("release_id")) for r in rows})
    if len(releases) != 1:
        shown = ", ".join(releases[:3]) + (", ..." if len(releases) > 3 else "")
        raise ValueError(f"`input` must hold the records of one release; got {len(releases)} "
                         f"releases ({shown}): point --input at one release's folder.")
    unique: Dict[tuple, dict] = {}
    for row in rows:
        seen = unique.setdefault((row["key"], row["step"]), row)
        if seen != row:
            raise ValueError(f"`input` must hold one record per key and step; got two "
                             f"different records for key {row['key']!r}, step {row['step']}.")
    return sorted(unique.values(), key=lambda r: (str(r["key"]), r["step"]))


def release_descriptor(given: str):
    """The release's descriptor next to its records, when there is one: `release.json` of a
    run's public folder (or the folder of a glob), or the ledger of a state directory's last
    committed checkpoint; None when the input carries none."""
    if os.path.isdir(os.path.join(given, "commits")):
        chain = committed_checkpoints(given)
        path = os.path.join(chain[-1][1], LEDGER) if chain else None
    else:
        folder = given if os.path.isdir(given) else os.path.dirname(given)
        path = os.path.join(folder, "release.json")
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle).get("descriptor")


# what a truth config must share with the release it is compared with (the descriptor's fields
# that decide the true totals; the noise and the mechanism do not)
TRUTH_FIELDS = ("transform", "horizon", "origin", "step_seconds", "bounds", "declaration",
                "public_keys")


def check_truth(rows: List[dict], descriptor, plan) -> None:
    """Refuse, in one line, a truth config that is not the release's: another transform,
    horizon, time steps, bounds or keys (from the release's descriptor when the input has one,
    else from what its records say: steps, keys and budget)."""
    mine = plan.descriptor
    if descriptor is not None:
        for field in TRUTH_FIELDS:
            if descriptor.get(field) != mine.get(field):
                raise ValueError(f"`truth-config` must describe the release it is compared "
                                 f"with (its {field}: {descriptor.get(field)!r}); got "
                                 f"{mine.get(field)!r}.")
    last = max(r["step"] for r in rows)
    if last >= plan.spec.steps.horizon:
        raise ValueError(f"`truth-config` must describe the release it is compared with (its "
                         f"records reach step {last}); got a horizon of "
                         f"{plan.spec.steps.horizon}.")
    keys = {str(r["key"]) for r in rows}
    missing = [] if plan.selects else sorted(
        keys - {key_text(k) for k in plan.spec.public_keys})
    if missing:
        raise ValueError(f"`truth-config` must describe the release it is compared with (its "
                         f"keys include {missing[0]!r}); got other public keys.")
    budget = {name: rows[0].get(name) for name in ("epsilon", "delta", "rho")}
    if budget != {name: plan.budget_spent.get(name) for name in budget}:
        raise ValueError(f"`truth-config` must describe the release it is compared with (its "
                         f"budget: {budget}); got {plan.budget_spent}.")


def true_totals(config_path: str, rows: List[dict] = None,
                descriptor=None) -> Dict[str, List[float]]:
    """The job's running totals with the same truncation and zero noise, once the config is
    checked against the release's records `rows` and descriptor (`check_truth`)."""
    import tempfile

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    job = job_config.load(config_path)
    if rows is not None:  # (what the release is: its plan, Beam-free)
        check_truth(rows, descriptor, job_release.release_plan(job))
    folder = tempfile.mkdtemp(prefix="truth-")
    job = job.replace(output=job_config.OutputSpec(folder, ("jsonl",)),
                      secret=job_config.SecretSpec(insecure=True))
    transform = job_run.build_transform(job, noise_source=NoNoise())
    if transform.selects:  # the truth of every key with data, from its first data on
        import dataclasses
        transform.config = dataclasses.replace(transform.config,
                                               selection_threshold=-math.inf)
    try:
        with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
            job_run.build(pipeline, job, transform)
        rows = read_records(os.path.join(folder, job.job, "records-*.jsonl"))
    finally:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)  # exact counts: never left behind
    return _series(rows, "value")


def _series(rows, field) -> Dict[str, List[float]]:
    """{key: its `field` at steps 0, 1, ...}; a key selected privately has records from its
    first step with data on: the true total before it is 0."""
    out: Dict[str, Dict[int, float]] = {}
    for row in rows:
        out.setdefault(row["key"], {})[row["step"]] = row[field]
    return {key: [steps.get(s, 0.0) for s in range(max(steps) + 1)]
            for key, steps in out.items()}


def budget_label(row: dict) -> str:
    return ", ".join(f"{name} = {row[name]:g}" for name in ("epsilon", "delta", "rho")
                     if row.get(name) is not None)


def window_start(row: dict) -> datetime.datetime:
    start = row["window_start"]
    if isinstance(start, datetime.datetime):
        return start if start.tzinfo else start.replace(tzinfo=datetime.timezone.utc)
    return datetime.datetime.fromisoformat(str(start).replace("Z", "+00:00"))


def statistic(row: dict) -> str:
    """What a record's value is: a running mean (ContinualMean's records say so in their
    `mechanism`) or a running total."""
    return "running mean" if str(row.get("mechanism", "")).startswith("mean") else \
        "running total"


def plot(rows, out_dir, truth=None) -> List[str]:
    """One chart per key: time (window start, UTC) on the x-axis, the released running total
    with its confidence band, and (demo data only) the exact truth."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    os.makedirs(out_dir, exist_ok=True)
    by_key: Dict[str, List[dict]] = {}
    for row in rows:
        by_key.setdefault(row["key"], []).append(row)
    paths, names = [], set()
    for key, items in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        items.sort(key=lambda r: r["step"])
        times = [window_start(r) for r in items]
        first = items[0]
        what = statistic(first)
        figure, axis = plt.subplots(figsize=(8, 4), dpi=110)
        axis.fill_between(times, [r["ci_low"] for r in items], [r["ci_high"] for r in items],
                          alpha=0.25, color="tab:blue", step="post",
                          label=f"{first['confidence']:.0%} confidence interval (per step)")
        axis.step(times, [r["value"] for r in items], where="post", color="tab:blue", lw=1.6,
                  label=f"released {what} (noisy, private)")
        if truth and key in truth:
            axis.step(times, [truth[key][r["step"]] for r in items], where="post",
                      color="black", lw=1.2, ls="--",
                      label=f"true {what} after truncation (exact: NOT private)")
        typical_noise = sum(r["stddev"] for r in items) / len(items)
        signal = max(abs(r["value"]) for r in items)
        if signal < 2 * typical_noise:
            axis.text(0.99, 0.02, "the noise dominates this key's signal", ha="right",
                      va="bottom", transform=axis.transAxes, fontsize=8, color="tab:red")
        axis.set_title(f"{key}: {first['mechanism']}, {budget_label(first)}, "
                       f"{'private' if first.get('private', True) else 'NOT private (seeded)'}",
                       fontsize=10)
        axis.set_xlabel("window start (UTC)")
        axis.set_ylabel(what)
        axis.xaxis.set_major_formatter(mdates.ConciseDateFormatter(
            mdates.AutoDateLocator(), tz=datetime.timezone.utc))
        axis.grid(alpha=0.3)
        axis.legend(loc="upper left", fontsize=8)
        figure.tight_layout()
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(key))
        if name in names:  # two keys written alike ("a/b", "a b"): each its own chart
            name += "-" + hashlib.sha256(str(key).encode("utf-8")).hexdigest()[:8]
        names.add(name)
        path = os.path.join(out_dir, name + ".png")
        figure.savefig(path)
        plt.close(figure)
        paths.append(path)
    return paths


def selecting_max_se(descriptor) -> Optional[float]:
    """A release that selects its keys: its MaxSE from its descriptor (the key mechanism as
    `ReleaseConfig.build` makes it, zero noise), since its records start at each key's
    selection step and may miss the noisiest steps; None for other releases."""
    if not descriptor or descriptor.get("public_keys", "") is not None or \
            "selection" not in descriptor:
        return None
    declaration = descriptor["declaration"]
    mechanism = make(descriptor["mechanism"], descriptor["horizon"],
                     **descriptor["key_budget"],
                     max_contributions=declaration["max_contributions"],
                     interval_bound=declaration["interval_bound"],
                     noise_source=ConstantNoiseSource(0.0),
                     noise=noise_kind(descriptor), **descriptor["params"])
    return float(max(mechanism.noise_std())) * descriptor.get("value_scale", 1.0)


def summary(rows, paths, truth=None, max_se=None) -> str:
    first = rows[0]
    privacy = budget_label(first)
    keys = {r["key"] for r in rows}
    steps = sorted({r["step"] for r in rows})
    if max_se is None:  # (a release selecting keys: from its descriptor, `selecting_max_se`)
        max_se = max(r["stddev"] for r in rows)
    lines = ["# Continual release report", "",
             f"- release: `{first.get('release_id', '?')}`; noise: {first.get('noise', '?')}; "
             f"private: {first.get('private', '?')}",
             f"- mechanism: `{first['mechanism']}` {first['mechanism_params']}",
             f"- privacy (whole release): {privacy}",
             f"- keys: {len(keys)}; steps: {len(steps)} ({steps[0]} .. {steps[-1]}, windows "
             f"from {window_start(rows[0]).isoformat()} on)",
             (f"- MaxSE (largest per-step noise standard deviation): {max_se:.3f}"
              if statistic(first) == "running total" else
              f"- largest standard error of a record's mean: {max_se:.3f} (a record whose "
              f"noisy count is too small to pin the mean down carries half the value range)"),
             f"- confidence level of the bands: {first['confidence']:.0%}"]
    if truth:
        inside = sum(1 for r in rows if r["key"] in truth and
                     r["ci_low"] <= truth[r["key"]][r["step"]] <= r["ci_high"])
        lines.append(f"- true value inside the interval: {inside} of {len(rows)} records "
                     f"({inside / len(rows):.1%}). NOT PRIVATE: the truth is exact (for demo "
                     f"data; never publish this report for real data)")
    lines += ["", "| key | chart |", "|---|---|"]
    lines += [f"| {os.path.splitext(os.path.basename(p))[0]} | ![]({os.path.basename(p)}) |"
              for p in paths]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True,
                        help="one release: a run's public folder, a scheduled release's folder "
                             "or a glob of records files")
    parser.add_argument("--out", default="report",
                        help="folder for the charts and summary.md (default: report)")
    parser.add_argument("--truth-config",
                        help="demo data only: the job's config, to draw the exact (NOT private) "
                             "running totals next to the released ones")
    parser.add_argument("--verbose", action="store_true",
                        help="show Beam's and the library's logs (quiet by default)")
    args = parser.parse_args(argv)
    logs.configure(args.verbose)
    try:
        rows = read_records(args.input)
        descriptor = release_descriptor(args.input)
        truth = true_totals(args.truth_config, rows, descriptor) \
            if args.truth_config else None
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    paths = plot(rows, args.out, truth)
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as handle:
        handle.write(summary(rows, paths, truth, selecting_max_se(descriptor)))
    print(f"{len(paths)} charts and {os.path.join(args.out, 'summary.md')}")
    return 0


if __name__ == "__main__":
    logs.exit_now(main())

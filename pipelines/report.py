"""Charts and a summary of released records.

    python3 -m pipelines.report --input 'output/active-users/records-*.parquet' --out report/
        [--truth-config configs/active_users.yaml]

Writes one PNG per key (noisy running total with its confidence band; with --truth-config, also
the true running total, recomputed with the same truncation and zero noise: for demo data) and
`report/summary.md` (mechanism, privacy, MaxSE, keys, steps). Needs matplotlib
(`pip install -e ".[report]"`).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from typing import Dict, List

import pyarrow.parquet as pq


def read_records(pattern: str) -> List[dict]:
    files = sorted(glob.glob(pattern))
    if not files:
        raise ValueError(f"`input` must match at least one records file; got {pattern!r}.")
    rows = []
    for path in files:
        if path.endswith(".parquet"):
            rows.extend(pq.read_table(path).to_pylist())
        else:
            with open(path, encoding="utf-8") as handle:
                rows.extend(json.loads(line) for line in handle if line.strip())
    return rows


def true_totals(config_path: str) -> Dict[str, List[float]]:
    """The job's running totals with the same truncation and zero noise."""
    import tempfile

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipelines import config as job_config
    from pipelines import run as job_run
    job = job_config.load(config_path)
    folder = tempfile.mkdtemp(prefix="truth-")
    job = job.replace(output=job_config.OutputSpec(folder, ("jsonl",)),
                      secret=job_config.SecretSpec(insecure=True))
    from transforms.release import NoNoise
    transform = job_run.build_transform(job, noise_source=NoNoise())
    try:
        with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
            job_run.build(pipeline, job, transform)
        rows = read_records(os.path.join(folder, job.job, "records-*.jsonl"))
    finally:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)  # exact counts: never left behind
    return _series(rows, "value")


def _series(rows, field) -> Dict[str, List[float]]:
    out: Dict[str, Dict[int, float]] = {}
    for row in rows:
        out.setdefault(row["key"], {})[row["step"]] = row[field]
    return {key: [steps[s] for s in sorted(steps)] for key, steps in out.items()}


def plot(rows, out_dir, truth=None) -> List[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(out_dir, exist_ok=True)
    by_key: Dict[str, List[dict]] = {}
    for row in rows:
        by_key.setdefault(row["key"], []).append(row)
    paths = []
    for key, items in sorted(by_key.items()):
        items.sort(key=lambda r: r["step"])
        steps = [r["step"] for r in items]
        figure, axis = plt.subplots(figsize=(8, 4), dpi=110)
        axis.fill_between(steps, [r["ci_low"] for r in items], [r["ci_high"] for r in items],
                          alpha=0.25, color="tab:blue",
                          label=f"{items[0]['confidence']:.0%} confidence interval")
        axis.plot(steps, [r["value"] for r in items], color="tab:blue", lw=1.6,
                  label="released (noisy running total)")
        if truth and key in truth:
            axis.plot(steps, truth[key][:len(steps)], color="black", lw=1.2, ls="--",
                      label="true running total after truncation (demo data)")
        axis.set_title(f"{key}: {items[0]['mechanism']}")
        axis.set_xlabel("step")
        axis.set_ylabel("running total")
        axis.grid(alpha=0.3)
        axis.legend(loc="upper left", fontsize=8)
        figure.tight_layout()
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", key) + ".png"
        path = os.path.join(out_dir, name)
        figure.savefig(path)
        plt.close(figure)
        paths.append(path)
    return paths


def summary(rows, paths, truth=None) -> str:
    first = rows[0]
    privacy = ", ".join(f"{k} = {first[k]}" for k in ("epsilon", "delta", "rho")
                        if first.get(k) is not None)
    keys = sorted({r["key"] for r in rows})
    steps = sorted({r["step"] for r in rows})
    max_se = max(r["stddev"] for r in rows)
    lines = ["# Continual release report", "",
             f"- release: `{first.get('release_id', '?')}`; noise: {first.get('noise', '?')}; "
             f"private: {first.get('private', '?')}",
             f"- mechanism: `{first['mechanism']}` {first['mechanism_params']}",
             f"- privacy (whole release): {privacy}",
             f"- keys: {len(keys)}; steps: {len(steps)} "
             f"({first['window_start'] if first['step'] == 0 else ''} ...)",
             f"- MaxSE (largest per-step noise standard deviation): {max_se:.3f}",
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
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.report", description=__doc__)
    parser.add_argument("--input", required=True)
    parser.add_argument("--out", default="report")
    parser.add_argument("--truth-config")
    parser.add_argument("--verbose", action="store_true",
                        help="show Beam's and the library's logs (quiet by default)")
    args = parser.parse_args(argv)
    from pipelines import logs
    logs.configure(args.verbose)
    try:
        rows = read_records(args.input)
        truth = true_totals(args.truth_config) if args.truth_config else None
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    paths = plot(rows, args.out, truth)
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as handle:
        handle.write(summary(rows, paths, truth))
    print(f"{len(paths)} charts and {os.path.join(args.out, 'summary.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Beam plugin against the plain Beam floor and PipelineDP, same Parquet input, same run.

    python3 benchmarks/bench_beam.py [--events 1000000] [--users 100000] [--keys 1000]
                                     [--steps 100] [--only count|distinct|jobs]
                                     [--scale 1e5,1e6] [--repeats 3]
                                     [--pipelines floor,continual_count,...]
                                     [--text-times seconds|iso]

A seeded generator writes the input to Parquet first (not timed): columns user, key, ts (int64,
event time in microseconds; `--users` users, `--keys` public keys, `--steps` hourly steps) and,
for the count-distinct variant, op ('+' / '-'), item, key, ts. Then, in ONE process
(FnApiRunner in-process), each pipeline reads that file (ReadFromParquet, one dict per row;
continual_count: ReadFromParquetBatched, one Arrow table per row group):
- floor: plain non-private count per (key, step): ((key, step), 1) | CombinePerKey(sum);
- arrow_floor: the same count vectorised: ReadFromParquetBatched, each Arrow table counted per
  (key, step) with numpy, the partial counts summed per (key, step) (what a batched entry
  costs with no privacy work);
- pipeline_dp: PipelineDP's private Count, same caps, public partitions, ONE release (skipped
  when `pipeline_dp` is not importable);
- continual_count: ContinualCount, caps 2 keys x 2 contributions per user, T releases of every
  public key, through the BATCHED entry: ReadFromParquetBatched -> `ArrowEvents` (Arrow tables
  -> EventBatches, steps assigned with numpy; `transforms.arrow_input`) -> ContinualCount;
- continual_count_elements: the same ContinualCount through the ELEMENT entry: ReadFromParquet
  -> TimestampedValue((user, key), ts) per row -> ContinualCount (the same records);
- distinct_floor: plain non-private distinct items per (key, step);
- continual_distinct: ContinualCountDistinct (max_flips 4, 1 key per item);
- job_parquet / job_jsonl / job_csv (`--only jobs`): the product's job (`pipelines.run.build`:
  reading, parsing, the input gate, the release and its writes) on the count input as Parquet,
  JSON lines and CSV (the copies are written first, not timed; their times as epoch seconds,
  or as ISO-8601 text with `--text-times iso`).
Each repeat runs every chosen pipeline once, in the opposite order of the repeat before
(`--repeats`, default 3); prints each pipeline's CPU seconds (min and median over the repeats)
and the ratios of mins and of medians. With `--scale` it runs the series of sizes (one repeat
each) and prints the slope (seconds per 1e6 events) of every pipeline.
Benchmarks only: nothing here is a test.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import apache_beam as beam  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.transforms.window import TimestampedValue  # noqa: E402

from transforms import ContinualCount, ContinualCountDistinct, SecretRef, TimeSteps  # noqa: E402
from transforms.arrow_input import ArrowEvents  # noqa: E402

ORIGIN = 1_700_000_000.0
HOUR = 3600.0
MAX_KEYS, MAX_CONTRIBUTIONS = 2, 2  # per user: 2 keys x 2 contributions


def write_inputs(folder: str, events: int, users: int, keys: int, steps: int, seed: int = 1,
                 text_times: str = "seconds"):
    """Seeded Parquet inputs (count and distinct) and the count input's JSON-lines and CSV
    copies, their times as epoch seconds or ISO-8601 text (`text_times`); returns their
    paths."""
    rng = np.random.default_rng(seed)
    ts = (ORIGIN * 1e6 + rng.integers(0, int(steps * HOUR * 1e6), events)).astype(np.int64)
    count = pa.table({"user": rng.integers(0, users, events, dtype=np.int64),
                      "key": rng.integers(0, keys, events, dtype=np.int64), "ts": ts})
    ops = np.where(rng.random(events) < 0.7, "+", "-")
    distinct = pa.table({"op": pa.array(ops),
                         "item": rng.integers(0, users, events, dtype=np.int64),
                         "key": rng.integers(0, keys, events, dtype=np.int64),
                         "ts": np.sort(ts)})
    paths = (os.path.join(folder, "count.parquet"), os.path.join(folder, "distinct.parquet"),
             os.path.join(folder, "count.jsonl"), os.path.join(folder, "count-job.parquet"),
             os.path.join(folder, "count.csv"))
    pq.write_table(count, paths[0], row_group_size=100_000)
    pq.write_table(distinct, paths[1], row_group_size=100_000)
    # the job's Parquet input: its event time as a timestamp column (the job's typed input)
    pq.write_table(count.set_column(2, "ts", pa.array(ts, pa.timestamp("us", tz="UTC"))),
                   paths[3], row_group_size=100_000)
    def text(micros):
        if text_times == "seconds":
            return repr(micros / 1e6)
        return datetime.datetime.fromtimestamp(micros // 10 ** 6, datetime.timezone.utc).replace(
            microsecond=micros % 10 ** 6).isoformat().replace("+00:00", "Z")

    with open(paths[2], "w", encoding="utf-8") as handle:  # the same events as JSON lines
        for user, key, micros in zip(*(count.column(n).to_pylist()
                                       for n in ("user", "key", "ts"))):
            when = text(micros) if text_times == "seconds" else f'"{text(micros)}"'
            handle.write(f'{{"user": {user}, "key": {key}, "ts": {when}}}\n')
    with open(paths[4], "w", encoding="utf-8") as handle:  # and as CSV
        handle.write("user,key,ts\n")
        for user, key, micros in zip(*(count.column(n).to_pylist()
                                       for n in ("user", "key", "ts"))):
            handle.write(f"{user},{key},{text(micros)}\n")
    return paths


def job_config(paths, fmt: str, steps, keys, text_times: str = "seconds"):
    """The count job of the product (`pipelines.run`) on the count input in `fmt`, output to a
    folder beside it (JSON lines only: every job writes the same records)."""
    from pipelines import config as job_config_module
    folder = os.path.dirname(paths[0])
    raw = {"job": f"bench-{fmt}", "transform": "count",
           "input": {"path": {"parquet": paths[3], "jsonl": paths[2], "csv": paths[4]}[fmt],
                     "format": fmt,
                     "fields": {"timestamp": "ts", "unit": "user", "key": "key"},
                     "timestamp_format": "iso" if fmt == "parquet" else text_times,
                     "types": {"unit": "int", "key": "int"}},
           "steps": {"origin": steps.iso(steps.origin), "size_seconds": steps.size,
                     "horizon": steps.horizon},
           "privacy": {"epsilon": 1.0},
           "bounds": {"max_contributions": MAX_CONTRIBUTIONS,
                      "max_keys_per_unit": MAX_KEYS},
           "public_keys": list(keys),
           "mechanism": {"name": "kary_subtraction", "params": {"k": 19}},
           "secret": {"seed": 1, "insecure": True},
           "output": {"path": os.path.join(folder, f"out-{fmt}"), "formats": ["jsonl"]}}
    path = os.path.join(folder, f"job-{fmt}.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(raw, handle)  # JSON is YAML
    return job_config_module.load(path)


def timed(build):
    """(wall seconds, CPU seconds of this process): the in-process runner runs in this process,
    so CPU seconds hold up better than wall seconds when the machine is shared."""
    start, cpu = time.perf_counter(), time.process_time()
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        build(pipeline)
    return time.perf_counter() - start, time.process_time() - cpu


def pipelines(paths, args, steps, keys):
    count_path, distinct_path = paths[:2]
    origin_us, size_us = int(ORIGIN * 1e6), int(HOUR * 1e6)

    def count_events(p):
        return (p | "Read" >> beam.io.ReadFromParquet(count_path)
                | "Events" >> beam.Map(lambda r: TimestampedValue((r["user"], r["key"]),
                                                                  r["ts"] / 1e6)))

    def distinct_events(p):
        return (p | "Read" >> beam.io.ReadFromParquet(distinct_path)
                | "Events" >> beam.Map(lambda r: TimestampedValue(
                    (r["op"], r["item"], r["key"]), r["ts"] / 1e6)))

    def floor(p):
        (p | "Read" >> beam.io.ReadFromParquet(count_path)
         | "KeyStep" >> beam.Map(lambda r: ((r["key"], (r["ts"] - origin_us) // size_us), 1))
         | beam.CombinePerKey(sum) | beam.Map(lambda kv: None))

    def pipeline_dp_count(p):
        import pipeline_dp  # optional peer: skipped when not installed
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=1e-6)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE, metrics=[pipeline_dp.Metrics.COUNT],
            max_partitions_contributed=MAX_KEYS,
            max_contributions_per_partition=MAX_CONTRIBUTIONS)
        extractors = pipeline_dp.DataExtractors(partition_extractor=lambda r: r["key"],
                                                privacy_id_extractor=lambda r: r["user"],
                                                value_extractor=lambda r: 0)
        rows = p | "Read" >> beam.io.ReadFromParquet(count_path)
        result = engine.aggregate(rows, params, extractors, public_partitions=keys)
        accountant.compute_budgets()
        result | beam.Map(lambda r: None)

    def continual_count_elements(p):
        result = count_events(p) | ContinualCount(
            steps=steps, public_keys=keys, epsilon=1.0, max_contributions=MAX_CONTRIBUTIONS,
            max_keys_per_unit=MAX_KEYS, mechanism="kary_subtraction",
            mechanism_params={"k": 19}, secret=SecretRef(seed=1), insecure=True)
        result.records | "Drain" >> beam.Map(lambda r: None)

    def continual_count(p):  # the batched entry: no Beam element per event
        batches = (p | "Read" >> beam.io.ReadFromParquetBatched(count_path)
                   | "Events" >> ArrowEvents({"unit": "user", "key": "key"}, timestamp="ts",
                                             timestamp_unit="us"))
        result = batches | ContinualCount(
            steps=steps, public_keys=keys, epsilon=1.0, max_contributions=MAX_CONTRIBUTIONS,
            max_keys_per_unit=MAX_KEYS, mechanism="kary_subtraction",
            mechanism_params={"k": 19}, secret=SecretRef(seed=1), insecure=True)
        result.records | "Drain" >> beam.Map(lambda r: None)

    def arrow_floor(p):
        def counted(table):
            step = (table.column("ts").to_numpy() - origin_us) // size_us
            cell = table.column("key").to_numpy() * steps.horizon + step
            found, counts = np.unique(cell, return_counts=True)
            return zip(found.tolist(), counts.tolist())
        (p | "Read" >> beam.io.ReadFromParquetBatched(count_path)
         | "CountTable" >> beam.FlatMap(counted) | beam.CombinePerKey(sum)
         | beam.Map(lambda kv: None))

    def job(fmt):
        def build(p):
            from pipelines import run as job_run
            job = job_config(paths, fmt, steps, keys, args.text_times)
            job_run.build(p, job, job_run.build_transform(job))
        return build

    def distinct_floor(p):
        (p | "Read" >> beam.io.ReadFromParquet(distinct_path)
         | "KeyStep" >> beam.Map(lambda r: ((r["key"], (r["ts"] - origin_us) // size_us),
                                            r["item"]))
         | beam.Distinct() | beam.combiners.Count.PerKey() | beam.Map(lambda kv: None))

    def continual_distinct(p):
        result = distinct_events(p) | ContinualCountDistinct(
            steps=steps, public_keys=keys, rho=0.5, max_flips=4, max_keys_per_unit=1,
            mechanism="sqrt_toeplitz", secret=SecretRef(seed=1), insecure=True)
        result.records | "Drain" >> beam.Map(lambda r: None)

    count = [("floor", floor), ("arrow_floor", arrow_floor), ("pipeline_dp", pipeline_dp_count),
             ("continual_count", continual_count),
             ("continual_count_elements", continual_count_elements)]
    distinct = [("distinct_floor", distinct_floor), ("continual_distinct", continual_distinct)]
    jobs = [("job_parquet", job("parquet")), ("job_jsonl", job("jsonl")), ("job_csv", job("csv"))]
    chosen = {"count": count, "distinct": distinct, "jobs": jobs,
              "all": count + distinct + jobs}[args.only]
    if args.pipelines:
        names = args.pipelines.split(",")
        chosen = [(name, build) for name, build in chosen if name in names]
    return chosen


RATIOS = (("continual_count", "floor"), ("continual_count", "arrow_floor"),
          ("pipeline_dp", "floor"), ("job_jsonl", "job_parquet"), ("job_csv", "job_parquet"),
          ("continual_count", "pipeline_dp"), ("continual_count_elements", "floor"),
          ("continual_count_elements", "pipeline_dp"), ("continual_distinct", "distinct_floor"))


def run_size(events: int, args, medians: bool = False):
    """Every chosen pipeline `args.repeats` times, interleaved: (min wall, min CPU) per
    pipeline (`medians`: every repeat's CPU seconds per pipeline), the ratios of mins and
    medians printed."""
    steps = TimeSteps(ORIGIN, HOUR, args.steps)
    keys = list(range(args.keys))
    walls, cpus, skipped = {}, {}, set()
    with tempfile.TemporaryDirectory(prefix="bench-beam-") as folder:
        paths = write_inputs(folder, events, args.users, args.keys, args.steps,
                             text_times=args.text_times)
        chosen = pipelines(paths, args, steps, keys)
        for repeat in range(args.repeats):
            for name, build in (chosen if repeat % 2 == 0 else chosen[::-1]):
                if name in skipped:
                    continue
                try:
                    wall, cpu = timed(build)
                except ImportError as error:
                    print(f"  {name:<20} skipped ({error})", flush=True)
                    skipped.add(name)
                    continue
                walls.setdefault(name, []).append(wall)
                cpus.setdefault(name, []).append(cpu)
    for name, _ in chosen:
        if name in cpus:
            low, mid = min(cpus[name]), statistics.median(cpus[name])
            print(f"  {name:<25}{low:8.2f} / {mid:8.2f} s CPU (min / median), "
                  f"{low / events * 1e6:7.1f} us CPU/event, {min(walls[name]):8.2f} s wall",
                  flush=True)
    for top, bottom in RATIOS:
        if top in cpus and bottom in cpus:
            print(f"  {top} / {bottom}: {min(cpus[top]) / min(cpus[bottom]):.2f}x / "
                  f"{statistics.median(cpus[top]) / statistics.median(cpus[bottom]):.2f}x CPU "
                  f"(min / median)")
    if medians:
        return cpus
    return ({name: min(v) for name, v in walls.items()},
            {name: min(v) for name, v in cpus.items()})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=float, default=1e6)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--only", choices=("all", "count", "distinct", "jobs"), default="all")
    parser.add_argument("--text-times", choices=("seconds", "iso"), default="seconds",
                        help="the JSON-lines and CSV copies' event times: epoch seconds or "
                             "ISO-8601 text (e.g. 2023-11-14T22:13:20.123456Z)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved runs of every pipeline (min and median printed)")
    parser.add_argument("--pipelines", default=None,
                        help="comma-separated pipeline names to run (default: all of --only)")
    parser.add_argument("--scale", default=None,
                        help="comma-separated event counts, e.g. 1e5,1e6[,4e6]: prints the slope")
    args = parser.parse_args()
    sizes = [int(float(s)) for s in args.scale.split(",")] if args.scale else [int(args.events)]
    if args.scale:
        args.repeats = 1
    print(f"users {args.users}, public keys {args.keys}, steps {args.steps}, caps "
          f"{MAX_KEYS} keys x {MAX_CONTRIBUTIONS} contributions; FnApiRunner in-process")
    series = {}
    for events in sizes:
        print(f"{events:.0e} events:", flush=True)
        series[events] = run_size(events, args)
    if len(sizes) > 1:
        print("slope (seconds per 1e6 events, least squares over the series; a line through "
              "the points means time linear in events):")
        xs = np.array(sizes, dtype=float) / 1e6
        slopes = {}
        for name in series[sizes[0]][0]:
            fits = []
            for which in (0, 1):
                ys = np.array([series[n][which].get(name, np.nan) for n in sizes])
                fits.append(np.polyfit(xs, ys, 1))
            slopes[name] = fits[1][0]
            print(f"  {name:<20}{fits[0][0]:8.2f} s wall, {fits[1][0]:8.2f} s CPU per 1e6 "
                  f"events (intercepts {fits[0][1]:.2f} s, {fits[1][1]:.2f} s)")
        for top, bottom in RATIOS:
            if top in slopes and bottom in slopes:
                print(f"  slope {top} / {bottom}: {slopes[top] / slopes[bottom]:.2f}x CPU")


if __name__ == "__main__":
    main()

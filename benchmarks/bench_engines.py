"""The product's batch job on Flink and Spark beside the local runner (not run in CI; needs the
engines: `python3 -m pipelines.engines fetch`).

    python3 benchmarks/bench_engines.py [--events 1000000] [--repeats 2]
                                        [--runners FnApiRunner,FlinkRunner,SparkRunner]

The count job of `benchmarks/bench_beam.py` (`job_parquet`: the same seeded Parquet input, its
keys, steps and mechanism, an insecure seed) run as `python3 -m pipelines.run --runner R`, the
runners interleaved in each repeat (the first runner changes from repeat to repeat). Wall
seconds of the whole command, job server start-up included (Flink and Spark run in their own
JVM; the CPU time of this process would miss it), min and median; the ratios are to the local
runner's min and median of the same run. Every runner's records must equal the local runner's
(the run fails otherwise).
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_beam  # noqa: E402  (its inputs and its job's config)
from transforms.steps import TimeSteps  # noqa: E402


def records(folder: str) -> list:
    return sorted(line for path in glob.glob(os.path.join(folder, "*", "records-*.jsonl"))
                  for line in open(path).read().splitlines() if line)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--runners", default="FnApiRunner,FlinkRunner,SparkRunner")
    args = parser.parse_args(argv)
    runners = args.runners.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as folder:
        steps = TimeSteps(origin=bench_beam.ORIGIN, size=bench_beam.HOUR, horizon=100)
        keys = list(range(100))
        paths = bench_beam.write_inputs(folder, args.events, args.events // 10, len(keys),
                                        steps.horizon)
        job = bench_beam.job_config(paths, "parquet", steps, keys)
        config = os.path.join(folder, "job-parquet.yaml")
        seconds = {runner: [] for runner in runners}
        published = {}
        for repeat in range(args.repeats):
            order = runners[repeat % len(runners):] + runners[:repeat % len(runners)]
            for runner in order:
                out = os.path.join(folder, f"out-{runner}-{repeat}")
                with open(config) as handle:
                    text = handle.read().replace(job.output.path, out)
                mine = os.path.join(folder, f"job-{runner}-{repeat}.yaml")
                with open(mine, "w") as handle:
                    handle.write(text)
                start = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "pipelines.run", "--config", mine,
                                       "--runner", runner], cwd=ROOT, capture_output=True,
                                      text=True)
                seconds[runner].append(time.perf_counter() - start)
                if done.returncode != 0:
                    print(done.stderr[-2000:], file=sys.stderr)
                    return 1
                published.setdefault(runner, records(out))
        base = runners[0]
        if any(rows != published[base] or not rows for rows in published.values()):
            print("error: the runners published different records", file=sys.stderr)
            return 1
        print(f"{args.events:,} Parquet events, {len(keys)} keys, {steps.horizon} steps "
              f"(records equal on every runner); wall seconds, {args.repeats} repeats:")
        print("| runner | min s | median s | min / local | median / local |")
        print("|---|---|---|---|---|")
        low, mid = min(seconds[base]), statistics.median(seconds[base])
        for runner in runners:
            times = seconds[runner]
            print(f"| {runner} | {min(times):.1f} | {statistics.median(times):.1f} | "
                  f"{min(times) / low:.2f} | {statistics.median(times) / mid:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

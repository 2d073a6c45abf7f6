"""The streaming job from Kafka on Flink, live: each step's publication lag at a sustained rate,
and the published records against the batch job on the same events (not run in CI; needs
`python3 -m pipelines.engines fetch`).

    python3 benchmarks/bench_kafka.py [--rate 1000] [--keys 100] [--users 50000] [--steps 10]
                                      [--step-seconds 5] [--lateness 2] [--lead 45]

A local Kafka broker (`pipelines.kafka_local`) gets `--rate` events/s over `--keys` public keys and
`--users` users (default 50,000, taken in turn), produced in batches every 20 ms at their event
time (the record's Kafka timestamp), from step 0's start to the horizon's end. The job of
`pipelines.run` reads a config with `input.kind: kafka` on Flink (the job server's embedded
cluster, parallelism 2, checkpoints every 5 s). Prints the lag of each step (its publication time -
(its end + the release delay)), the late dead letters, the job's CPU use (cores busy, start-up
included), and whether the published records equal the batch job's on the events produced (same
seed).
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import yaml  # noqa: E402

from pipelines import engines, kafka_local  # noqa: E402
from pipelines import run as job_run  # noqa: E402

FIELDS = {"timestamp": "t", "unit": "user", "key": "key"}


def config(folder: str, name: str, source: dict, origin: float, args) -> str:
    raw = {"job": "bench", "transform": "count", "input": source,
           "steps": {"origin": origin, "size_seconds": args.step_seconds,
                     "horizon": args.steps},
           "privacy": {"epsilon": 1.0},
           "bounds": {"max_contributions": 8, "max_contributions_per_step": 2},
           "public_keys": [f"k{i:05d}" for i in range(args.keys)],
           "secret": {"seed": 1, "insecure": True},
           "output": {"path": os.path.join(folder, name), "formats": ["jsonl"]}}
    if source.get("kind") == "kafka":
        raw["steps"]["allowed_lateness_seconds"] = args.lateness
    path = os.path.join(folder, f"{name}.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(raw, handle)
    return path


def produce(bootstrap: str, rate: float, keys: int, users: int, start: float, stop: float,
            job) -> list:
    """`rate` events/s from `start` to `stop`, in batches every 20 ms, each stamped with the
    time it is produced; -> the rows produced (all delivered, or an error)."""
    from confluent_kafka import Producer
    producer, rows, failed, i = Producer({"bootstrap.servers": bootstrap}), [], [], 0
    while time.time() < start and job.poll() is None:
        time.sleep(0.01)
    while job.poll() is None:
        now = time.time()
        if now >= stop:
            break
        while i < int((now - start) * rate):
            row = {"user": f"u{i % users}", "key": f"k{i % keys:05d}", "t": now}
            producer.produce("events", value=json.dumps(row), timestamp=int(now * 1000),
                             on_delivery=lambda error, _: error and failed.append(error))
            rows.append(row)
            i += 1
        producer.poll(0)
        time.sleep(0.02)
    if producer.flush(60) != 0 or failed:
        raise RuntimeError(f"`producer` must deliver every event; got {failed[:1]}.")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--users", type=int, default=50_000,
                        help="units, taken in turn (fewer: more events per unit and step)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=5.0)
    parser.add_argument("--lateness", type=float, default=2.0,
                        help="steps.allowed_lateness_seconds (<= half a step)")
    parser.add_argument("--lead", type=float, default=45.0,
                        help="seconds from the job's launch to step 0 (its start-up)")
    parser.add_argument("--beam-arg", action="append", default=[],
                        help="a Beam option for the job, e.g. --beam-arg=--parallelism=1")
    args = parser.parse_args(argv)
    missing = [name for name in ("flink", "kafka", "kafka-expansion")
               if not engines.installed(engines.BY_NAME[name])]
    if missing:
        print(f"skipped: not installed: {', '.join(missing)} (python3 -m pipelines.engines "
              f"fetch)")
        return 0
    folder = tempfile.mkdtemp(prefix="bench-kafka-")
    with kafka_local.KafkaBroker(folder=os.path.join(folder, "kafka")) as broker:
        broker.create_topic("events", partitions=2)
        origin = float(int(time.time()) + args.lead)
        path = config(folder, "live", {"kind": "kafka", "bootstrap_servers": broker.bootstrap,
                                       "topic": "events", "format": "jsonl",
                                       "timestamp_format": "seconds", "fields": FIELDS},
                      origin, args)
        before, launched = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
        job = subprocess.Popen([sys.executable, "-m", "pipelines.run", "--config", path,
                                "--runner", "FlinkRunner", *args.beam_arg], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rows = produce(broker.bootstrap, args.rate, args.keys, args.users, origin,
                       origin + args.step_seconds * args.steps, job)
        out, err = job.communicate(timeout=600)
        after, ran = resource.getrusage(resource.RUSAGE_CHILDREN), time.time() - launched
    cores = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) / ran
    operator = os.path.join(folder, "live", "bench-operator")
    notes = [json.load(open(p)) for p in glob.glob(os.path.join(operator, "steps", "*.json"))]
    lags = sorted((n["step"], n["seconds_after_step_end"] - args.step_seconds) for n in notes)
    dead = {}
    for name in glob.glob(os.path.join(operator, "dead_letters-*.jsonl")):
        for line in open(name):
            code = json.loads(line)["code"]
            dead[code] = dead.get(code, 0) + 1
    live = list(json.loads(line) for p in glob.glob(os.path.join(
        folder, "live", "bench", "steps", "step-*.jsonl")) for line in open(p))
    data = os.path.join(folder, "events.jsonl")
    with open(data, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
    batch_config = config(folder, "batch", {"path": data, "format": "jsonl",
                                            "timestamp_format": "seconds", "fields": FIELDS,
                                            "max_dead_letter_fraction": 1.0}, origin, args)
    with contextlib.redirect_stdout(io.StringIO()):
        job_run.main(["--config", batch_config])
    batch = list(json.loads(line) for p in glob.glob(os.path.join(
        folder, "batch", "bench", "records-*.jsonl")) for line in open(p))
    key = (lambda r: (r["step"], r["key"]))
    equal = sorted(live, key=key) == sorted(batch, key=key)
    print(f"{len(rows)} events at {args.rate:g}/s over {args.keys} keys, {args.steps} steps of "
          f"{args.step_seconds:g} s (release delay 1 step, allowed lateness {args.lateness:g} s)"
          f"; job exit {job.returncode}")
    print("lag per step (s after its end + the release delay): "
          + ", ".join(f"{lag:.2f}" for _, lag in lags))
    if lags:
        print(f"lag median {statistics.median(l for _, l in lags):.2f} s, max "
              f"{max(l for _, l in lags):.2f} s; steps published {len(lags)} of {args.steps}; "
              f"dead letters {dead}; job cores {cores:.2f}; records == batch: {equal}")
    if job.returncode != 0:
        lines = [line for line in err.strip().splitlines() if "Error" in line or "error" in line]
        print("\n".join(lines[-8:]) if lines else out[-300:])
    return 0 if equal and len(lags) == args.steps else 1


if __name__ == "__main__":
    sys.exit(main())

"""The streaming job live through the local Pub/Sub emulator: sustained events/s and each step's
publication lag at many public keys (not run in CI; needs gcloud's pubsub emulator).

    python3 benchmarks/bench_pubsub.py [--keys 1000] [--rates 100,1000,2000] [--steps 6]
                                       [--step-seconds 2] [--warmup 4] [--lateness 0.5]

For each rate (events/s, published at an even pace with the event time as the `ts` attribute),
the job of `pipelines.run` reads a config with `input.kind: pubsub` on Beam's local streaming
runner and publishes each step (`--keys` records) once all are in. Prints per rate: events
published, late dead letters (events the job read after the watermark had passed their step:
the job fell behind), the publication lag of each step after its end + the release delay
(median and max over the steps), and the lag as a ratio of the lowest rate's, measured in the
same run (the machine's speed drifts between runs), and the job's CPU use (its CPU seconds
over its wall seconds, start-up included: cores busy). The job "keeps up" at a rate when no event
is late and every step is published within 1 s after its release delay.

`--warmup` seconds of events at the same rate come before step 0 (outside the horizon: dead
letters, not counted as late): Beam's local runner needs about a second under a new burst of
load, during which the step-0 contributions of a cold job reach their key after the key
released the step (late in the release: timer output holds no watermark on the local runner).
`--warmup 0` shows that cold start. Dead letters themselves are written at about 200/s on the
local runner (it pulls 10 messages per bundle and pays per bundle and stage), so a job stopped
right after its last step may not have written every warm-up dead letter yet.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import resource
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import yaml  # noqa: E402

from pipelines.emulator import Heartbeats, PubSubEmulator, available  # noqa: E402


def config(folder: str, subscription: str, origin: float, keys: int, steps: int,
           size: float, lateness: float, delay: int) -> str:
    raw = {"job": "bench", "transform": "count",
           "input": {"kind": "pubsub", "subscription": subscription,
                     "timestamp_attribute": "ms", "format": "jsonl",
                     "timestamp_format": "seconds",
                     "fields": {"timestamp": "t", "unit": "user", "key": "key"}},
           "steps": {"origin": origin, "size_seconds": size, "horizon": steps,
                     "allowed_lateness_seconds": lateness, "release_delay_steps": delay},
           "privacy": {"epsilon": 1.0},
           "bounds": {"max_contributions": 8, "max_contributions_per_step": 2},
           "public_keys": [f"k{i:05d}" for i in range(keys)],
           "secret": {"seed": 1, "insecure": True},
           "output": {"path": os.path.join(folder, "out"), "formats": ["jsonl"]}}
    path = os.path.join(folder, "bench.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(raw, handle)
    return path


def publish_at(emulator, topic: str, rate: float, keys: int, start: float, stop: float,
               sent: list) -> None:
    """`rate` events/s from `start` to `stop`, in batches every 20 ms, stamped with the time
    they are published."""
    futures, i, delays = [], 0, []
    while time.time() < start:
        time.sleep(0.01)
    while True:
        now = time.time()
        if now >= stop:
            break
        due = int((now - start) * rate)
        while i < due:
            row = {"user": f"u{i % 50_000}", "key": f"k{i % keys:05d}", "t": now}
            future = emulator.publish(topic, row, ms=int(now * 1000))
            future.add_done_callback(lambda _, at=now: delays.append(time.time() - at))
            futures.append(future)
            i += 1
        time.sleep(0.02)
    for future in futures:
        future.result()
    sent.append(i)
    late = sum(1 for d in delays if d > 0.5)
    print(f"  publisher: {late} of {len(delays)} messages acknowledged > 0.5 s after their "
          f"event time (max {max(delays, default=0):.2f} s)")


def one_rate(emulator, rate: float, args, index: int) -> dict:
    folder = tempfile.mkdtemp(prefix="bench-pubsub-")
    topic = f"events{index}"
    subscription = emulator.subscription(topic, f"job{index}")
    origin = float(int(time.time()) + args.lead)
    path = config(folder, subscription, origin, args.keys, args.steps, args.step_seconds,
                  args.lateness, args.delay)
    before, launched = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    job = subprocess.Popen([sys.executable, "-m", "pipelines.run", "--config", path],
                           cwd=args.root, env=dict(os.environ, PYTHONPATH=args.root),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = origin + args.step_seconds * args.steps
    sent, seen = [], {}
    publisher = threading.Thread(target=publish_at, args=(
        emulator, topic, rate, args.keys, origin - args.warmup, end, sent))
    steps = os.path.join(folder, "out", "bench", "steps")
    with Heartbeats(emulator, topic, every=0.3):
        publisher.start()
        while job.poll() is None and time.time() < end + (3 + args.delay) * args.step_seconds + 30:
            for name in glob.glob(os.path.join(steps, "step-*.json")):
                seen.setdefault(os.path.basename(name), time.time())
            time.sleep(0.05)
        publisher.join()
    if job.poll() is None:
        job.kill()
    _, err = job.communicate()
    after, ran = resource.getrusage(resource.RUSAGE_CHILDREN), time.time() - launched
    # the job's CPU seconds (user + system; the emulator, a child too, exits only at the end)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    operator = os.path.join(folder, "out", "bench-operator")
    reasons = {}
    for name in glob.glob(os.path.join(operator, "dead_letters-*.jsonl")):
        for line in open(name):
            reason = json.loads(line)["reason"]
            reason = ("late: in " + ("the release" if "released" in reason else "truncation")
                      if reason.startswith("late") else "outside the horizon"
                      if "outside the horizon" in reason else reason[:60])
            reasons[reason] = reasons.get(reason, 0) + 1
    late = sum(n for reason, n in reasons.items() if reason.startswith("late"))
    if os.environ.get("BENCH_KEEP"):
        print("  kept:", folder)
    if reasons:
        print(f"  rate {rate:g}: dead letters {dict(sorted(reasons.items()))}")
    lags = [when - (origin + args.step_seconds * (int(name[5:13]) + 1 + args.delay))
            for name, when in seen.items()]
    if len(seen) < args.steps:
        print(f"  rate {rate:g}: only {len(seen)} of {args.steps} steps published; "
              f"{err.strip().splitlines()[-1:] if err.strip() else ''}")
    return {"rate": rate, "sent": sent[0] if sent else 0, "late": late,
            "steps": len(seen), "lag_median": statistics.median(lags) if lags else None,
            "lag_max": max(lags) if lags else None, "cores": cpu / ran}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--root", default=ROOT,
                        help="the checkout whose `pipelines.run` runs the job (default: this "
                             "one; e.g. a git worktree of another commit, to compare)")
    parser.add_argument("--rates", default="100,1000,2000")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--step-seconds", type=float, default=2.0)
    parser.add_argument("--lateness", type=float, default=0.5,
                        help="steps.allowed_lateness_seconds (< the release delay)")
    parser.add_argument("--delay", type=int, default=1, help="steps.release_delay_steps")
    parser.add_argument("--warmup", type=float, default=4.0,
                        help="seconds of events before step 0 (out of the horizon: dead "
                             "letters) that warm the job up")
    parser.add_argument("--lead", type=float, default=15.0,
                        help="seconds from the job's launch to step 0 (its start-up)")
    args = parser.parse_args(argv)
    why = available()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    rates = [float(r) for r in args.rates.split(",")]
    print(f"{args.keys} public keys, {args.steps} steps of {args.step_seconds:g} s, release "
          f"delay {args.delay} step(s), allowed lateness {args.lateness:g} s; lag = publication time - (step end + release delay)")
    rows = []
    with PubSubEmulator(project="dp-bench") as emulator:
        for index, rate in enumerate(rates):
            rows.append(one_rate(emulator, rate, args, index))
    base = rows[0]["lag_median"] or 1e-9
    print(f"{'events/s':>9} {'published':>10} {'late':>6} {'steps':>6} {'lag median':>11} "
          f"{'lag max':>8} {'median / base':>14} {'keeps up':>9} {'job cores':>10}")
    for row in rows:
        keeps = row["late"] == 0 and row["steps"] == args.steps and row["lag_max"] <= 1.0
        print(f"{row['rate']:>9g} {row['sent']:>10} {row['late']:>6} {row['steps']:>6} "
              f"{row['lag_median']:>10.2f}s {row['lag_max']:>7.2f}s "
              f"{row['lag_median'] / base:>13.2f}x {'yes' if keeps else 'no':>9} "
              f"{row['cores']:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A streaming release you can watch: the bundled demo events replayed live through a local
Pub/Sub emulator, released step by step as each step closes.

    python3 -m pipelines.stream_demo [--steps 8] [--step-seconds 2] [--output output]

Starts the Pub/Sub emulator (and stops it at the end), runs `configs/streaming/active_users.yaml`
with time compressed (an hour of the demo data becomes one step of `--step-seconds`, starting a
few seconds from now), publishes the demo events at their compressed event times, and prints
each step's records as the job publishes them. The release is an insecure demo (a fixed seed):
its records say private: false.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import threading
import time

import yaml

from pipelines import config as job_config
from pipelines import emulator as pubsub
from pipelines import logs
from pipelines import run

CONFIG = os.path.join(job_config.CONFIG_DIR, "streaming", "active_users.yaml")
TOPIC, SUBSCRIPTION = "active-users", "active-users"
LEAD_SECONDS = 8.0  # the job starts reading before the first step begins


def demo_config(folder: str, origin: float, steps: int, step_seconds: float, output: str) -> str:
    """The streaming config with compressed time and the emulator's subscription (a file)."""
    with open(CONFIG, encoding="utf-8") as handle:
        raw = yaml.safe_load(handle)
    raw["input"]["subscription"] = f"projects/dp-demo/subscriptions/{SUBSCRIPTION}"
    hour = raw["steps"]["size_seconds"]
    raw["steps"] = dict(raw["steps"], origin=origin, size_seconds=step_seconds, horizon=steps,
                        allowed_lateness_seconds=raw["steps"]["allowed_lateness_seconds"]
                        * step_seconds / hour)
    raw["secret"] = {"seed": 2026, "insecure": True}
    # a folder per demo run: a streaming release is launched into a folder once
    raw["output"] = {"path": os.path.join(output, f"stream-demo-{int(origin)}"),
                     "formats": ["jsonl"]}
    path = os.path.join(folder, "active_users_live.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(raw, handle, sort_keys=False)
    return path


def compressed_events(origin: float, steps: int, step_seconds: float):
    """The bundled demo events of the first `steps` hours, at compressed times: (time, row)."""
    demo = job_config.load("demo:active_users")
    start, hour = demo.steps.origin, demo.steps.size_seconds
    events = []
    with open(demo.input.path, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            seconds = job_config.parse_time("ts", row["ts"])
            if start <= seconds < start + steps * hour:
                at = origin + (seconds - start) * step_seconds / hour
                stamp = datetime.datetime.fromtimestamp(at, datetime.timezone.utc)
                events.append((at, dict(row, ts=stamp.isoformat().replace("+00:00", "Z"))))
    return sorted(events, key=lambda e: e[0])


def replay(emulator, events, stop: threading.Event) -> None:
    """Publishes each event when the wall clock reaches its (compressed) event time."""
    sent = []
    for at, row in events:
        wait = at - time.time()
        if wait > 0 and stop.wait(wait):
            break
        sent.append(emulator.publish(TOPIC, row, ts=int(at * 1000)))
    for future in sent:
        future.result()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.stream_demo",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="steps to release (default 8)")
    parser.add_argument("--step-seconds", type=float, default=2.0,
                        help="seconds per step, one hour of the demo data (default 2)")
    parser.add_argument("--output", default="output", help="output folder (default output)")
    parser.add_argument("--verbose", action="store_true", help="show Beam's own logs")
    args = parser.parse_args(argv)
    logs.configure(args.verbose)
    if not 1 <= args.steps <= 48:
        print(f"error: `--steps` must be in [1, 48] (hours of demo data); got {args.steps}.",
              file=sys.stderr)
        return 2
    if not args.step_seconds >= 1:
        print(f"error: `--step-seconds` must be >= 1; got {args.step_seconds}.", file=sys.stderr)
        return 2
    why = pubsub.available()
    if why is not None:
        print(f"error: {why}.", file=sys.stderr)
        return 2
    with pubsub.PubSubEmulator(project="dp-demo") as emulator, \
            tempfile.TemporaryDirectory(prefix="stream-demo-") as folder:
        emulator.subscription(TOPIC, SUBSCRIPTION)
        origin = float(int(time.time() + LEAD_SECONDS))
        config = demo_config(folder, origin, args.steps, args.step_seconds, args.output)
        events = compressed_events(origin, args.steps, args.step_seconds)
        print(f"Pub/Sub emulator on {emulator.host}; replaying {len(events)} demo events of "
              f"{args.steps} hours as {args.steps} steps of {args.step_seconds:g} s", flush=True)
        stop = threading.Event()
        publisher = threading.Thread(target=replay, args=(emulator, events, stop), daemon=True)
        with pubsub.Heartbeats(emulator, TOPIC):
            publisher.start()
            try:
                return run.main(["--config", config] + (["--verbose"] if args.verbose else []))
            finally:
                stop.set()
                publisher.join(timeout=5)


if __name__ == "__main__":
    logs.exit_now(main())

"""A streaming release you can watch: the bundled demo events replayed live through a local
Pub/Sub emulator, released step by step as each step closes.

    python3 -m pipelines.stream_demo [--steps 8] [--step-seconds 2] [--output output]

Starts the Pub/Sub emulator (and stops it at the end), runs `configs/streaming/active_users.yaml`
with time compressed (an hour of the demo data becomes one step of `--step-seconds`, starting a
few seconds from now), publishes the demo events at their compressed event times, and prints
each step's records as the job publishes them. The release is an insecure demo (a fixed seed):
its records say private: false. It is `python3 -m pipelines.replay` on the bundled events.
"""
from __future__ import annotations

import argparse
import os
import sys

from pipelines import config as job_config
from pipelines import emulator as pubsub
from pipelines import logs, replay

CONFIG = os.path.join(job_config.CONFIG_DIR, "streaming", "active_users.yaml")
EVENTS = "demo:active_users.jsonl"


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
    return replay.replay(CONFIG, EVENTS, args.steps, args.step_seconds, args.output,
                         args.verbose, prefix="stream-demo")


if __name__ == "__main__":
    logs.exit_now(main())

"""Your own streaming job, live on the local Pub/Sub emulator: a file of events replayed into
the topic of a streaming config, time compressed, while the job releases step by step.

    python3 -m pipelines.replay --config my_stream.yaml --input my_events.jsonl \
        [--steps 8] [--step-seconds 2] [--output output]

`--config` is a streaming config (`input.kind: pubsub`; its subscription's project and name
are used on the emulator); `--input` a JSON-lines file of its records (the config's fields,
its event time in `input.fields.timestamp` as `input.timestamp_format` says). The command
starts the emulator (`gcloud beta emulators pubsub start`, the `[pubsub]` extra), creates the
topic (named as the subscription) and the subscription, and runs the config's job on it with
its steps compressed: step s of the config (from its origin) becomes `--step-seconds` of
wall time starting a few seconds from now, each event is published when the wall clock
reaches its compressed time, with its time field (and the config's `timestamp_attribute`)
rewritten to it, and heartbeats keep the watermark moving through quiet steps. The release
is an insecure demo (a fixed seed): its records say private: false. Events outside the first
`--steps` steps are not sent. `python3 -m pipelines.stream_demo` is this command on the bundled
demo events.
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
from typing import List, Tuple

import yaml

from pipelines import config as job_config
from pipelines import emulator as pubsub
from pipelines import io, job_release, logs, run
from transforms.steps import UNBOUNDED

LEAD_SECONDS = 8.0  # the job starts reading before the first step begins
# an event is published a little after its compressed time (the publisher's own delay): at
# least this much lateness is allowed, or events at a step's very end would be late
MIN_LATENESS_SECONDS = 1.0


def compressed_config(path: str, folder: str, origin: float, steps: int,
                      step_seconds: float, output: str, prefix: str = "replay") -> str:
    """The streaming config at `path` with its first `steps` steps compressed to
    `step_seconds` each from `origin` (a config with no horizon: those steps as its
    horizon, released by the mechanism it would run with none; its allowed lateness scaled
    alike, at least `MIN_LATENESS_SECONDS`), a fixed seed, and a folder of its own under
    `output` (a streaming release is launched into a folder once); written under `folder` ->
    its path."""
    with open(path, encoding="utf-8") as handle:
        raw = yaml.safe_load(handle)
    if raw["steps"].get("horizon") == UNBOUNDED:  # replayed for `steps` steps, with the
        plan = job_release.release_plan(job_config.load(path))  # mechanism it would run
        raw["mechanism"] = {"name": plan.mechanism, "params": dict(plan.params)}
    size = float(raw["steps"]["size_seconds"])
    raw["steps"] = dict(raw["steps"], origin=origin, size_seconds=step_seconds, horizon=steps)
    lateness = raw["steps"].get("allowed_lateness_seconds", 0.0) * step_seconds / size
    most = raw["steps"].get("release_delay_steps", 1) * step_seconds / 2  # what a config allows
    raw["steps"]["allowed_lateness_seconds"] = min(max(lateness, MIN_LATENESS_SECONDS), most)
    raw["secret"] = {"seed": 2026, "insecure": True}
    raw["output"] = {"path": os.path.join(output, f"{prefix}-{int(origin)}"),
                     "formats": ["jsonl"]}
    written = os.path.join(folder, os.path.basename(path))
    with open(written, "w", encoding="utf-8") as handle:
        yaml.safe_dump(raw, handle, sort_keys=False)
    return written


def time_text(seconds: float, timestamp_format: str):
    """`seconds` as a record's time field in `timestamp_format` (what `io.parse_cell` reads)."""
    if timestamp_format == "seconds":
        return seconds
    if timestamp_format == "milliseconds":
        return int(round(seconds * 1000))
    stamp = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return stamp.isoformat().replace("+00:00", "Z")


def compressed_events(job: job_config.JobConfig, path: str, origin: float, steps: int,
                      step_seconds: float) -> Tuple[List[Tuple[float, dict]], int]:
    """The events of the file at `path` in the config's first `steps` steps, each at its
    compressed time with its time field rewritten to it, in time order; -> (events, the count
    of lines not sent: outside those steps, or unreadable)."""
    field, fmt = job.input.fields["timestamp"], job.input.timestamp_format
    start, size = job.steps.origin, job.steps.size_seconds
    events, skipped = [], 0
    with open(job_config.resolve_path(path) if path.startswith("demo:") else path,
              encoding="utf-8") as handle:
        for line in handle:
            try:
                row = json.loads(line)
                seconds = io.parse_cell(field, "timestamp", row[field], fmt)
            except (ValueError, TypeError, KeyError):
                skipped += 1
                continue
            if not start <= seconds < start + steps * size:
                skipped += 1
                continue
            at = origin + (seconds - start) * step_seconds / size
            events.append((at, dict(row, **{field: time_text(at, fmt)})))
    return sorted(events, key=lambda e: e[0]), skipped


def publish(emulator, topic: str, events, attribute, stop: threading.Event) -> None:
    """Publishes each event when the wall clock reaches its compressed time."""
    sent = []
    for at, row in events:
        wait = at - time.time()
        if wait > 0 and stop.wait(wait):
            break
        attributes = {attribute: int(at * 1000)} if attribute else {}
        sent.append(emulator.publish(topic, row, **attributes))
    for future in sent:
        future.result()


def replay(config: str, events_path: str, steps: int, step_seconds: float, output: str,
           verbose: bool = False, prefix: str = "replay") -> int:
    """`main` once the arguments are checked: the emulator, the compressed config and events,
    the job (its exit code)."""
    job = job_config.load(config)
    if job.input.kind != "pubsub":
        job_config.fail("input.kind", "'pubsub' in a config to replay (a streaming config)",
                        job.input.kind)
    if not 1 <= steps <= job.steps.horizon:
        job_config.fail("--steps", f"in [1, {job.steps.horizon}] (the config's horizon)", steps)
    found, skipped = compressed_events(job, events_path, 0.0, steps, step_seconds)
    if not found:  # nothing to replay: refused before a job would publish noise
        job_config.fail("--input", f"JSON lines with events in the config's first {steps} "
                                   f"steps (field {job.input.fields['timestamp']!r}, "
                                   f"{job.input.timestamp_format})",
                        f"{events_path}: {skipped} lines, none sent")
    project, name = job.input.subscription.split("/")[1], job.input.subscription.split("/")[3]
    with pubsub.PubSubEmulator(project=project) as emulator, \
            tempfile.TemporaryDirectory(prefix="replay-") as folder:
        emulator.subscription(name, name)
        origin = float(int(time.time() + LEAD_SECONDS))
        live = compressed_config(job_config.resolve_path(config) if config.startswith(
            "demo:") else config, folder, origin, steps, step_seconds, output, prefix)
        events, skipped = compressed_events(job, events_path, origin, steps, step_seconds)
        print(f"Pub/Sub emulator on {emulator.host}; replaying {len(events)} events of "
              f"{steps} steps of {job.steps.size_seconds:g} s as steps of {step_seconds:g} s"
              + (f" ({skipped} lines outside those steps or unreadable, not sent)"
                 if skipped else ""), flush=True)
        stop = threading.Event()
        publisher = threading.Thread(target=publish, args=(
            emulator, name, events, job.input.timestamp_attribute, stop), daemon=True)
        with pubsub.Heartbeats(emulator, name):
            publisher.start()
            try:
                return run.main(["--config", live] + (["--verbose"] if verbose else []))
            finally:
                stop.set()
                publisher.join(timeout=5)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a streaming config (input.kind pubsub)")
    parser.add_argument("--input", required=True, help="a JSON-lines file of its events")
    parser.add_argument("--steps", type=int, default=8, help="steps to release (default 8)")
    parser.add_argument("--step-seconds", type=float, default=2.0,
                        help="wall seconds per step of the config (default 2)")
    parser.add_argument("--output", default="output", help="output folder (default output)")
    parser.add_argument("--verbose", action="store_true", help="show Beam's own logs")
    args = parser.parse_args(argv)
    logs.configure(args.verbose)
    try:
        if not args.step_seconds >= 1:
            job_config.fail("--step-seconds", ">= 1", args.step_seconds)
        why = pubsub.available()
        if why is not None:
            job_config.fail("Pub/Sub emulator", "installed (the [pubsub] extra and gcloud)", why)
        return replay(args.config, args.input, args.steps, args.step_seconds, args.output,
                      args.verbose)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    logs.exit_now(main())

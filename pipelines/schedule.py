"""Scheduled runs that continue one continual release across many runs.

    python3 -m pipelines.schedule --config configs/active_users.yaml --state-dir state/ \\
        [--now 2026-01-06T12:00:00Z] [any Beam pipeline option]

Each run releases the steps whose windows are complete at `--now` (default: the current time)
and were not released before, then checkpoints. The state directory (a local path or any Beam
filesystem path) holds committed checkpoints `ckpt-<steps released>-<id>/` with
- `units-*`: every privacy unit's truncation state,
- `keys-*`: every public key's mechanism state (17 bytes) and fail-closed halt step,
- `records-*.jsonl`: the records this run released, `dead_letters-*.jsonl`,
- `ledger.json`: what the release is (budget, horizon, steps, bounds, mechanism, keys) and its
  runs, written before `_COMMITTED`, the marker that makes the checkpoint visible.
Guarantees (each tested): resuming after N runs gives records identical to one continuous run;
re-running when nothing new is complete returns the stored records and spends nothing; a run
killed mid-way leaves the previous checkpoint intact (its uncommitted directory is ignored) and
the next run completes correctly; a config whose budget, horizon or any other release parameter
differs from the ledger is refused. With `secret: {stored: true}` the secret is generated once
into `<state-dir>/secret` with mode 0600; it is never logged or written to outputs.

Input: the event source must still hold the events of the steps being released (for example
the full history, or every file since the last run); events of already released steps are
dead letters ("late"), events of incomplete steps are left for a later run.
"""
from __future__ import annotations

import argparse
import base64
import datetime
import json
import math
import os
import pickle
import secrets
import stat
import sys
import time
import uuid
from typing import List, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import config as job_config
from pipelines import run as job_run
from transforms.continual import (DEAD_LETTER, HALT_VALUE, _advance_unit, _Aggregate,
                                  _AssignStep, _by_step, key_text, make_record, noise_stream,
                                  release_parts)
from transforms.mechanisms import CounterState
from transforms.secret import SecretRef
from transforms.sinks import WriteRecordsToJsonLines

COMMITTED = "_COMMITTED"
LEDGER = "ledger.json"


def encode(value) -> str:
    return base64.b64encode(pickle.dumps(value)).decode("ascii")


def decode(line: str):
    return pickle.loads(base64.b64decode(line))


def _join(*parts) -> str:
    return FileSystems.join(*parts)


def committed_checkpoints(state_dir: str) -> List[Tuple[int, str]]:
    matches = FileSystems.match([_join(state_dir, "ckpt-*", COMMITTED)])[0].metadata_list
    out = []
    for meta in matches:
        folder = meta.path[:-len(COMMITTED) - 1]
        released = int(os.path.basename(folder).split("-")[1])
        out.append((released, folder))
    return sorted(out)


def fingerprint(job: job_config.JobConfig) -> dict:
    return {"transform": job.transform, "origin": job.origin, "step_seconds": job.step_seconds,
            "horizon": job.horizon, "privacy": job.privacy, "bounds": job.bounds,
            "public_keys": job.public_keys, "mechanism": job.mechanism,
            "mechanism_params": job.mechanism_params, "confidence": job.confidence,
            "secret": sorted(job.secret)}


def check_ledger(ledger: dict, job: job_config.JobConfig) -> None:
    """Refuse a config that differs from what this state directory already released."""
    spent = ledger["release"]
    for name, value in fingerprint(job).items():
        if spent.get(name) != value:
            job_config.fail(name, f"what this state directory already released with "
                                  f"({spent.get(name)!r}; start a new state directory to "
                                  f"change it)", value)


def stored_secret(state_dir: str) -> SecretRef:
    path = _join(state_dir, "secret")
    if not FileSystems.exists(path):
        with FileSystems.create(path) as handle:
            handle.write(secrets.token_hex(32).encode("ascii"))
        if os.path.exists(path):
            os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    return SecretRef(path=path)


class _AdvanceUnits(beam.DoFn):
    """(unit, {"events": [...], "state": [saved]}) -> contributions, new unit state."""

    def __init__(self, problem, released, complete):
        self.problem, self.released, self.complete = problem, released, complete

    def process(self, item):
        unit, grouped = item
        saved = list(grouped["state"])
        state = saved[0] if saved else self.problem.init_state()
        by_step = _by_step(grouped["events"])
        if self.problem.every_step:
            steps = range(self.released if saved else 0, self.complete)
        else:
            steps = sorted(by_step)
        state, outputs, halt = _advance_unit(self.problem, unit, state, by_step, steps)
        yield from outputs
        if halt is not None:
            step, violation = halt
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, {"record": repr(unit),
                                                         "reason": violation})
            yield (self.problem.key, step), HALT_VALUE
        yield beam.pvalue.TaggedOutput("unit_state", encode((unit, state)))


class _ReleaseKeys(beam.DoFn):
    """(key, {"contributions", "state", "seed"}) -> records for [released, complete), state."""

    def __init__(self, config, released, complete):
        self.config, self.released, self.complete = config, released, complete

    def setup(self):
        self.mechanism, self.std, self.half, self.template = release_parts(self.config)

    def process(self, item):
        key, grouped = item
        saved = list(grouped["state"])
        counter, halted = (CounterState.from_bytes(saved[0][0]), saved[0][1]) if saved else (
            CounterState(self.released, 0.0) if self.released == 0 else None, None)
        if counter is None:
            raise RuntimeError(f"no saved state for public key {key_text(key)!r}")
        if counter.steps != self.released:
            raise RuntimeError(f"key {key_text(key)!r} is at step {counter.steps}, checkpoint "
                               f"at {self.released}")
        x = np.zeros(self.complete - self.released)
        for step, value in grouped["contributions"]:
            if isinstance(value, str):
                halted = step if halted is None else min(halted, step)
            else:
                x[step - self.released] = value
        outputs, counter = self.mechanism.for_stream(noise_stream(key)).advance(counter, x)
        for offset, value in enumerate(outputs):
            step = self.released + offset
            if halted is not None and step >= halted:
                break
            yield make_record(self.config, self.template, self.std, self.half, key, step,
                              float(value))
        yield beam.pvalue.TaggedOutput("key_state", encode((key, (counter.to_bytes(), halted))))


def _read_states(pipeline, label, pattern):
    if not FileSystems.match([pattern])[0].metadata_list:
        return pipeline | f"No{label}" >> beam.Create([])
    return (pipeline | f"Read{label}" >> beam.io.ReadFromText(pattern)
            | f"Decode{label}" >> beam.Map(decode))


def build(pipeline, job, transform, released, complete, previous, folder):
    """The bounded pipeline of one scheduled run; returns nothing (writes under `folder`)."""
    problem, steps = transform.problem, transform.steps
    deferred = Metrics.counter("schedule", "events_for_later_runs")
    rows = job_run.read_rows(pipeline, job)
    main_rows = rows if job.input_format == "parquet" else rows.rows
    elements = main_rows | "ToElements" >> beam.ParDo(job_run.ToElement(job)).with_outputs(
        DEAD_LETTER, main="elements")
    stepped = elements.elements | "AssignStep" >> beam.ParDo(
        _AssignStep(problem, steps)).with_outputs(DEAD_LETTER, main="events")

    def window(item):
        unit, (step, ts, payload) = item
        if step < released:
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, {
                "record": repr((unit, payload)),
                "reason": f"late: step {step} was released by an earlier run"})
        elif step >= complete:
            deferred.inc()
        else:
            yield unit, (step, ts, payload)

    current = stepped.events | "StepsOfThisRun" >> beam.FlatMap(window).with_outputs(
        DEAD_LETTER, main="events")
    unit_states = _read_states(pipeline, "UnitStates", _join(previous, "units-*")) \
        if previous else pipeline | "NoUnitStates" >> beam.Create([])
    advanced = ({"events": current.events, "state": unit_states}
                | "JoinUnits" >> beam.CoGroupByKey()
                | "AdvanceUnits" >> beam.ParDo(_AdvanceUnits(problem, released, complete))
                .with_outputs(DEAD_LETTER, "unit_state", main="contributions"))
    public = set(job.public_keys)
    per_key = (advanced.contributions
               | "SumPerKeyAndStep" >> beam.CombinePerKey(_Aggregate())
               | "PublicKeys" >> beam.FlatMap(
                   lambda kv: [(kv[0][0], (kv[0][1], HALT_VALUE if kv[1][1] else kv[1][0]))]
                   if kv[0][0] in public else []))
    key_states = _read_states(pipeline, "KeyStates", _join(previous, "keys-*")) \
        if previous else pipeline | "NoKeyStates" >> beam.Create([])
    seeds = pipeline | "Seeds" >> beam.Create([(key, None) for key in job.public_keys])
    released_keys = ({"contributions": per_key, "state": key_states, "seed": seeds}
                     | "JoinKeys" >> beam.CoGroupByKey()
                     | "ReleaseKeys" >> beam.ParDo(_ReleaseKeys(transform.config, released,
                                                                complete))
                     .with_outputs("key_state", main="records"))
    released_keys.records | "StoreRecords" >> WriteRecordsToJsonLines(_join(folder, "records"))
    sinks = {"parquet": job_run.WriteRecordsToParquet, "jsonl": job_run.WriteRecordsToJsonLines,
             "csv": job_run.WriteRecordsToCsv}
    out = os.path.join(job.output_path, job.job, f"records-steps-{released}-{complete}")
    for fmt in job.output_formats:
        released_keys.records | f"Write {fmt}" >> sinks[fmt](out)
    advanced.unit_state | "StoreUnits" >> beam.io.WriteToText(_join(folder, "units"))
    released_keys.key_state | "StoreKeys" >> beam.io.WriteToText(_join(folder, "keys"))
    dead = [elements[DEAD_LETTER], stepped[DEAD_LETTER], current[DEAD_LETTER],
            advanced[DEAD_LETTER]]
    if job.input_format != "parquet":
        dead.append(rows[DEAD_LETTER])
    (dead | "DeadLetters" >> beam.Flatten()
     | "StoreDeadLetters" >> WriteRecordsToJsonLines(_join(folder, "dead_letters")))


def _write_text(path, text):
    with FileSystems.create(path) as handle:
        handle.write(text.encode("utf-8"))


def run_once(config_path: str, state_dir: str, now: float, beam_args=()) -> dict:
    """One scheduled run; returns a summary dict (steps released before/after, folders)."""
    job = job_config.load(config_path)
    secret = stored_secret(state_dir) if "stored" in job.secret else None
    transform = job_run.build_transform(job, secret)
    checkpoints = committed_checkpoints(state_dir)
    released, previous = checkpoints[-1] if checkpoints else (0, None)
    ledger = None
    if previous:
        with FileSystems.open(_join(previous, LEDGER)) as handle:
            ledger = json.loads(handle.read().decode("utf-8"))
        check_ledger(ledger, job)
    complete = max(0, min(job.horizon, math.floor((now - job.origin) / job.step_seconds)))
    stored = [_join(folder, "records-*.jsonl") for _, folder in checkpoints]
    if complete <= released:
        return {"released_before": released, "released_after": released, "new_steps": 0,
                "records": stored, "spent": "nothing (no newly complete step)"}
    folder = _join(state_dir, f"ckpt-{complete:08d}-{uuid.uuid4().hex[:8]}")
    options = PipelineOptions(list(beam_args) if any(a.startswith("--runner") for a in beam_args)
                              else ["--runner=FnApiRunner", *beam_args])
    with beam.Pipeline(options=options) as pipeline:
        build(pipeline, job, transform, released, complete, previous, folder)
    runs = (ledger or {}).get("runs", []) + [{
        "at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "steps": [released, complete]}]
    _write_text(_join(folder, LEDGER), json.dumps({"release": fingerprint(job), "runs": runs},
                                                  indent=2, sort_keys=True))
    _write_text(_join(folder, COMMITTED), "")
    return {"released_before": released, "released_after": complete,
            "new_steps": complete - released, "records": stored + [
                _join(folder, "records-*.jsonl")],
            "spent": "the release's budget (once for all T steps)" if released == 0 else
                     "nothing new (the budget covers all T steps of this release)"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.schedule", description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--now", help="ISO-8601 time (default: the current time)")
    args, beam_args = parser.parse_known_args(argv)
    try:
        now = job_config.parse_time("now", args.now) if args.now else time.time()
        summary = run_once(args.config, args.state_dir, now, beam_args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"steps released: {summary['released_before']} -> {summary['released_after']} "
          f"({summary['new_steps']} new); budget spent: {summary['spent']}")
    for pattern in summary["records"]:
        print(f"records: {pattern}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

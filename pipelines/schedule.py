"""Scheduled runs that continue one continual release across many runs.

    python3 -m pipelines.schedule --config configs/active_users.yaml --state-dir state/ \\
        [--now 2026-01-06T12:00:00Z] [any Beam pipeline option]

Each run releases the steps whose windows are complete at `--now` (default: the current time)
and were not released before, then checkpoints. The state directory (a local path or any Beam
filesystem path) holds committed checkpoints `ckpt-<steps released>-<id>/` with
- `units-*`: every privacy unit's truncation state (versioned JSON lines, no pickle),
- `keys-*`: every public key's mechanism state (17 bytes) and fail-closed halt step,
- `records-*.jsonl`: the records this run released, `dead_letters-*.jsonl`,
- `ledger.json`: the release (its id, descriptor and digest, resolved mechanism and parameters,
  an HMAC fingerprint of the secret, never the secret) and its runs.
A checkpoint becomes visible only through its commit marker `commits/from-<first step>.json`,
created with create-if-absent (O_EXCL on local paths, a generation-match precondition on gs://):
of two runs that start from the same step, exactly one commits; the other exits non-zero and
publishes nothing (records reach `output.path/<job>-scheduled/` only after the commit).
Guarantees (each tested): resuming after N runs gives records identical to one continuous run
(same insecure seed); re-running when nothing new is complete returns the stored records and
spends nothing; a run killed mid-way leaves the previous checkpoint intact and the next run
completes correctly; a config whose budget, horizon, mechanism, secret or any other release
field differs from the ledger is refused. Without a configured secret (or with `secret: {stored:
true}`) the secret is generated once into `<state-dir>/secret` with mode 0600; it is never logged
or written to outputs.

Input: the event source must still hold the events of the steps being released (for example
the full history, or every file since the last run); events of already released steps are
dead letters ("late"), events of incomplete steps are left for a later run.
"""
from __future__ import annotations

import argparse
import datetime
import errno
import json
import math
import os
import secrets
import sys
import time
import uuid
from typing import List, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import config as job_config
from pipelines import run as job_run
from transforms.continual import (DEAD_LETTER, HALT_VALUE, _advance_unit, _Aggregate,
                                  _AssignStep, _by_step, key_text, make_record, noise_stream,
                                  release_parts)
from transforms.mechanisms.base import state_from_bytes
from transforms.secret import SecretRef
from transforms.sinks import WriteRecordsToJsonLines
from transforms.streams import codec

COMMITTED = "_COMMITTED"
LEDGER = "ledger.json"
COMMITS = "commits"


class ConcurrentRun(RuntimeError):
    """Another run committed the same steps first; this run published nothing."""


def encode(value) -> str:
    """A checkpoint line: versioned JSON of plain values and known state classes (never
    pickle: a state directory in a writable bucket must not be able to run code)."""
    return codec.dumps(value)


def decode(line: str):
    return codec.loads(line)


def _join(*parts) -> str:
    return FileSystems.join(*parts)


def _marker(state_dir: str, released: int) -> str:
    return _join(state_dir, COMMITS, f"from-{released:08d}.json")


def committed_checkpoints(state_dir: str) -> List[Tuple[int, str]]:
    """The chain of committed checkpoints [(steps released, folder)], following the commit
    markers from step 0 (a checkpoint folder without a marker is a killed or losing run)."""
    out, released = [], 0
    while FileSystems.exists(_marker(state_dir, released)):
        with FileSystems.open(_marker(state_dir, released)) as handle:
            marker = json.loads(handle.read().decode("utf-8"))
        out.append((marker["steps"][1], marker["checkpoint"]))
        released = marker["steps"][1]
    return out


def create_if_absent(path: str, data: bytes) -> bool:
    """Atomically create `path` with `data` unless it exists: True if this call created it.

    Local paths: O_CREAT | O_EXCL. gs://: an object write with if_generation_match=0 (needs
    google-cloud-storage, the [gcp] extra; GCS preconditions are strongly consistent). Other
    filesystems offer no atomic create-if-absent through Beam and are refused."""
    if "://" not in path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except OSError as error:
            if error.errno == errno.EEXIST:
                return False
            raise
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        return True
    if path.startswith("gs://"):
        from google.api_core.exceptions import PreconditionFailed
        from google.cloud import storage
        bucket, _, name = path[len("gs://"):].partition("/")
        try:
            storage.Client().bucket(bucket).blob(name).upload_from_string(
                data, if_generation_match=0)
        except PreconditionFailed:
            return False
        return True
    job_config.fail("--state-dir", "a local path or gs:// (committing needs an atomic "
                                   "create-if-absent)", path)


def fingerprint(job: job_config.JobConfig) -> dict:
    return {"transform": job.transform, "fields": job.fields,
            "timestamp_format": job.timestamp_format, "origin": job.origin,
            "step_seconds": job.step_seconds,
            "horizon": job.horizon, "privacy": job.privacy, "noise": job.noise,
            "bounds": job.bounds, "public_keys": job.public_keys, "mechanism": job.mechanism,
            "mechanism_params": job.mechanism_params, "confidence": job.confidence}


NEW_STATE_DIRECTORY = ("a new state directory would be a new release: it spends the budget "
                       "again on the same data")


def check_ledger(ledger: dict, job: job_config.JobConfig, secret_fingerprint: str) -> None:
    """Refuse a run that differs from the release this state directory started."""
    if ledger.get("secret_fingerprint") != secret_fingerprint:
        job_config.fail("secret", f"the secret this release started with (fingerprint "
                                  f"{ledger.get('secret_fingerprint', '?')[:12]}...; "
                                  f"{NEW_STATE_DIRECTORY})",
                        f"a secret with fingerprint {secret_fingerprint[:12]}...")
    spent = ledger["config"]
    for name, value in fingerprint(job).items():
        if name == "mechanism" and value == "auto":
            continue  # the ledger's resolved mechanism is used
        if spent.get(name) != value:
            job_config.fail(name, f"what this release was started with ({spent.get(name)!r}; "
                                  f"{NEW_STATE_DIRECTORY})", value)


def stored_secret(state_dir: str) -> SecretRef:
    """The release's secret kept in the state directory: created once, atomically, mode 0600
    from the start on local paths (no readable window, no overwrite by a concurrent run)."""
    path = _join(state_dir, "secret")
    if "://" not in path:
        os.makedirs(state_dir, exist_ok=True)
        try:
            handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            return SecretRef(path=path)
        with os.fdopen(handle, "wb") as out:
            out.write(secrets.token_hex(32).encode("ascii"))
        return SecretRef(path=path)
    if not FileSystems.exists(path):  # object stores: access is the bucket's IAM policy
        create_if_absent(path, secrets.token_hex(32).encode("ascii"))
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
        expected = self.config.secret_fingerprint
        if expected is not None and self.config.noise.fingerprint() != expected:
            job_config.fail("secret", f"the secret this release started with (fingerprint "
                                      f"{expected[:12]}...) on the worker too", "another secret")

    def process(self, item):
        key, grouped = item
        saved = list(grouped["state"])
        if saved and saved[0][2] != self.config.release_id:
            job_config.fail("state", f"key states of release {self.config.release_id}",
                            f"key states of release {saved[0][2]}")
        counter, halted = (state_from_bytes(saved[0][0]), saved[0][1]) if saved else (
            self.mechanism.init_state() if self.released == 0 else None, None)
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
        yield beam.pvalue.TaggedOutput("key_state", encode((key, (counter.to_bytes(), halted, self.config.release_id))))


def _read_states(pipeline, label, pattern):
    if not FileSystems.match([pattern])[0].metadata_list:
        return pipeline | f"No{label}" >> beam.Create([])
    return (pipeline | f"Read{label}" >> beam.io.ReadFromText(pattern)
            | f"Decode{label}" >> beam.Map(decode))


def build(pipeline, job, transform, released, complete, previous, folder):
    """The bounded pipeline of one scheduled run; returns nothing (writes under `folder`)."""
    problem, steps = transform.problem, transform.steps
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
            pass  # left for a later run (no metric: the count depends on private data)
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
    secret = stored_secret(state_dir) if "stored" in job.secret or not job.secret else \
        SecretRef(**job.secret)
    secret_fingerprint = secret.fingerprint()
    checkpoints = committed_checkpoints(state_dir)
    released, previous = checkpoints[-1] if checkpoints else (0, None)
    ledger = None
    if previous:
        with FileSystems.open(_join(previous, LEDGER)) as handle:
            ledger = json.loads(handle.read().decode("utf-8"))
        check_ledger(ledger, job, secret_fingerprint)
        transform = job_run.build_transform(
            job, secret, release_id=ledger["release_id"],
            mechanism=(ledger["mechanism"], ledger["mechanism_params"]),
            secret_fingerprint=secret_fingerprint)
        if transform.descriptor != ledger["descriptor"]:
            changed = sorted(k for k in set(ledger["descriptor"]) | set(transform.descriptor)
                             if ledger["descriptor"].get(k) != transform.descriptor.get(k))
            job_config.fail(f"release.{changed[0]}", f"what this release was started with "
                                                     f"({NEW_STATE_DIRECTORY})", changed)
    else:
        transform = job_run.build_transform(job, secret, secret_fingerprint=secret_fingerprint)
    republish_missing(job, checkpoints)
    complete = max(0, min(job.horizon, math.floor((now - job.origin) / job.step_seconds)))
    stored = [_join(folder, "records-*.jsonl") for _, folder in checkpoints]
    if complete <= released:
        return {"released_before": released, "released_after": released, "new_steps": 0,
                "records": stored, "release_id": transform.release_id,
                "spent": "nothing (no newly complete step)"}
    folder = _join(state_dir, f"ckpt-{complete:08d}-{uuid.uuid4().hex[:8]}")
    options = PipelineOptions(list(beam_args) if any(a.startswith("--runner") for a in beam_args)
                              else ["--runner=FnApiRunner", *beam_args])
    with beam.Pipeline(options=options) as pipeline:
        build(pipeline, job, transform, released, complete, previous, folder)
    runs = (ledger or {}).get("runs", []) + [{
        "at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "steps": [released, complete]}]
    _write_text(_join(folder, LEDGER), json.dumps({
        "release_id": transform.release_id, "descriptor": transform.descriptor,
        "descriptor_digest": transform.config.descriptor_digest,
        "mechanism": transform.config.mechanism,
        "mechanism_params": dict(transform.config.params),
        "secret_fingerprint": secret_fingerprint, "private": transform.private,
        "config": fingerprint(job), "runs": runs}, indent=2, sort_keys=True, default=str))
    marker = json.dumps({"checkpoint": folder, "steps": [released, complete],
                         "release_id": transform.release_id}).encode("utf-8")
    if not create_if_absent(_marker(state_dir, released), marker):
        raise ConcurrentRun(f"another run already committed steps from {released} in the "
                            f"state directory {state_dir}; this run published nothing")
    with FileSystems.open(_marker(state_dir, released)) as handle:  # re-check after commit
        if json.loads(handle.read().decode("utf-8"))["checkpoint"] != folder:
            raise ConcurrentRun(f"the commit marker of steps from {released} in {state_dir} "
                                f"names another run; this run published nothing")
    _write_text(_join(folder, COMMITTED), "")
    publish(job, folder, released, complete)
    return {"released_before": released, "released_after": complete,
            "new_steps": complete - released, "release_id": transform.release_id,
            "records": stored + [_join(folder, "records-*.jsonl")],
            "spent": "the release's budget (once for all T steps)" if released == 0 else
                     "nothing new (the budget covers all T steps of this release)"}


def _published_prefix(job, released, complete) -> str:
    # a folder of its own, so a report over `pipelines.run`'s records never mixes the two
    return os.path.join(job.output_path, f"{job.job}-scheduled",
                        f"records-steps-{released}-{complete}")


def republish_missing(job, checkpoints) -> None:
    """A run killed between its commit and `publish` left committed records unpublished: the
    next run publishes them (the same records: they are read from the checkpoint)."""
    start = 0
    for complete, folder in checkpoints:
        if not FileSystems.match([_published_prefix(job, start, complete) + "-*"])[0] \
                .metadata_list:
            publish(job, folder, start, complete)
        start = complete


def publish(job, folder, released, complete) -> None:
    """After the commit: the run's records, in the configured formats, into output.path."""
    rows = []
    for meta in FileSystems.match([_join(folder, "records-*.jsonl")])[0].metadata_list:
        with FileSystems.open(meta.path) as handle:
            rows.extend(json.loads(line) for line in handle.read().decode("utf-8").splitlines()
                        if line.strip())
    rows.sort(key=lambda r: (r["key"], r["step"]))
    out = _published_prefix(job, released, complete)
    from transforms.sinks import write_records_files
    write_records_files(rows, out, job.output_formats)


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
    except ConcurrentRun as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    print(f"release {summary['release_id']}")
    print(f"steps released: {summary['released_before']} -> {summary['released_after']} "
          f"({summary['new_steps']} new); budget spent: {summary['spent']}")
    for pattern in summary["records"]:
        print(f"records: {pattern}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scheduled runs that continue one continual release across many runs.

    python3 -m pipelines.schedule --config configs/active_users.yaml --state-dir state/ \\
        [--now 2026-01-06T12:00:00Z] [any Beam pipeline option]

Each run releases the steps whose windows are complete at `--now` (default: the current time)
and were not released before, then checkpoints. The state directory (a local path or any Beam
filesystem path) holds committed checkpoints `ckpt-<steps released>-<id>/` with
- `units-*`: every privacy unit's truncation state (versioned JSON lines, no pickle),
- `keys-*`: every public key's sealed mechanism state (a 16-byte release/secret/key tag, then
  17 bytes, or the input history for the discrete sqrt_toeplitz) and fail-closed halt step,
- `records-*.jsonl`: the records this run released, `dead_letters-*.jsonl`,
- `ledger.json`: the release (its id, descriptor and digest, resolved mechanism and parameters,
  an HMAC fingerprint of the secret, never the secret) and its runs,
- `manifest.json`: every file above with its size, line count and SHA-256.
A checkpoint becomes visible only through its commit marker `commits/from-<first step>.json`
(which records the manifest's SHA-256; the next run verifies every file before resuming),
created with create-if-absent (O_EXCL on local paths, a generation-match precondition on gs://):
of two runs that start from the same step, exactly one commits; the other exits non-zero and
publishes nothing (records reach `output.path/<job>-scheduled/<release id>/` only after the
commit). The commit is the job's own last stage (`pipelines.commit`), so a launcher that does
not wait for the job (a Flex Template) commits the same way.
Guarantees (each tested): resuming after N runs gives records identical to one continuous run
(same insecure seed); re-running when nothing new is complete returns the stored records and
spends nothing; a run killed mid-way leaves the previous checkpoint intact and the next run
completes correctly; a config whose budget, horizon, mechanism, secret or any other release
field differs from the ledger is refused. Without a configured secret (or with `secret: {stored:
true}`) the secret is generated once into `<state-dir>/secret` with mode 0600; it is never logged
or written to outputs.

Input: the event source must still hold the events of the steps being released (for example
the full history, or every file since the last run); events of already released steps are
skipped, events of incomplete steps are left for a later run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import uuid
from typing import Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import config as job_config
from pipelines import io, logs
from pipelines import run as job_run
from pipelines.checkpoints import (LEDGER, NEW_STATE_DIRECTORY, ConcurrentRun, check_ledger,
                                   committed_checkpoints, fingerprint, join, marker_path,
                                   read_json, read_states, remove_stale_checkpoints,
                                   same_checkpoint, stored_secret, verify_checkpoint, write_states,
                                   verify_marker)
from pipelines.commit import (CommitCheckpoint, NotCommitted, after_writes, guard, guarded,
                              staged_only)
from transforms.mechanisms import noise
from transforms.sinks import WriteRecordsToJsonLines, records_file, write_records_files
from transforms.stages import StepWindow


def committed_manifest(state_dir, checkpoints, secret) -> str:
    """The manifest SHA-256 the last commit marker recorded, once the marker's MAC verifies
    under the release's secret."""
    start = checkpoints[-2][0] if len(checkpoints) > 1 else 0
    path = marker_path(state_dir, start)
    return verify_marker(read_json(path), secret, path)


def build(pipeline, job, transform, released, complete, previous, folder, listed=None,
          state_dir=None) -> list:
    """One scheduled run: the steps [released, complete) of the same composition that
    `pipelines.run` runs, continued from the previous checkpoint (its verified files `listed`);
    writes under `folder` and returns the writes (PCollections of written file names). With
    `state_dir`, every write waits for the guard that these steps are not committed yet."""
    elements, dead = io.read_elements(pipeline, job)
    # elements of the transform, timestamped with event time
    unit_states = read_states(pipeline, "UnitStates", previous, "units", listed)
    key_states = read_states(pipeline, "KeyStates", previous, "keys", listed)
    # (unit, state) and (key, (tagged mechanism state, halt step)) of the previous run
    result = elements | job.transform >> transform.resume(StepWindow(released, complete),
                                                          unit_states, key_states)
    # records of the window's steps + dead letters + the new unit and key states
    passed = guard(pipeline, NotCommitted(state_dir, released), "NotCommittedYet") \
        if state_dir else None

    def checked(pcoll, label):
        return guarded(pcoll, passed, f"Checked{label}") if passed is not None else pcoll

    dead_letters = dead + [result.dead_letters] | "DeadLetters" >> beam.Flatten()
    return [checked(result.records, "Records") | "StoreRecords" >> WriteRecordsToJsonLines(
                join(folder, "records")),
            write_states(checked(result.unit_states, "UnitStates"), "UnitStates", folder,
                         "units"),
            write_states(checked(result.key_states, "KeyStates"), "KeyStates", folder, "keys"),
            checked(dead_letters, "DeadLetters") | "StoreDeadLetters" >> WriteRecordsToJsonLines(
                join(folder, "dead_letters"))]


def started_noise_version(ledger: dict) -> Optional[str]:
    """The noise derivation version a release started with (its descriptor's
    `noise_derivation`, "v3/binary_tree/1"), if this code still derives it; else None (the
    newest is built, and the descriptor check below refuses to continue)."""
    descriptor = ledger.get("descriptor")
    derivation = descriptor.get("noise_derivation") if isinstance(descriptor, dict) else None
    version = derivation.split("/")[0] if isinstance(derivation, str) else None
    return version if version in noise.NOISE_VERSIONS else None


def run_once(config_path: str, state_dir: str, now: float, beam_args=()) -> dict:
    """One scheduled run; returns a summary dict (steps released before/after, folders)."""
    job = job_config.load(config_path)
    io.preflight(job, job_run.runner_of(list(beam_args)) in job_run.LOCAL_RUNNERS)
    secret = job.secret.ref() if job.secret.configured else stored_secret(state_dir)
    secret_fingerprint = secret.fingerprint()
    checkpoints = committed_checkpoints(state_dir)
    released, previous = checkpoints[-1] if checkpoints else (0, None)
    ledger, listed = None, None
    if previous:
        try:  # another secret: say so first (its MAC below could never verify)
            started = read_json(join(previous, LEDGER)).get("secret_fingerprint")
        except (OSError, IOError, ValueError, AttributeError):
            started = None
        if started is not None and started != secret_fingerprint:
            check_ledger({"secret_fingerprint": started}, job, secret_fingerprint)
        listed = verify_checkpoint(previous, committed_manifest(state_dir, checkpoints, secret))
        ledger = read_json(join(previous, LEDGER))
        check_ledger(ledger, job, secret_fingerprint)
        transform = job_run.build_transform(
            job, secret, release_id=ledger["release_id"],
            mechanism=(ledger["mechanism"], ledger["mechanism_params"]),
            secret_fingerprint=secret_fingerprint, noise_version=started_noise_version(ledger))
        if transform.descriptor != ledger["descriptor"]:
            changed = sorted(k for k in set(ledger["descriptor"]) | set(transform.descriptor)
                             if ledger["descriptor"].get(k) != transform.descriptor.get(k))
            job_config.fail(f"release.{changed[0]}", f"what this release was started with "
                                                     f"({NEW_STATE_DIRECTORY})", changed)
    else:
        transform = job_run.build_transform(job, secret, secret_fingerprint=secret_fingerprint)
    remove_stale_checkpoints(state_dir, released, [folder for _, folder in checkpoints])
    republish_missing(job, transform.release_id, checkpoints)
    steps = job.steps
    complete = max(0, min(steps.horizon, math.floor((now - steps.origin) / steps.size_seconds)))
    stored = [join(folder, "records-*.jsonl") for _, folder in checkpoints]
    if complete <= released:
        return {"released_before": released, "released_after": released, "new_steps": 0,
                "records": stored, "release_id": transform.release_id,
                "published": published_folder(job, transform.release_id),
                "spent": "nothing (no newly complete step)"}
    folder = join(state_dir, f"ckpt-{complete:08d}-{uuid.uuid4().hex[:8]}")
    ledger_of_run = {
        "release_id": transform.release_id, "descriptor": transform.descriptor,
        "descriptor_digest": transform.config.descriptor_digest,
        "mechanism": transform.config.mechanism,
        "mechanism_params": dict(transform.config.params),
        "secret_fingerprint": secret_fingerprint, "private": transform.private,
        "config": fingerprint(job), "runs": (ledger or {}).get("runs", []) + [{
            "at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "steps": [released, complete]}]}  # fixed here: every commit attempt writes these bytes
    beam_args = list(beam_args)
    options = PipelineOptions(beam_args if any(a.startswith("--runner") for a in beam_args)
                              else ["--runner=FnApiRunner", *beam_args])
    pipeline = beam.Pipeline(options=options)
    writes = build(pipeline, job, transform, released, complete, previous, folder, listed,
                   state_dir)
    after_writes(pipeline, writes, CommitCheckpoint(job, state_dir, folder, released, complete,
                                                    secret, ledger_of_run, publish),
                 "CommitCheckpoint")
    try:
        result = pipeline.run()
        if staged_only(beam_args):
            return {"released_before": released, "released_after": released, "new_steps": 0,
                    "staged": [released, complete], "release_id": transform.release_id,
                    "records": stored, "published": published_folder(job, transform.release_id),
                    "spent": "nothing yet (the job is staged; it commits steps "
                             f"{released} -> {complete} as its last stage when it runs)"}
        result.wait_until_finish()
    except Exception:
        if committed_by_another(state_dir, released, folder):
            raise ConcurrentRun(f"another run already committed steps from {released} in the "
                                f"state directory {state_dir}; this run published nothing")
        raise
    return {"released_before": released, "released_after": complete,
            "new_steps": complete - released, "release_id": transform.release_id,
            "records": stored + [join(folder, "records-*.jsonl")],
            "published": published_folder(job, transform.release_id),
            "spent": "the release's budget (once for all T steps)" if released == 0 else
                     "nothing new (the budget covers all T steps of this release)"}


def committed_by_another(state_dir: str, released: int, folder: str) -> bool:
    try:
        return not same_checkpoint(read_json(marker_path(state_dir, released)).get("checkpoint"),
                                   folder)
    except (OSError, IOError, ValueError, AttributeError):
        return False


def published_folder(job, release_id: str) -> str:
    """`<output.path>/<job>-scheduled/<release id>/`: a folder per release, so neither a plain
    run's records nor another state directory's release ever mix into it."""
    return os.path.join(job.output.path, f"{job.job}-scheduled", release_id)


def _published_prefix(job, release_id, released, complete) -> str:
    return os.path.join(published_folder(job, release_id),
                        f"records-steps-{released}-{complete}")


def republish_missing(job, release_id, checkpoints) -> None:
    """A run killed between its commit and the end of `publish` left committed records
    unpublished (or some formats missing): the next run publishes them (the same records:
    they are read from the checkpoint; a half-written file only exists as `.partial`)."""
    start = 0
    for complete, folder in checkpoints:
        prefix = _published_prefix(job, release_id, start, complete)
        if not all(FileSystems.exists(records_file(prefix, fmt)) for fmt in job.output.formats):
            publish(job, release_id, folder, start, complete)
        start = complete


def publish(job, release_id, folder, released, complete) -> None:
    """After the commit: the run's records, in the configured formats, into output.path."""
    rows = []
    for meta in FileSystems.match([join(folder, "records-*.jsonl")])[0].metadata_list:
        with FileSystems.open(meta.path) as handle:
            rows.extend(json.loads(line) for line in handle.read().decode("utf-8").splitlines()
                        if line.strip())
    rows.sort(key=lambda r: (r["key"], r["step"]))
    out = _published_prefix(job, release_id, released, complete)
    write_records_files(rows, out, job.output.formats)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pipelines.schedule", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True,
                        help="the job's YAML config (the same for every run of the release)")
    parser.add_argument("--state-dir", required=True,
                        help="local path or gs:// folder holding the release's checkpoints")
    parser.add_argument("--now", help="ISO-8601 time (default: the current time); steps that "
                                      "end by then are released")
    parser.add_argument("--verbose", action="store_true",
                        help="show Beam's own logs (quiet by default)")
    args, beam_args = parser.parse_known_args(argv)
    logs.configure(args.verbose)
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
    if "staged" in summary:
        first, last = summary["staged"]
        print(f"job staged, not run: when it runs, its last stage commits steps {first} -> "
              f"{last} and publishes them to {summary['published']}/records-steps-*")
        return 0
    print(f"steps released: {summary['released_before']} -> {summary['released_after']} "
          f"({summary['new_steps']} new); budget spent: {summary['spent']}")
    print(f"published records: {summary['published']}/records-steps-*")
    for pattern in summary["records"]:
        print(f"checkpointed records: {pattern}")
    return 0


if __name__ == "__main__":
    logs.exit_now(main())

"""Scheduled runs that continue one continual release across many runs.

    python3 -m pipelines.schedule --config configs/active_users.yaml --state-dir state/ \\
        [--now 2026-01-06T12:00:00Z] [--json] [any Beam pipeline option]

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
created with create-if-absent (a fsynced temporary file hard-linked to the marker's name on
local paths, a generation-match precondition on gs://):
of two runs that start from the same step, exactly one commits; the other exits non-zero and
publishes nothing (records reach `output.path/<job>-scheduled/<release id>/` only after the
commit, and so does `release.json`, the release manifest as `pipelines.run` writes it, kept in
the ledger). The commit is the job's own last stage (`pipelines.commit`), so a launcher that does
not wait for the job (a Flex Template) commits the same way.

Each run prints what `pipelines.run` prints (`--json`: one JSON object with a `public` and an
`operator_not_private` part): the mechanism and why, MaxSE, the steps released by this run and
the budget spent, where the records and the manifest are, then, operator-only and NOT private,
this run's truncation counts and dead letters (and a warning when the bounds cut more than half
of the events), and `release complete` once every step of the horizon is released.

Guarantees (each tested): resuming after N runs gives records identical to one continuous run
(same insecure seed); re-running when nothing new is complete returns the stored records and
spends nothing; a run killed mid-way leaves the previous checkpoint intact and the next run
completes correctly; a config whose budget, horizon, mechanism, secret or any other release
field differs from the ledger is refused. Crash-consistent: every file a commit writes appears
whole or not at all (`pipelines.storage`); checkpoints or published sets that the commit markers
do not cover (deleted markers) are refused, never a fresh start (`refuse_unmarked`); every run
checks each published file against its verified checkpoint and rewrites a missing, truncated
or altered one (`republish_missing`); a full disk or a read-only folder ends in one line naming
the path (exit code 2). Without a configured secret (or with `secret: {stored:
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
import re
import sys
import time
import uuid
from typing import List, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import config as job_config
from pipelines import budget, engines, gate, io, local_dofns, logs, remote, storage
from pipelines import run as job_run
from pipelines.checkpoints import (COMMITS, COMMITTED, LEDGER, NEW_STATE_DIRECTORY,
                                   ConcurrentRun, check_ledger, create_if_absent,
                                   fingerprint, join,
                                   marker_chain, marker_path, read_json, read_states,
                                   remove_stale_checkpoints, remove_torn_markers,
                                   same_checkpoint, stored_secret, verified_file,
                                   verified_manifest, verify_checkpoint, write_states,
                                   verify_marker, write_text)
from pipelines.commit import (CommitCheckpoint, ScheduledRunClaim, after_writes, guard, guarded,
                              staged_only)
from pipelines.operator_summary import operator_summary
from transforms.mechanisms import noise
from transforms.mechanisms.choose import state_bytes_per_key
from transforms import sinks
from transforms.sinks import WriteRecordsToJsonLines, encode_records, records_file
from transforms.messages import StepWindow


def committed_manifest(state_dir, checkpoints, secret) -> str:
    """The manifest SHA-256 the last commit marker recorded, once the marker's MAC verifies
    under the release's secret."""
    start = checkpoints[-2][0] if len(checkpoints) > 1 else 0
    path = marker_path(state_dir, start)
    return verify_marker(read_json(path), secret, path)


def build(pipeline, job, transform, released, complete, previous, folder, listed=None,
          state_dir=None):
    """One scheduled run: the steps [released, complete) of the same composition that
    `pipelines.run` runs, continued from the previous checkpoint (its verified files `listed`);
    writes under `folder`. Returns (the writes: PCollections of written file names, the
    claim's singleton or None). With `state_dir`, every write waits for the run's claim
    (`ScheduledRunClaim`: these steps are not committed yet, and no other execution of this
    graph claimed its folder); the singleton holds the execution's token for the commit."""
    passed = guard(pipeline, ScheduledRunClaim(state_dir, released, folder), "ClaimRun") \
        if state_dir else None
    # one element once this run claimed its checkpoint folder: every write waits for it
    elements, dead = io.read_elements(pipeline, job)
    # elements of the transform, timestamped with event time
    unit_states = read_states(pipeline, "UnitStates", previous, "units", listed)
    key_states = read_states(pipeline, "KeyStates", previous, "keys", listed)
    # (unit, state) and (key, (tagged mechanism state, halt step)) of the previous run
    transform = transform.resume(StepWindow(released, complete), unit_states, key_states)
    if passed is not None:  # every output of the transform waits for the run's claim
        transform.claimed_by(passed)
    result = elements | job.transform >> transform
    # records of the window's steps + dead letters + the new unit and key states
    # the private gate runs once, in the run that starts the release (a unit's votes in every
    # run would spend its share again each run); later runs check the structure only
    rule = gate.Gate.of(job, transform.plan, private=released == 0 and transform.noisy)
    verdict = gate.decide(pipeline, rule, transform, elements, dead,
                          dead + [result.dead_letters], after=passed)
    records, unit_states, key_states = (
        gate.gated(pcoll, verdict, f"InputGate{name}") for name, pcoll in (
            ("Records", result.records), ("UnitStates", result.unit_states),
            ("KeyStates", result.key_states)))
    # the same, once the input's dead letters passed the gate (else the run fails)
    dead_letters = dead + [result.dead_letters] | "DeadLetters" >> beam.Flatten()
    if passed is not None:  # the transform's outputs wait for the claim already
        dead_letters = guarded(dead_letters, passed, "CheckedDeadLetters")
    return [records | "StoreRecords" >> WriteRecordsToJsonLines(join(folder, "records")),
            write_states(unit_states, "UnitStates", folder, "units"),
            write_states(key_states, "KeyStates", folder, "keys"),
            dead_letters | "StoreDeadLetters" >> WriteRecordsToJsonLines(
                join(folder, "dead_letters"))], passed


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
    local_dofns.remember_specs()  # Beam's lookup of a DoFn's state and timers, once per DoFn
    job = job_config.load(config_path)
    io.check_bounded_options(beam_args, job)
    runner = engines.runner_of(list(beam_args))
    beam_args, local = engines.prepared(list(beam_args))  # Flink, Spark: the installed jars
    if not local:  # its workers write the checkpoints too
        remote.preflight(job, runner, [("--state-dir", state_dir)])
    io.preflight(job, local, runner)
    remove_torn_markers(state_dir)  # empty markers of a version before atomic creation
    secret = job.secret.ref() if job.secret.configured else stored_secret(state_dir)
    secret_fingerprint = secret.fingerprint()
    chain = marker_chain(state_dir)
    checkpoints = [(link["end"], link["folder"]) for link in chain]
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
    refuse_unmarked(job, state_dir)  # deleted markers: never a fresh start
    remove_stale_checkpoints(state_dir, released, [folder for _, folder in checkpoints])
    republish_missing(job, transform.release_id, chain, secret)
    for path in foreign_files(job, transform.release_id, chain):
        if os.path.basename(path).startswith("records-steps-"):  # read as the release's own
            job_config.fail("published folder", "holding only the files of the release's "
                                                "committed windows (remove the file)", path)
        print(f"warning: {path} is not a file of release {transform.release_id} (left in "
              f"place; the release's files are release.json and records-steps-*)",
              file=sys.stderr)
    steps = job.steps
    complete = max(0, min(steps.horizon, math.floor((now - steps.origin) / steps.size_seconds)))
    stored = [join(folder, "records-*.jsonl") for _, folder in checkpoints]
    if complete <= released:
        return summarised(config_path, job, transform, {
            "released_before": released, "released_after": released, "new_steps": 0,
            "records": stored, "release_id": transform.release_id,
            "published": published_folder(job, transform.release_id),
            "spent": "nothing (no newly complete step)"})
    every = "every step" if steps.unbounded else "all T steps"
    ledger_state = budget.charge(job, transform)  # its first run records it, once
    folder = join(state_dir, f"ckpt-{complete:08d}-{uuid.uuid4().hex[:8]}")
    manifest = job_run.release_manifest(transform, ledger_state and {  # stable across runs
        k: ledger_state[k] for k in ("source", "period", "entry", "limit")})
    # the runs the gate refused before the release started, carried by every later run
    before = refusals_before(state_dir, transform) if ledger is None else \
        ledger.get("release_manifest", {}).get("gate_refusals_before")
    if before is not None and before["count"]:
        manifest["gate_refusals_before"] = before
    ledger_of_run = {
        "release_id": transform.release_id, "descriptor": transform.descriptor,
        "release_manifest": manifest,  # published as release.json
        "descriptor_digest": transform.descriptor_digest,
        "mechanism": transform.resolved_mechanism[0],
        "mechanism_params": transform.resolved_mechanism[1],
        "secret_fingerprint": secret_fingerprint, "private": transform.private,
        "config": fingerprint(job), "runs": (ledger or {}).get("runs", []) + [{
            "at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "steps": [released, complete]}]}  # fixed here: every commit attempt writes these bytes
    # a Flink or Spark run: its job server until the summary read its metrics
    with engines.job_server(list(beam_args)) as beam_args:
        options = PipelineOptions(beam_args if any(a.startswith("--runner") for a in beam_args)
                                  else ["--runner=FnApiRunner", *beam_args])
        pipeline = beam.Pipeline(options=options)
        writes, passed = build(pipeline, job, transform, released, complete, previous, folder,
                               listed, state_dir)
        after_writes(pipeline, writes, CommitCheckpoint(job, state_dir, folder, released, complete,
                                                        secret, ledger_of_run, publish),
                     "CommitCheckpoint", execution=passed)
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
        return summarised(config_path, job, transform, {
            "released_before": released, "released_after": complete,
            "new_steps": complete - released, "release_id": transform.release_id,
            "records": stored + [join(folder, "records-*.jsonl")],
            "published": published_folder(job, transform.release_id),
            "spent": f"the release's budget (once for {every})" if released == 0 else
                     f"nothing new (the budget covers {every} of this release)",
            "budget_ledger": ledger_state}, result, folder)


def summarised(config_path: str, job, transform, summary: dict, result=None,
               folder: str = None) -> dict:
    """`summary` with what `pipelines.run` summarises (its functions, one rule): `public`
    (the release, its MaxSE from the records published so far, this run's steps, where the
    records and release.json are) and, when this run ran (its Beam `result` and checkpoint
    `folder`), `operator_not_private` (exact counts of this run's steps: truncation, dead
    letters, the truncation warning); `job` and `transform` for `describe_run`."""
    published = summary["published"]
    public = job_run.public_summary(transform, job, published, shown_folder=published,
                                    records_prefix="records-steps",
                                    released=summary["released_after"])
    public.update({name: summary[name] for name in ("released_before", "released_after",
                                                    "new_steps", "spent")},
                  checkpointed=summary["records"], checkpoint=folder,
                  budget_ledger=summary.get("budget_ledger"),
                  complete=summary["released_after"] >= job.steps.horizon)
    name, noise = transform.resolved_mechanism[0], job.privacy.noise
    if job.steps.unbounded and state_bytes_per_key(name, job.steps.horizon, noise, 2) > \
            state_bytes_per_key(name, job.steps.horizon, noise, 1):  # a state that grows
        public["state_bytes_per_key_now"] = state_bytes_per_key(
            name, job.steps.horizon, noise, summary["released_after"])
    operator = None if result is None else operator_summary(result, folder, job, config_path)
    return dict(summary, job=job.job, public=public, operator_not_private=operator,
                job_config=job, transform=transform)


def committed_by_another(state_dir: str, released: int, folder: str) -> bool:
    try:
        return not same_checkpoint(read_json(marker_path(state_dir, released)).get("checkpoint"),
                                   folder)
    except (OSError, IOError, ValueError, AttributeError):
        return False


def published_root(job) -> str:
    """`<output.path>/<job>-scheduled/`: the scheduled releases of the job."""
    return os.path.join(job.output.path, f"{job.job}-scheduled")


def published_folder(job, release_id: str) -> str:
    """`<output.path>/<job>-scheduled/<release id>/`: a folder per release, so a plain run's
    records never mix into it (and a second release of the job there is refused:
    `refuse_unmarked`)."""
    return os.path.join(published_root(job), release_id)


_PUBLISHED = re.compile(r"records-steps-(\d+)-(\d+)-")


def published_sets(job) -> List[tuple]:
    """(release id, first step, end step, path) of every records file (or `.partial` of one)
    published under `<output.path>/<job>-scheduled/`."""
    root = published_root(job)
    if storage.is_local(root):
        paths = [os.path.join(root, release, name)
                 for release in (sorted(os.listdir(root)) if os.path.isdir(root) else [])
                 if os.path.isdir(os.path.join(root, release))
                 for name in sorted(os.listdir(os.path.join(root, release)))]
    else:
        paths = [m.path for m in FileSystems.match([join(root, "*", "records-steps-*")])[0]
                 .metadata_list]
    out = []
    for path in paths:
        match = _PUBLISHED.match(os.path.basename(path))
        if match:
            out.append((os.path.basename(os.path.dirname(path)), int(match.group(1)),
                        int(match.group(2)), path))
    return out


def committed_folders(state_dir: str) -> List[str]:
    """Checkpoint folders holding `_COMMITTED` (written only after their commit marker)."""
    if storage.is_local(state_dir):
        names = sorted(os.listdir(state_dir)) if os.path.isdir(state_dir) else []
        return [join(state_dir, n) for n in names if n.startswith("ckpt-")
                and os.path.isfile(os.path.join(state_dir, n, COMMITTED))]
    return sorted(os.path.dirname(m.path) for m in FileSystems.match(
        [join(state_dir, "ckpt-*", COMMITTED)])[0].metadata_list)


# (going on would publish those steps again, with fresh noise as a second release or with
# the same noise on other data: the budget spent twice; docs/operations.md says so)
UNMARKED = ("holding the markers of all the job committed ({what}: restore " + COMMITS
            + "/ from a backup, or give a new release another output.path or job)")


def refuse_unmarked(job, state_dir: str) -> None:
    """A state directory (or output) that holds committed checkpoints or published sets that
    its commit markers do not cover (the markers were deleted or lost, or the state directory
    is new but the job's output holds a release) is refused, never treated as a fresh start.
    `_COMMITTED` and published files are written only after their marker, so a killed run
    (no marker: nothing committed, nothing published) is retried normally. The evidence is
    listed before the markers are read: what a concurrent run commits in between is covered."""
    committed = committed_folders(state_dir)
    published = published_sets(job)
    chain = marker_chain(state_dir)
    marked = {os.path.basename(link["folder"].rstrip("/")) for link in chain}
    for folder in committed:
        if os.path.basename(folder.rstrip("/")) not in marked:
            job_config.fail("state directory", UNMARKED.format(
                what="a committed checkpoint has no marker"), folder)
    windows = {(link["release_id"], link["start"], link["end"]) for link in chain}
    for release_id, start, end, path in published:
        if (release_id, start, end) not in windows:
            job_config.fail("state directory", UNMARKED.format(
                what="a published set has no marker here"), path)


def _published_prefix(job, release_id, released, complete) -> str:
    return os.path.join(published_folder(job, release_id),
                        f"records-steps-{released}-{complete}")


def _rows(chunks) -> list:
    rows = [json.loads(line) for data in chunks for line in data.decode("utf-8").splitlines()
            if line.strip()]
    return sorted(rows, key=lambda r: (r["key"], r["step"]))


def _read_or_none(path: str) -> Optional[bytes]:
    try:
        with FileSystems.open(path) as handle:
            return handle.read()
    except (OSError, IOError):
        return None


def republish_missing(job, release_id, chain, secret) -> List[str]:
    """Completes and repairs the publication of every committed window: a run killed between
    its commit and the end of `publish` left records unpublished (or some formats missing),
    and a published file may have been truncated or altered since. Each window's checkpoint is
    verified (its marker's MAC under the secret, its manifest, its records files' SHA-256),
    every published file is compared with the bytes its records encode to (a pure function
    of the sorted rows) and any missing, truncated or altered one is rewritten (atomically),
    then `release.json`, from the last commit's verified ledger (`publish_manifest`).
    A commit killed before `_COMMITTED` gets it. Returns the rewritten files."""
    folder_out = published_folder(job, release_id)
    if storage.is_local(folder_out) and os.path.isdir(folder_out):
        storage.remove_stale_temps(folder_out)
        for name in os.listdir(folder_out):  # half-written files of versions before
            if name.endswith(".partial"):
                os.remove(os.path.join(folder_out, name))
    rewritten = []
    for link in chain:
        folder = link["folder"]
        storage.remove_stale_temps(folder)  # e.g. a `_COMMITTED` of a killed run (local)
        listed = verified_manifest(folder, verify_marker(link["marker"], secret, link["path"]))
        rows = _rows(verified_file(join(folder, name), listed) for name in sorted(listed)
                     if name.startswith("records-"))
        if not FileSystems.exists(join(folder, COMMITTED)):  # killed between marker and flag
            write_text(join(folder, COMMITTED), "")
        claim_publication(job, release_id, folder, link["start"], link["end"],
                          link["marker"].get("execution"))
        prefix = _published_prefix(job, release_id, link["start"], link["end"])
        for fmt in job.output.formats:
            data, path = encode_records(rows, fmt), records_file(prefix, fmt)
            if _read_or_none(path) != data:
                _write_published(path, data)
                rewritten.append(path)
    if chain:  # release.json from the last commit's verified ledger, after the records
        ledger = json.loads(verified_file(join(folder, LEDGER), listed).decode("utf-8"))
        rewritten += [path for path in [publish_manifest(job, release_id, ledger)] if path]
    return rewritten


def foreign_files(job, release_id, chain) -> List[str]:
    """The files in the release's published folder (local) that no committed window wrote:
    named so that readers of the folder (`pipelines.report` reads `records-*`) see them."""
    folder = published_folder(job, release_id)
    if not storage.is_local(folder) or not os.path.isdir(folder):
        return []
    expected = {"release.json"} | {
        os.path.basename(records_file(_published_prefix(job, release_id, link["start"],
                                                         link["end"]), fmt))
        for link in chain for fmt in job.output.formats}
    return [os.path.join(folder, name) for name in sorted(os.listdir(folder))
            if name not in expected and not name.startswith(storage.TEMP_PREFIX)]


def _write_published(path: str, data: bytes) -> None:
    """One published file, whole: locally replaced atomically; an object store's upload is
    atomic already."""
    if storage.is_local(path):
        storage.replace_atomically(path, data)
        return
    with FileSystems.create(path) as handle:
        handle.write(data)


def write_records_files(rows, prefix: str, formats) -> None:
    """The published files of `rows` (`prefix`-00000-of-00001.<fmt>), each replaced whole
    (local paths: a temporary file, fsynced, renamed into place; elsewhere as
    `transforms.sinks.write_records_files`)."""
    if not storage.is_local(prefix):
        sinks.write_records_files(rows, prefix, formats)
        return
    for fmt in formats:
        _write_published(records_file(prefix, fmt), encode_records(rows, fmt))


def claim_publication(job, release_id, folder, released, complete, execution=None) -> None:
    """The output's own claim of a window, `<output.path>/.releases/<job>-scheduled-<release
    id>/from-<first>.json` naming the checkpoint that publishes it (create-if-absent), made
    before any of its files is written:
    two state directories of one release (a copy or a backup run beside the original) commit
    in their own `commits/`, but only one of them publishes a window; the other raises
    ConcurrentRun and publishes nothing, then and on every later run. It names the execution
    its commit marker names too: a staged graph executed again after its marker and checkpoint
    were deleted has the same folder name, not the same execution."""
    path = join(job.output.path, ".releases", f"{job.job}-scheduled-{release_id}",
                f"from-{released:08d}.json")
    mine = {"checkpoint": os.path.basename(folder.rstrip("/")), "steps": [released, complete],
            "execution": execution}
    if create_if_absent(path, json.dumps(mine, sort_keys=True).encode("utf-8")):
        return
    found = read_json(path)
    if isinstance(found, dict) and "execution" not in found:  # claimed before executions
        found = dict(found, execution=execution)
    if found != mine:
        raise ConcurrentRun(f"steps from {released} of release {release_id} were published from "
                            f"another checkpoint ({path}: another state directory of this "
                            f"release); this run published nothing")


def publish(job, release_id, folder, released, complete, execution=None) -> None:
    """After the commit: the run's records, in the configured formats, into output.path, once
    the published folder's claim of the window names this checkpoint (`claim_publication`)."""
    claim_publication(job, release_id, folder, released, complete, execution)
    chunks = []
    for meta in FileSystems.match([join(folder, "records-*.jsonl")])[0].metadata_list:
        with FileSystems.open(meta.path) as handle:
            chunks.append(handle.read())
    out = _published_prefix(job, release_id, released, complete)
    write_records_files(_rows(chunks), out, job.output.formats)
    publish_manifest(job, release_id, read_json(join(folder, LEDGER)))


def publish_manifest(job, release_id, ledger: dict) -> Optional[str]:
    """`release.json` beside the records: the release manifest (`pipelines.run`'s
    `release_manifest`, the bytes `commit.CommitRun` writes) that the committed ledger holds,
    written (whole) when missing or different; returns its path then. A ledger of a version
    before holds none: nothing is written."""
    manifest = ledger.get("release_manifest") if isinstance(ledger, dict) else None
    if manifest is None:
        return None
    path = os.path.join(published_folder(job, release_id), "release.json")
    data = json.dumps(manifest, indent=2, sort_keys=True, default=str).encode("utf-8")
    if _read_or_none(path) == data:
        return None
    _write_published(path, data)
    return path


REFUSALS = "gate-refusals"  # the state directory's record of runs the input gate refused


def refusal_files(state_dir: str) -> list:
    from apache_beam.io.filesystems import FileSystems
    try:
        return [m.path for m in FileSystems.match([join(state_dir, REFUSALS, "*.json")])[0]
                .metadata_list]
    except Exception:  # noqa: BLE001 (none)
        return []


def refusals_before(state_dir: str, transform) -> dict:
    """What the runs the gate refused before this release started spent on the same source
    (public: each is a gate decision; release.json states it beside the release's budget)."""
    count = len(refusal_files(state_dir))
    gate = getattr(transform, "gate", None) or {}
    spent = {k: v * count for k, v in gate.get("budget", {}).items()}
    return {"count": count, "spent": spent}


def note_refusal(state_dir: str, line: str) -> Optional[str]:
    """Records a run the input gate refused (what it spent, from its refusal: the whole text) in
    the state directory, one create-only file per refusal: the release it would have started
    is gone, the gate's share of the budget was spent on the data all the same. Returns the
    file (None if it could not be written)."""
    from apache_beam.io.filesystems import FileSystems
    try:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
        path = join(state_dir, REFUSALS, f"{stamp}-{uuid.uuid4().hex[:8]}.json")
        if not FileSystems.exists(join(state_dir, REFUSALS)):
            FileSystems.mkdirs(join(state_dir, REFUSALS))
        with FileSystems.create(path) as handle:
            handle.write(json.dumps({"refusal": line}, sort_keys=True).encode("utf-8"))
        return path
    except Exception:  # noqa: BLE001 (the refusal itself is what the operator must see)
        return None


def refusal_line(state_dir: str, error) -> str:
    """A refused run's line on screen: the refusal's headline, where its whole text is, and
    the state directory's count of refused runs (`note_refusal` records this one first)."""
    text = gate.one_line(error)
    path = note_refusal(state_dir, text)
    if path is None:
        return text + refusals_note(state_dir, error)
    return gate.headline(text, path) + refusals_note(state_dir, error)


def refusals_note(state_dir: str, error) -> str:
    """The running count of this state directory's refused runs (each spent the gate's share
    on the source), after a refusal."""
    if not gate.refused(error):
        return ""
    count = len(refusal_files(state_dir))
    return f" Refused runs so far: {count}."


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
    parser.add_argument("--json", action="store_true",
                        help="print the run summary as one JSON object on stdout (a public and "
                             "an operator_not_private part, as pipelines.run --json)")
    args, beam_args = parser.parse_known_args(argv)
    logs.configure(args.verbose)
    try:
        now = job_config.parse_time("now", args.now) if args.now else time.time()
        summary = run_once(args.config, args.state_dir, now, beam_args)
    except ValueError as error:
        line = refusal_line(args.state_dir, error) if gate.refused(error) else \
            gate.one_line(error)
        print(f"error: {line}", file=sys.stderr)
        return 2
    except ConcurrentRun as error:
        print(f"error: {gate.one_line(error)}", file=sys.stderr)
        return 3
    except Exception as error:  # a full disk, a read-only or forbidden folder: one line
        line = refusal_line(args.state_dir, error) if gate.refused(error) else \
            storage.storage_error(error, _written_folders(args.config, args.state_dir))
        if line is None:
            try:
                line = io.read_failure(error, job_config.load(args.config))
            except ValueError:
                line = None
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    if "staged" in summary:
        first, last = summary["staged"]
        if args.json:
            print(json.dumps({"release_id": summary["release_id"], "staged": [first, last],
                              "published": summary["published"]}, indent=2, sort_keys=True))
            return 0
        print(f"release {summary['release_id']}")
        print(f"job staged, not run: when it runs, its last stage commits steps {first} -> "
              f"{last} and publishes them to {summary['published']}/records-steps-*")
        return 0
    public, operator = summary["public"], summary["operator_not_private"]
    if args.json:
        print(json.dumps({"job": summary["job"], "public": public,
                          "operator_not_private": operator}, indent=2, sort_keys=True))
        return 0
    print(job_run.describe_run(summary["job_config"], summary["transform"], public, operator))
    if not public["private"]:
        print(f"release {public['release_id']}: INSECURE demo release (fixed seed): records "
              f"are marked private: false", file=sys.stderr)
    return 0


def _written_folders(config_path: str, state_dir: str) -> List[str]:
    """The folders a scheduled run writes (named when an error names no file)."""
    try:
        return [state_dir, published_root(job_config.load(config_path))]
    except Exception:  # noqa: BLE001 (only naming folders in an error)
        return [state_dir]


if __name__ == "__main__":
    logs.exit_now(main())

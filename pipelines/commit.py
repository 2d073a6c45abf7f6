"""Committing a job's outputs from inside the job, as its last stage.

Both drivers used to commit after `wait_until_finish` (`pipelines.run`: release.json and the swap
of the output folders; `pipelines.schedule`: the ledger, the MAC'd commit marker and the
publication). A Dataflow Flex Template launch, or any launcher that submits a job and exits
(Airflow's DataflowStartFlexTemplateOperator, `--template_location`), never runs that code. So
the commit is a stage of the pipeline itself: it runs once, on a worker, after every file the job
writes is final (a side input over the writes' outputs is the barrier), and it is idempotent, so
a retried commit bundle converges on the same committed state.

    (every write's PCollection of written file names)
        | Flatten | Count.Globally          -> one number, available once all writes finished
    Create([None]) | Map(commit, AsSingleton(that number))
"""
from __future__ import annotations

import datetime
import json
import os
from typing import Callable, Iterable

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from pipelines.checkpoints import (COMMITTED, LEDGER, ConcurrentRun, create_if_absent, join,
                                   marker_mac, marker_path, read_json, write_manifest,
                                   write_text)

OPERATOR_README = (
    "This folder is for the operator only. It is NOT differentially private: dead letters hold\n"
    "raw input records, and counts here depend exactly on individuals' data. Do not publish it.\n")
METRICS_NOTE = ("exact truncation counts are the job's counters in namespace continual_release "
                "(the driver adds them here when it waits for the job)")


def after_writes(pipeline, writes: Iterable, commit: Callable[[], object], label: str):
    """Runs `commit()` once, after every PCollection in `writes` (the written file names of
    Beam's file sinks) is complete; returns the PCollection of its one result."""
    done = (list(writes) | f"{label}AllWrites" >> beam.Flatten()
            | f"{label}Written" >> beam.combiners.Count.Globally())
    return (pipeline | f"{label}Once" >> beam.Create([None])
            | label >> beam.Map(lambda _, files: commit(),
                                beam.pvalue.AsSingleton(done)))


def _files(pattern: str):
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


def dead_letters_by_reason(operator_folder: str) -> dict:
    """Dead letters written under `operator_folder`, counted by the first words of their reason
    (operator-only: they depend exactly on the input)."""
    reasons = {}
    for path in _files(os.path.join(operator_folder, "dead_letters-*")):
        with FileSystems.open(path) as handle:
            for line in handle.read().decode("utf-8").splitlines():
                if line.strip():
                    reason = json.loads(line).get("reason", "")
                    kind = reason.split(";")[0].split(":")[0][:60]
                    reasons[kind] = reasons.get(kind, 0) + 1
    return dict(sorted(reasons.items(), key=lambda kv: -kv[1]))


class CommitRun:
    """`pipelines.run`'s commit: release.json and the operator folder's README and summary into
    the staging folders, then the staged output sets replace the job's folders
    (`io.OutputStaging.commit`: renames locally, copies then deletes on object stores, the
    public set last). A retry after a complete commit does nothing."""

    def __init__(self, staging, manifest: dict):
        self.staging, self.manifest = staging, manifest

    def committed(self) -> bool:
        """The job's write stages always leave record files in the staged public folder (every
        public key has a record every step), and the commit moves them away last: none left
        means this run's commit finished (a retry, or the same pipeline run twice)."""
        return not _files(self.staging.public + "/*")

    def __call__(self) -> str:
        if self.committed():
            self.staging.remove_leftovers()
            return "already committed"
        staging = self.staging
        write_text(os.path.join(staging.public, "release.json"),
                   json.dumps(self.manifest, indent=2, sort_keys=True, default=str))
        write_text(os.path.join(staging.operator, "README.txt"), OPERATOR_README)
        write_text(os.path.join(staging.operator, "summary.json"), json.dumps(
            {"release_id": self.manifest["release_id"], "events_in_window": None, "truncated": None, "truncation_counts": METRICS_NOTE,
             "dead_letters": dead_letters_by_reason(staging.operator)},
            indent=2, sort_keys=True))
        staging.commit()
        return "committed"


class CommitCheckpoint:
    """`pipelines.schedule`'s commit of one run's checkpoint folder: the ledger, the manifest
    of every checkpoint file, the commit marker (create-if-absent, MAC'd under the release's
    secret), then `_COMMITTED` and the publication of the run's records. Of two runs from the
    same step exactly one creates the marker; the other raises ConcurrentRun and publishes
    nothing. A retry after this run created its marker skips to publishing (idempotent)."""

    def __init__(self, job, state_dir: str, folder: str, released: int, complete: int,
                 secret, ledger: dict, publish: Callable):
        self.job, self.state_dir, self.folder = job, state_dir, folder
        self.released, self.complete = released, complete
        self.secret, self.ledger, self.publish = secret, ledger, publish

    def _marker_names_this_run(self) -> bool:
        path = marker_path(self.state_dir, self.released)
        if not FileSystems.exists(path):
            return False
        if read_json(path).get("checkpoint") != self.folder:
            raise ConcurrentRun(f"another run already committed steps from {self.released} in "
                                f"the state directory {self.state_dir}; this run published "
                                f"nothing")
        return True

    def __call__(self) -> str:
        steps = [self.released, self.complete]
        release_id = self.ledger["release_id"]
        if not self._marker_names_this_run():
            ledger = dict(self.ledger, runs=self.ledger["runs"] + [{
                "at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "steps": steps}])
            write_text(join(self.folder, LEDGER),
                       json.dumps(ledger, indent=2, sort_keys=True, default=str))
            manifest = write_manifest(self.folder)
            marker = json.dumps({"checkpoint": self.folder, "steps": steps,
                                 "release_id": release_id, "manifest_sha256": manifest,
                                 "manifest_mac": marker_mac(self.secret, release_id, steps,
                                                            manifest)}).encode("utf-8")
            create_if_absent(marker_path(self.state_dir, self.released), marker)
            self._marker_names_this_run()  # re-read: raises unless this run's marker is there
        write_text(join(self.folder, COMMITTED), "")
        self.publish(self.job, release_id, self.folder, self.released, self.complete)
        return "committed"


def staged_only(beam_args) -> bool:
    """True when Beam only stages the job (`--template_location`: a Flex Template launch): the
    job runs after the driver exits, so the driver must not wait for it or read its outputs."""
    return any(a == "--template_location" or a.startswith("--template_location=")
               for a in beam_args)

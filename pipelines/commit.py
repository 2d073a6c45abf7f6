"""Committing a job's outputs from inside the job, as its last stage.

A Dataflow Flex Template launch, or any launcher that submits a job and exits (Airflow's
DataflowStartFlexTemplateOperator, `--template_location`), never runs code after
`wait_until_finish`. So the commit is a stage of the pipeline itself (`pipelines.run`:
release.json and the swap of the output sets; `pipelines.schedule`: the ledger, the manifest,
the MAC'd commit marker and the publication):

    guard:  Create([None]) | Map(refuse if this job's release/steps are already committed)
            every PCollection that is written passes the guard first (a side input), so a job
            graph executed a second time (a classic template launched again) fails before it
            rewrites or republishes anything: the same release id or checkpoint on other data
            would publish the same noise twice.
    writes: (the written file names of every sink) | Flatten
    commit: Create([None]) | Map(commit, AsList(written file names))
            runs once, on a worker, after every write is final; it refuses files it did not
            write, and a retried or concurrent attempt of the same job converges on the same
            committed state (every step is idempotent and the bytes it writes are fixed by the
            driver).
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Callable, Iterable, List

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from pipelines.checkpoints import (COMMITTED, LEDGER, ConcurrentRun, checkpoint_files,
                                   create_if_absent, join, marker_mac, marker_path, read_json,
                                   same_checkpoint, verify_checkpoint, verify_marker,
                                   write_manifest, write_text)
from transforms.validation import fail

OPERATOR_README = (
    "This folder is for the operator only. It is NOT differentially private: dead letters hold\n"
    "raw input records, and counts here depend exactly on individuals' data. Do not publish it.\n")
METRICS_NOTE = ("exact truncation counts are the job's counters in namespace continual_release "
                "(the driver adds them here when it waits for the job)")
SWAPPING = "_SWAPPING"   # in a staging root: its sets are complete and being moved into place


def guard(pipeline, check: Callable[[], object], label: str):
    """A singleton that exists only once `check()` passed, in the job (not in the driver)."""
    return pipeline | f"{label}Once" >> beam.Create([None]) | label >> beam.Map(
        lambda _: check() or True)


def guarded(pcoll, passed, label: str):
    """`pcoll`, released only after the guard `passed` (a side input waits for it)."""
    return pcoll | label >> beam.Map(lambda element, _: element,
                                      beam.pvalue.AsSingleton(passed))


def after_writes(pipeline, writes: Iterable, commit: Callable[[List[str]], object], label: str):
    """Runs `commit(written file names)` once, after every PCollection in `writes` (the written
    file names of Beam's file sinks) is complete; returns the PCollection of its one result."""
    written = list(writes) | f"{label}AllWrites" >> beam.Flatten()
    return (pipeline | f"{label}Once" >> beam.Create([None])
            | label >> beam.Map(lambda _, files: commit(list(files)),
                                beam.pvalue.AsList(written)))


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


class OutputStaging:
    """A run writes its output set into a staging folder; `commit` then replaces the job's
    public and operator folders as whole sets, so readers never see old and new files mixed
    or a half-written set. Local paths: two renames per folder (the old set is moved aside,
    then the new one moved in; a reader sees the old set, no folder, or the new set). Other
    filesystems: file-by-file copies, release.json last (readers should wait for it). The swap
    resumes where an interrupted one stopped (a folder whose staged set is gone is in place).
    A new run finishes the swap of a killed run whose sets were complete (`_SWAPPING`) and
    removes other leftover staging folders (runs of one job must not overlap)."""

    def __init__(self, job, root: str = None):
        self.job = job
        parent = job.output.path
        prefix = f".staging-{job.job}-"
        if root is None and "://" not in parent and os.path.isdir(parent):
            for name in sorted(os.listdir(parent)):
                if name.startswith(prefix):
                    leftover = OutputStaging(job, os.path.join(parent, name))
                    if os.path.exists(os.path.join(leftover.root, SWAPPING)):
                        leftover.commit()
                    shutil.rmtree(leftover.root, ignore_errors=True)
        self.root = root or os.path.join(parent, prefix + uuid.uuid4().hex[:8])
        self.public = os.path.join(self.root, "public")
        self.operator = os.path.join(self.root, "operator")

    def swapping(self) -> bool:
        return FileSystems.exists(os.path.join(self.root, SWAPPING))

    def mark_swapping(self) -> None:
        write_text(os.path.join(self.root, SWAPPING), "")

    def commit(self) -> None:
        for staged, final in ((self.operator, self.job.operator_path),
                              (self.public, self.job.public_path)):
            if "://" not in final:
                if not os.path.exists(staged):
                    continue  # moved into place by an earlier attempt
                aside = f"{self.root}/old-{os.path.basename(final)}"
                if os.path.exists(final):
                    shutil.rmtree(aside, ignore_errors=True)
                    os.rename(final, aside)
                os.rename(staged, final)
                continue
            files = _files(staged + "/**")
            if not files:
                continue  # copied and removed by an earlier attempt
            old = _files(final + "/**")
            if old:
                FileSystems.delete(old)
            files.sort(key=lambda p: p.endswith("release.json"))  # the manifest last
            FileSystems.copy(files, [final + p[len(staged):] for p in files])
            FileSystems.delete(files)
        self.remove_leftovers()

    def remove_leftovers(self) -> None:
        """Deletes the staging folder (after a commit, or a retried commit that had finished)."""
        if "://" not in self.root:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            leftovers = _files(self.root + "/**")
            if leftovers:
                FileSystems.delete(leftovers)


def release_marker(job, release_id: str) -> str:
    """Created (create-if-absent) when a private release is committed: no job may commit or
    write that release again."""
    return os.path.join(job.output.path, ".releases", f"{job.job}-{release_id}")


class NotReleased:
    """`pipelines.run`'s guard: a private release id is committed at most once."""

    def __init__(self, job, release_id: str):
        self.job, self.release_id = job, release_id

    def __call__(self):
        if FileSystems.exists(release_marker(self.job, self.release_id)):
            fail("job", f"run once: release {self.release_id} was already committed (a staged "
                        f"job graph runs once; running it again would publish the same noise "
                        f"on other data: launch the template again, which stages a new job)",
                 "a second execution")


class CommitRun:
    """`pipelines.run`'s commit: release.json and the operator folder's README and summary into
    the staging folders, the release's marker (private releases), then the staged output sets
    replace the job's folders (`OutputStaging.commit`). Resumable: a retry after any line
    converges; a staging folder that vanished before its swap (another run of the job removed
    it) fails the job."""

    def __init__(self, staging: OutputStaging, manifest: dict, private: bool):
        self.staging, self.manifest, self.private = staging, manifest, private

    def _committed(self) -> bool:
        release_id = self.manifest["release_id"]
        if self.private:
            return FileSystems.exists(release_marker(self.staging.job, release_id))
        try:  # an insecure (seeded) release: its id repeats by design, and it has no marker
            public = read_json(os.path.join(self.staging.job.public_path, "release.json"))
            return public.get("release_id") == release_id
        except (OSError, IOError, ValueError, AttributeError):
            return False

    def __call__(self, written: List[str]) -> str:
        staging, release_id = self.staging, self.manifest["release_id"]
        if not staging.swapping():
            if not _files(staging.public + "/*"):
                if self._committed():
                    staging.remove_leftovers()
                    return "already committed"
                fail("staging folder", f"present until its commit (runs of job "
                                       f"{staging.job.job} must not overlap: another run removed "
                                       f"it)", staging.root)
            write_text(os.path.join(staging.public, "release.json"),
                       json.dumps(self.manifest, indent=2, sort_keys=True, default=str))
            write_text(os.path.join(staging.operator, "README.txt"), OPERATOR_README)
            write_text(os.path.join(staging.operator, "summary.json"), json.dumps(
                {"release_id": release_id, "events_in_window": None, "truncated": None,
                 "truncation_counts": METRICS_NOTE,
                 "dead_letters": dead_letters_by_reason(staging.operator)},
                indent=2, sort_keys=True))
            if self.private:
                create_if_absent(release_marker(staging.job, release_id), b"")
            staging.mark_swapping()
        staging.commit()
        return "committed"


class NotCommitted:
    """`pipelines.schedule`'s guard: the steps from `released` are not committed yet."""

    def __init__(self, state_dir: str, released: int):
        self.state_dir, self.released = state_dir, released

    def __call__(self):
        if FileSystems.exists(marker_path(self.state_dir, self.released)):
            fail("job", f"run once: steps from {self.released} are already committed in the "
                        f"state directory {self.state_dir} (a staged job graph runs once; "
                        f"running it again would rewrite a committed checkpoint: launch the "
                        f"template again, which stages a new job)", "a second execution")


class CommitCheckpoint:
    """`pipelines.schedule`'s commit of one run's checkpoint folder: the ledger (its bytes fixed
    by the driver), the manifest of every checkpoint file, the commit marker (create-if-absent,
    MAC'd under the release's secret), then `_COMMITTED` and the publication of the run's
    records. A file in the folder that the job did not write is refused. Of two runs from the
    same step exactly one creates the marker; the other raises ConcurrentRun and publishes
    nothing. An attempt that finds this run's marker verifies the folder against it before it
    publishes (a retry, or a concurrent attempt of the same job)."""

    def __init__(self, job, state_dir: str, folder: str, released: int, complete: int,
                 secret, ledger: dict, publish: Callable):
        self.job, self.state_dir, self.folder = job, state_dir, folder
        self.released, self.complete = released, complete
        self.secret, self.ledger, self.publish = secret, ledger, publish

    def _marker(self):
        """This run's marker (dict), None when absent; ConcurrentRun when another run's."""
        path = marker_path(self.state_dir, self.released)
        if not FileSystems.exists(path):
            return None
        marker = read_json(path)
        if not same_checkpoint(marker.get("checkpoint"), self.folder):
            raise ConcurrentRun(f"another run already committed steps from {self.released} in "
                                f"the state directory {self.state_dir}; this run published "
                                f"nothing")
        return marker

    def _refuse_foreign_files(self, written: List[str]) -> None:
        expected = {os.path.basename(p) for p in written} | {LEDGER}
        for path in checkpoint_files(self.folder):
            if os.path.basename(path) not in expected:
                fail("checkpoint", "only the files this run wrote (a file was added to its "
                                   "folder before the commit)", path)

    def __call__(self, written: List[str]) -> str:
        steps = [self.released, self.complete]
        release_id = self.ledger["release_id"]
        marker = self._marker()
        if marker is None:
            self._refuse_foreign_files(written)
            write_text(join(self.folder, LEDGER),
                       json.dumps(self.ledger, indent=2, sort_keys=True, default=str))
            manifest = write_manifest(self.folder)
            created = json.dumps({"checkpoint": self.folder, "steps": steps,
                                  "release_id": release_id, "manifest_sha256": manifest,
                                  "manifest_mac": marker_mac(self.secret, release_id, steps,
                                                             manifest)}).encode("utf-8")
            create_if_absent(marker_path(self.state_dir, self.released), created)
            marker = self._marker()  # re-read: raises unless this run's marker is there
        path = marker_path(self.state_dir, self.released)
        verify_checkpoint(self.folder, verify_marker(marker, self.secret, path))
        write_text(join(self.folder, COMMITTED), "")
        self.publish(self.job, release_id, self.folder, self.released, self.complete)
        return "committed"


def staged_only(beam_args) -> bool:
    """True when Beam only stages the job (`--template_location`: a Flex Template launch): the
    job runs after the driver exits, so the driver must not wait for it or read its outputs."""
    return any(a == "--template_location" or a.startswith("--template_location=")
               for a in beam_args)

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
import re
import shutil
import uuid
from typing import Callable, Iterable, List

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from pipelines import storage
from pipelines.config import config_path
from pipelines.checkpoints import (COMMITTED, LEDGER, ConcurrentRun, checkpoint_files,
                                   create_if_absent, join, marker_mac, marker_path, read_json,
                                   same_checkpoint, verify_checkpoint, verify_marker,
                                   write_manifest, write_text)
from transforms import durable
from transforms.claims import ClaimOnce, guard, guarded, read_claim  # noqa: F401 (re-exported)
from transforms.validation import fail

OPERATOR_README = (
    "This folder is for the operator only. It is NOT differentially private: dead letters hold\n"
    "raw input records, and counts here depend exactly on individuals' data. Do not publish it.\n")
METRICS_NOTE = ("exact truncation counts are the job's counters in namespace continual_release "
                "(the driver adds them here when it waits for the job)")
SWAPPING = "_SWAPPING"   # in a staging root: its sets are complete and being moved into place


def after_writes(pipeline, writes: Iterable, commit: Callable[..., object], label: str,
                 execution=None):
    """Runs `commit(written file names)` once, after every PCollection in `writes` (the written
    file names of Beam's file sinks) is complete; returns the PCollection of its one result.
    With `execution` (the singleton of a claim's guard: this execution's token), runs
    `commit(written file names, token)`."""
    written = list(writes) | f"{label}AllWrites" >> beam.Flatten()
    once = pipeline | f"{label}Once" >> beam.Create([None])
    if execution is None:
        return once | label >> beam.Map(lambda _, files: commit(list(files)),
                                         beam.pvalue.AsList(written))
    return once | label >> beam.Map(lambda _, files, token: commit(list(files), token),
                                     beam.pvalue.AsList(written),
                                     beam.pvalue.AsSingleton(execution))


def _files(pattern: str):
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


def dead_letter_files(operator_folder: str) -> list:
    """The dead-letter files written under `operator_folder` (local or gs://; read at every
    step a streaming job publishes: `durable.matching` lists the folder, Beam's local match
    would stat every file below it, two more checkpoint files each step)."""
    return durable.matching(os.path.join(operator_folder, "dead_letters-*"))


def dead_letters_by_code(operator_folder: str) -> dict:
    """{"dead_letters": {code: count}, most first; "dead_letter_examples": {code: the first
    reason's detail}} of the dead letters written under `operator_folder` (operator-only: they
    depend exactly on the input). Codes: `transforms.streams.records.CODES`."""
    counts, examples = {}, {}
    for path in dead_letter_files(operator_folder):
        with FileSystems.open(path) as handle:
            for line in handle.read().decode("utf-8").splitlines():
                if line.strip():
                    letter = json.loads(line)
                    code = letter.get("code", "invalid_record")
                    counts[code] = counts.get(code, 0) + 1
                    examples.setdefault(code, str(letter.get("reason", ""))[:300])
    order = sorted(counts, key=lambda code: (-counts[code], code))
    return {"dead_letters": {code: counts[code] for code in order},
            "dead_letter_examples": {code: examples[code] for code in order}}


class OutputStaging:
    """A run writes its output set into a staging folder; `commit` then switches the job's
    public and operator folders to it together, so readers never see old and new files mixed,
    a half-written set, or the public folder of one release beside the operator folder of
    another.

    Local paths: the job's folders are symbolic links into one pointer,

        <output>/<job>          -> .sets-<job>-operator/current/public
        <output>/<job>-operator -> .sets-<job>-operator/current/operator
        <output>/.sets-<job>-operator/current -> <id>     (the committed set, <id>/)
    (the sets' folder is named `-operator`: it holds operator-only data, and a publication that
    leaves out `*-operator` must leave it out too)

    A commit (1) renames the complete staging folder `.staging-<job>-<id>/` (marked
    `_SWAPPING`) to `.sets-<job>-operator/<id>/`, (2) replaces `current` by a link to it (one atomic
    rename: both folders switch at once), (3) deletes the previous set. A reader, or a run
    killed at any point, sees the old pair or the new pair. The switch resumes where an
    interrupted one stopped, and a new run first finishes the switch of a killed run whose
    set was complete and removes every other leftover (runs of one job must not overlap).
    Folders written by versions before are moved aside once, at the first commit (during that
    one switch a reader may find no folder, as with the renames those versions did).

    Other filesystems (gs://) have no links or atomic folder renames: the files are copied
    into the job's folders one by one, release.json last (readers should wait for it), and an
    interrupted copy resumes."""

    def __init__(self, job, root: str = None):
        self.job = job
        parent = job.output.path
        self.prefix = f".staging-{job.job}-"
        self.sets = os.path.join(parent, f".sets-{job.job}-operator")
        if root is None and "://" not in parent and os.path.isdir(parent):
            self._recover(parent)
        self.root = root or os.path.join(parent, self.prefix + uuid.uuid4().hex[:8])
        self.public = os.path.join(self.root, "public")
        self.operator = os.path.join(self.root, "operator")
        name = os.path.basename(self.root.rstrip("/"))
        self.set_name = name[len(self.prefix):] if name.startswith(self.prefix) else name
        self.set = os.path.join(self.sets, self.set_name)

    def _recover(self, parent: str) -> None:
        """Finishes the switch of a killed run whose set was complete, removes other
        leftovers (staging folders of killed runs, sets no longer current)."""
        storage.remove_stale_temps(parent)  # links of a switch killed before its rename
        staging = re.compile(re.escape(self.prefix) + r"[0-9a-f]{8}")
        for name in sorted(os.listdir(parent)):
            if staging.fullmatch(name):
                leftover = OutputStaging(self.job, os.path.join(parent, name))
                if leftover.swapping():
                    leftover.commit()
                else:
                    leftover.remove_leftovers()
        if not os.path.isdir(self.sets):
            return
        current = _current_set(self.sets)
        pending = sorted((os.path.getmtime(os.path.join(self.sets, n, SWAPPING)), n)
                         for n in os.listdir(self.sets)
                         if n not in (CURRENT, current) and not storage.is_temp(n)
                         and os.path.isfile(os.path.join(self.sets, n, SWAPPING)))
        if pending:  # moved beside the current set, not switched to yet
            OutputStaging(self.job, os.path.join(parent, self.prefix + pending[-1][1])).commit()
        elif current is not None:
            self._clean(current)

    def swapping(self) -> bool:
        """The set is complete and being switched to (its staging folder, or on local paths
        the set it was renamed to, holds `_SWAPPING`)."""
        return FileSystems.exists(os.path.join(self.root, SWAPPING)) or (
            "://" not in self.root and os.path.isfile(os.path.join(self.set, SWAPPING)))

    def mark_swapping(self) -> None:
        write_text(os.path.join(self.root, SWAPPING), "")

    def commit(self) -> None:
        if "://" in self.root:
            self._copy_into_place()
            return
        if os.path.isdir(self.root):  # (1) the complete set beside the current one
            os.makedirs(self.sets, exist_ok=True)
            os.rename(self.root, self.set)
            storage.fsync_folder(os.path.dirname(self.root))
            storage.fsync_folder(self.sets)
        if not os.path.isdir(self.set):
            return  # switched to and cleaned up by an earlier attempt
        self._link_job_folders()
        if _current_set(self.sets) != self.set_name:  # (2) the switch: one atomic rename
            _replace_link(self.set_name, os.path.join(self.sets, CURRENT))
        self._clean(self.set_name)  # (3) the previous set
        try:
            os.remove(os.path.join(self.set, SWAPPING))
        except FileNotFoundError:
            pass

    def _link_job_folders(self) -> None:
        """The job's folders as links into `current` (once: later commits only switch
        `current`); a real folder of a version before is moved aside into the sets, to be
        deleted with the previous set."""
        for final, part in ((self.job.public_path, "public"),
                            (self.job.operator_path, "operator")):
            target = os.path.join(os.path.basename(self.sets), CURRENT, part)
            if os.path.islink(final) and os.readlink(final) == target:
                continue
            if os.path.isdir(final) and not os.path.islink(final):
                os.rename(final, os.path.join(self.sets, f"retired-{part}-{uuid.uuid4().hex[:8]}"))
            _replace_link(target, final)

    def _clean(self, keep: str) -> None:
        """Deletes every set but `keep` (and stale temporary links) from the sets folder."""
        storage.remove_stale_temps(self.sets)
        for name in os.listdir(self.sets):
            path = os.path.join(self.sets, name)
            if name in (CURRENT, keep) or storage.is_temp(name):
                continue
            if os.path.islink(path) or not os.path.isdir(path):
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
            else:
                shutil.rmtree(path, ignore_errors=True)

    def _copy_into_place(self) -> None:
        for staged, final in ((self.operator, self.job.operator_path),
                              (self.public, self.job.public_path)):
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


CURRENT = "current"


def _replace_link(target: str, path: str) -> None:
    """`path` becomes a symbolic link to `target` in one atomic rename (a new link under a
    temporary name, renamed over the old one)."""
    link = storage.temp_path(path)
    os.symlink(target, link)
    try:
        os.replace(link, path)
    except BaseException:
        try:
            os.remove(link)
        except OSError:
            pass
        raise
    storage.fsync_folder(os.path.dirname(path))


def _current_set(sets: str):
    """The name of the set `current` points at (local), or None."""
    try:
        return os.readlink(os.path.join(sets, CURRENT))
    except OSError:
        return None


def committed_folders(job):
    """(public, operator) folders of the job's committed set, resolved once: both belong to
    the same release even if another run switches the set meanwhile (local paths; elsewhere
    the job's folders)."""
    if "://" in job.output.path:
        return job.public_path, job.operator_path
    sets = os.path.join(job.output.path, f".sets-{job.job}-operator")
    current = _current_set(sets)
    if current is None:
        return job.public_path, job.operator_path
    folder = os.path.join(sets, current)
    return os.path.join(folder, "public"), os.path.join(folder, "operator")


def config_identity(config: str) -> str:
    """The config a run was started with, as the operator summary records it: a local file's
    real path (`demo:<job>` is its bundled file; symlinks resolved), a remote path as
    given."""
    if "://" in config:
        return config
    return os.path.realpath(config_path(config))


def refuse_other_config(job, config: str) -> None:
    """A batch run replaces its job's output set whole: refused when the set was written by
    another config file (a copied config that kept `job:`), which it would silently replace.
    Reads the committed operator summary's `config` (config file names only, no data)."""
    if config is None:
        return
    operator = committed_folders(job)[1]
    try:
        with FileSystems.open("/".join([operator.rstrip("/"), "summary.json"])) as handle:
            other = json.loads(handle.read().decode("utf-8")).get("config")
    except Exception:  # noqa: BLE001 (no committed set, or one from before the field)
        return
    if other and other != config_identity(config):
        fail("job", f"a name of its own ({job.public_path} holds the output of {other}; "
                    f"rename `job:`, or remove that folder and the job's operator folders)",
             job.job)


def release_marker(job, release_id: str) -> str:
    """Created (create-if-absent) when a private release is committed: no job may commit or
    write that release again."""
    return os.path.join(job.output.path, ".releases", f"{job.job}-{release_id}")


def release_claim(job, release_id: str, staging_root: str) -> ClaimOnce:
    """`pipelines.run`'s claim, made by the job at its start (before anything is written):
    the release's `.releases/<job>-<release id>.claim`. A private release id is new with every
    job graph, so a second execution of one staged graph (a classic template launched again,
    even while the first still runs) is refused before it writes anything; the commit then
    publishes only if it also wins the release's marker (`CommitRun`)."""
    return ClaimOnce(release_marker(job, release_id) + ".claim",
                     {"release_id": release_id, "staging": staging_root},
                     f"release {release_id} of job {job.job} (a staged job graph runs once; "
                     f"launch the template again, which stages a new job)")


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

    def _win_marker(self, execution) -> None:
        """Creates the release's marker naming this staging folder and execution, or finds it
        naming them (a retry of this commit); any other marker: another execution committed
        this release, and this one publishes nothing."""
        staging, release_id = self.staging, self.manifest["release_id"]
        path = release_marker(staging.job, release_id)
        mine = {"release_id": release_id, "staging": os.path.basename(staging.root),
                "execution": execution}
        if create_if_absent(path, json.dumps(mine, sort_keys=True).encode("utf-8")):
            return
        try:
            found = read_json(path)
        except (OSError, IOError, ValueError):
            found = None
        if found != mine:
            raise ConcurrentRun(f"release {release_id} was already committed by another "
                                f"execution ({path}); this one published nothing")

    def __call__(self, written: List[str], execution=None) -> str:
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
                 **dead_letters_by_code(staging.operator)},
                indent=2, sort_keys=True))
            durable.sync_files(_files(staging.public + "/*") + _files(staging.operator + "/*"))
            if self.private:
                self._win_marker(execution)
            staging.mark_swapping()
        staging.commit()
        return "committed"


class ScheduledRunClaim:
    """`pipelines.schedule`'s claim, made by the job at its start before anything is written:
    refused when the steps from `released` are committed already (a sequential re-run), then
    the claim `claims/<checkpoint folder>.json` (create-if-absent): the folder's name is new
    with every driver run, so a second execution of one staged graph (even concurrent) is
    refused before it writes into that folder. Different runs from the same step are ordered
    by the commit marker (`CommitCheckpoint`): one commits, the others publish nothing."""

    claims_once = True  # a claim (`transforms.claims.claim_of`)

    def __init__(self, state_dir: str, released: int, folder: str):
        self.state_dir, self.released, self.folder = state_dir, released, folder

    @property
    def path(self) -> str:
        return join(self.state_dir, "claims", os.path.basename(self.folder.rstrip("/"))
                    + ".json")

    def __call__(self):
        if FileSystems.exists(marker_path(self.state_dir, self.released)):
            fail("job", f"run once: steps from {self.released} are already committed in the "
                        f"state directory {self.state_dir} (a staged job graph runs once; "
                        f"running it again would rewrite a committed checkpoint: launch the "
                        f"template again, which stages a new job)", "a second execution")
        return ClaimOnce(self.path, {"checkpoint": os.path.basename(self.folder.rstrip("/")),
                                     "from": self.released},
                         f"the scheduled run into {self.folder} (a staged job graph runs "
                         f"once; launch the template again, which stages a new job)")()


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

    def _marker(self, execution=None):
        """This run's marker (dict), None when absent; ConcurrentRun when another run's (another
        folder, or another execution of this run's graph: `execution`, its claim's token)."""
        path = marker_path(self.state_dir, self.released)
        if not FileSystems.exists(path):
            return None
        marker = read_json(path)
        if not same_checkpoint(marker.get("checkpoint"), self.folder) or (
                execution is not None and marker.get("execution") != execution):
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

    def __call__(self, written: List[str], execution=None) -> str:
        steps = [self.released, self.complete]
        release_id = self.ledger["release_id"]
        marker = self._marker(execution)
        if marker is None:
            self._refuse_foreign_files(written)
            write_text(join(self.folder, LEDGER),
                       json.dumps(self.ledger, indent=2, sort_keys=True, default=str))
            durable.sync_files(checkpoint_files(self.folder))  # Beam's sinks do not fsync
            manifest = write_manifest(self.folder)
            created = json.dumps({"checkpoint": self.folder, "steps": steps,
                                  "release_id": release_id, "manifest_sha256": manifest,
                                  "manifest_mac": marker_mac(self.secret, release_id, steps,
                                                             manifest),
                                  "execution": execution}).encode("utf-8")
            create_if_absent(marker_path(self.state_dir, self.released), created)
            marker = self._marker(execution)  # re-read: raises unless this run's marker
        path = marker_path(self.state_dir, self.released)
        verify_checkpoint(self.folder, verify_marker(marker, self.secret, path))
        write_text(join(self.folder, COMMITTED), "")
        self.publish(self.job, release_id, self.folder, self.released, self.complete,
                     marker.get("execution"))
        return "committed"


def staged_only(beam_args) -> bool:
    """True when Beam only stages the job (`--template_location`: a Flex Template launch): the
    job runs after the driver exits, so the driver must not wait for it or read its outputs."""
    return any(a == "--template_location" or a.startswith("--template_location=")
               for a in beam_args)

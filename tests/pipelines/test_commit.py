"""The job commits itself: a launcher that submits the job and exits (a Flex Template launch,
Airflow's DataflowStartFlexTemplateOperator) gets the same committed release as a driver that
waits, and a retried commit converges on the same state."""
from __future__ import annotations

import glob
import itertools
import json
import os
import uuid

import apache_beam as beam
import pytest

from pipelines import checkpoints, commit, schedule
from pipelines import config as job_config
from pipelines import run as job_run
from tests.pipelines.test_schedule import HOUR, ORIGIN, continuous, records_of, write_config

STAGE = ["--template_location=/nonexistent/template.json"]  # what a Flex Template launch passes


class _Staged:
    """What DataflowRunner returns for a staged template: no job to wait for."""

    def wait_until_finish(self, duration=None):
        return "DONE"

    def metrics(self):
        raise AssertionError("a staged launch must not read the job's metrics")


@pytest.fixture
def launcher(monkeypatch):
    """Pipeline.run only stages: the built pipelines are kept, to run later "on Dataflow"."""
    staged, original = [], beam.Pipeline.run

    def stage(self, test_runner_api="AUTO"):
        staged.append(self)
        return _Staged()

    monkeypatch.setattr(beam.Pipeline, "run", stage)
    return staged, lambda pipeline: original(pipeline).wait_until_finish()


def test_staged_only_sees_the_template_option():
    assert commit.staged_only(["--runner=DataflowRunner", "--template_location=gs://b/t"])
    assert commit.staged_only(["--template_location", "gs://b/t"])
    assert not commit.staged_only(["--runner=DataflowRunner", "--temp_location=gs://b/t"])


def test_a_staged_run_commits_its_output_set_when_the_job_runs(tmp_path, launcher, capsys,
                                                               monkeypatch):
    staged, run_on_dataflow = launcher
    config = write_config(tmp_path, "active_users.yaml",
                          output={"path": str(tmp_path / "out"), "formats": ["jsonl", "csv"]})
    job = job_config.load(config)
    assert job_run.main(["--config", config, *STAGE]) == 0
    assert "job staged, not run" in capsys.readouterr().out
    assert not os.path.exists(job.public_path)  # the launcher committed nothing
    [pipeline] = staged
    run_on_dataflow(pipeline)  # after the launcher exited
    manifest = json.load(open(os.path.join(job.public_path, "release.json")))
    assert manifest["descriptor"]["mechanism"]
    assert sorted(os.listdir(job.public_path)) == [
        "records-00000-of-00001.csv", "records-00000-of-00001.jsonl", "release.json"]
    operator = json.load(open(os.path.join(job.operator_path, "summary.json")))
    assert operator["release_id"] == manifest["release_id"]
    assert "dead_letters" in operator and operator["truncated"] is None  # counters: the job's
    assert os.path.isfile(os.path.join(job.operator_path, "README.txt"))
    assert not glob.glob(str(tmp_path / "out" / ".staging-*"))
    records = records_of([os.path.join(job.public_path, "records-*.jsonl")])
    assert len(records) == len(job.public_keys) * job.steps.horizon
    monkeypatch.undo()
    assert records == continuous(tmp_path, config)  # same seed: what a waiting driver writes


def test_a_staged_run_prints_json_when_asked(tmp_path, launcher, capsys):
    config = write_config(tmp_path, "active_users.yaml")
    assert job_run.main(["--config", config, "--json", *STAGE]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["staged"] is True and printed["job"] == job_config.load(config).job


def test_a_staged_scheduled_run_commits_and_publishes_when_the_job_runs(tmp_path, launcher,
                                                                       monkeypatch):
    staged, run_on_dataflow = launcher
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    summary = schedule.run_once(config, state, ORIGIN + 5 * HOUR, STAGE)
    assert summary["staged"] == [0, 5] and summary["released_after"] == 0
    assert checkpoints.committed_checkpoints(state) == []  # nothing committed by the launcher
    run_on_dataflow(staged.pop())
    assert [r for r, _ in checkpoints.committed_checkpoints(state)] == [5]
    published = glob.glob(os.path.join(summary["published"], "records-steps-0-5-*"))
    assert len(published) == 1
    # the next launch resumes from the job's own commit; the release equals one continuous run
    summary = schedule.run_once(config, state, ORIGIN + 12 * HOUR, STAGE)
    run_on_dataflow(staged.pop())
    folders = [folder for _, folder in checkpoints.committed_checkpoints(state)]
    assert len(folders) == 2
    monkeypatch.undo()
    assert records_of([os.path.join(f, "records-*.jsonl") for f in folders]) == \
        continuous(tmp_path, config)
    ledger = checkpoints.read_json(os.path.join(folders[-1], checkpoints.LEDGER))
    assert [run["steps"] for run in ledger["runs"]] == [[0, 5], [5, 12]]


def _commit_of(tmp_path, monkeypatch):
    """A scheduled run's commit stage, captured, and the run's state directory."""
    captured = []
    original = commit.after_writes

    def capture(pipeline, writes, committer, label, **kwargs):
        captured.append(committer)
        return original(pipeline, writes, committer, label, **kwargs)

    monkeypatch.setattr(schedule, "after_writes", capture)
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    return captured[0], state, config


def written_by(committer):
    return [p for p in checkpoints.checkpoint_files(committer.folder)
            if os.path.basename(p) != checkpoints.LEDGER]


def test_a_retried_checkpoint_commit_is_a_no_op(tmp_path, monkeypatch):
    committer, state, _ = _commit_of(tmp_path, monkeypatch)
    marker = open(checkpoints.marker_path(state, 0), "rb").read()
    published = sorted(glob.glob(os.path.join(
        schedule.published_folder(committer.job, committer.ledger["release_id"]), "*")))
    contents = [open(p, "rb").read() for p in published]
    assert committer(written_by(committer)) == "committed"  # the retry: nothing changes
    assert open(checkpoints.marker_path(state, 0), "rb").read() == marker
    assert [open(p, "rb").read() for p in published] == contents
    checkpoints.verify_checkpoint(committer.folder,
                                  json.loads(marker)["manifest_sha256"])  # ledger unchanged


def test_a_commit_of_another_run_from_the_same_step_publishes_nothing(tmp_path, monkeypatch):
    committer, state, _ = _commit_of(tmp_path, monkeypatch)
    loser = commit.CommitCheckpoint(committer.job, state, committer.folder + "-other", 0, 4,
                                    committer.secret, committer.ledger, committer.publish)
    with pytest.raises(checkpoints.ConcurrentRun, match=f"in the state directory {state}"):
        loser(written_by(committer))
    assert not os.path.exists(committer.folder + "-other")  # no ledger, no manifest, no records


def test_a_retried_run_commit_leaves_the_committed_set(tmp_path, monkeypatch, launcher):
    staged, run_on_dataflow = launcher
    captured = []
    original = commit.after_writes
    monkeypatch.setattr(commit, "after_writes", lambda p, w, c, label, **kw: (
        captured.append(c), original(p, w, c, label, **kw))[1])
    config = write_config(tmp_path, "active_users.yaml")
    job = job_config.load(config)
    assert job_run.main(["--config", config, *STAGE]) == 0
    run_on_dataflow(staged.pop())
    before = {p: open(p, "rb").read() for p in glob.glob(os.path.join(job.public_path, "*"))}
    assert captured[0]([]) == "already committed"
    assert {p: open(p, "rb").read() for p in glob.glob(os.path.join(job.public_path, "*"))} \
        == before


# Attacks on the in-job commit (each broke an earlier version of it).

def _secret_config(tmp_path, name="cart_items.yaml", **changes):
    secret = tmp_path / "secret"
    secret.write_text("ab" * 32)  # private: fresh release ids, no seed
    return write_config(tmp_path, name, secret={"path": str(secret)}, **changes)


def _staged_scheduled_run(tmp_path, launcher):
    """A private scheduled run of steps 0 -> 5 staged, then executed once: (its staged graph,
    the driver's summary, the state directory, the executor)."""
    staged, run_on_dataflow = launcher
    state = str(tmp_path / "state")
    summary = schedule.run_once(_secret_config(tmp_path), state, ORIGIN + 5 * HOUR, STAGE)
    template = staged.pop()
    run_on_dataflow(template)
    return template, summary, state, run_on_dataflow


def test_a_staged_scheduled_job_run_twice_fails_and_publishes_nothing(tmp_path, launcher):
    """A classic template is one staged graph that may be launched again: its second execution
    would rewrite the committed checkpoint and republish its steps with the same noise on other
    data. The guard fails it before any write."""
    template, summary, state, run_on_dataflow = _staged_scheduled_run(tmp_path, launcher)
    [(_, folder)] = checkpoints.committed_checkpoints(state)

    def contents():  # Beam's empty temp folders of the failed job aside
        return {p: open(p, "rb").read() for p in glob.glob(os.path.join(folder, "*")) +
                glob.glob(os.path.join(summary["published"], "*")) if os.path.isfile(p)}

    before = contents()
    with pytest.raises(Exception, match="already committed in the state directory"):
        run_on_dataflow(template)
    assert contents() == before
    checkpoints.verify_checkpoint(folder, checkpoints.read_json(
        checkpoints.marker_path(state, 0))["manifest_sha256"])


def test_a_staged_run_executed_twice_fails_and_publishes_nothing(tmp_path, launcher):
    staged, run_on_dataflow = launcher
    config = _secret_config(tmp_path, "active_users.yaml")
    job = job_config.load(config)
    assert job_run.main(["--config", config, *STAGE]) == 0
    template = staged.pop()
    run_on_dataflow(template)
    before = {p: open(p, "rb").read() for p in glob.glob(os.path.join(job.public_path, "*"))}
    with pytest.raises(Exception, match="`claim` must be new: release .* was claimed before"):
        run_on_dataflow(template)
    assert {p: open(p, "rb").read() for p in glob.glob(os.path.join(job.public_path, "*"))} \
        == before


def test_states_altered_after_the_launch_fail_the_job(tmp_path, launcher):
    """The driver verifies the previous checkpoint at launch; the job reads it later and checks
    every file against the verified manifest again (nothing altered is resumed and re-signed)."""
    staged, run_on_dataflow = launcher
    config = _secret_config(tmp_path)
    state = str(tmp_path / "state")
    schedule.run_once(config, state, ORIGIN + 5 * HOUR, STAGE)
    run_on_dataflow(staged.pop())
    [(_, first)] = checkpoints.committed_checkpoints(state)
    schedule.run_once(config, state, ORIGIN + 10 * HOUR, STAGE)
    for path in glob.glob(os.path.join(first, "units-*")):
        open(path, "w").close()  # every unit's contribution count reset
    with pytest.raises(Exception, match="changed after the driver verified it"):
        run_on_dataflow(staged.pop())
    assert [r for r, _ in checkpoints.committed_checkpoints(state)] == [5]


def test_a_file_the_job_did_not_write_is_never_signed(tmp_path, monkeypatch):
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    real = commit.CommitCheckpoint.__call__

    def planted_then_commit(self, written, execution=None):
        open(os.path.join(self.folder, "units-zz-planted"), "w").close()
        return real(self, written, execution)

    monkeypatch.setattr(commit.CommitCheckpoint, "__call__", planted_then_commit)
    with pytest.raises(Exception, match="only the files this run wrote"):
        schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    assert checkpoints.committed_checkpoints(state) == []


def test_a_concurrent_attempt_of_the_same_commit_keeps_the_release_resumable(tmp_path,
                                                                            monkeypatch):
    """Two attempts of one commit (a zombie worker): both write the same ledger bytes, and an
    attempt that finds its marker verifies the folder before it publishes."""
    committer, state, config = _commit_of(tmp_path, monkeypatch)
    os.remove(os.path.join(committer.folder, checkpoints.COMMITTED))
    assert committer(written_by(committer)) == "committed"
    assert schedule.run_once(config, state, ORIGIN + 8 * HOUR)["released_after"] == 8
    with open(os.path.join(committer.folder, "records-00000-of-00001.jsonl"), "a") as handle:
        handle.write("{}\n")  # altered after its commit: an attempt now refuses to publish
    with pytest.raises(ValueError, match="differs from its manifest"):
        committer(written_by(committer))


def test_a_state_directory_spelled_differently_resumes(tmp_path, monkeypatch):
    """The markers name folders as the committing run spelled the state directory; another
    spelling must neither delete a committed checkpoint as stale nor lose it."""
    config = write_config(tmp_path)
    monkeypatch.chdir(tmp_path)
    schedule.run_once(config, "state", ORIGIN + 5 * HOUR)
    assert schedule.run_once(config, str(tmp_path / "state"), ORIGIN + 8 * HOUR)[
        "released_after"] == 8
    assert schedule.run_once(config, "./state/", ORIGIN + 10 * HOUR)["released_after"] == 10
    assert [r for r, _ in checkpoints.committed_checkpoints("state")] == [5, 8, 10]


def _staged_release(tmp_path, release_id):
    """A job's staging folder as its write stages leave it (no Beam), and the committer."""
    config = _secret_config(tmp_path, "active_users.yaml")
    job = job_config.load(config)
    staging = commit.OutputStaging(job)
    for folder, name in ((staging.public, "records-00000-of-00001.jsonl"),
                         (staging.operator, "dead_letters-00000-of-00001.jsonl")):
        os.makedirs(folder)
        with open(os.path.join(folder, name), "w") as handle:
            handle.write(json.dumps({"release": release_id}) + "\n")
    return job, commit.CommitRun(staging, {"release_id": release_id}, private=True)


FILE_OPERATIONS = ("rename", "replace", "symlink", "link")  # what makes a file or folder visible


def _crash_at(monkeypatch, k):
    """The k-th rename, replace, symlink or link from now on raises (a worker lost there);
    returns the undo."""
    calls, originals = [0], {name: getattr(os, name) for name in FILE_OPERATIONS}

    def wrap(name):
        def operation(*args, **kwargs):
            calls[0] += 1
            if calls[0] == k:
                raise OSError(f"worker lost at {name}")
            return originals[name](*args, **kwargs)
        return operation

    for name in FILE_OPERATIONS:
        monkeypatch.setattr(os, name, wrap(name))
    return lambda: [monkeypatch.setattr(os, n, f) for n, f in originals.items()]


def _visible(job):
    """What a reader sees: the release of the public folder (its release.json and its records)
    and of the operator folder (its summary and dead letters); None where there is none."""
    def read(folder, name, field):
        try:
            return json.load(open(os.path.join(folder, name)))[field]
        except FileNotFoundError:
            return None
    public = (read(job.public_path, "release.json", "release_id"),
              read(job.public_path, "records-00000-of-00001.jsonl", "release"))
    operator = (read(job.operator_path, "summary.json", "release_id"),
                read(job.operator_path, "dead_letters-00000-of-00001.jsonl", "release"))
    return public + operator


@pytest.mark.parametrize("then", ["the retry", "the next run"])
def test_a_run_commit_interrupted_at_any_file_operation_is_never_half_switched(
        tmp_path, monkeypatch, then):
    """The commit crashes at each of its renames, links and replaces in turn: at every point a
    reader sees the old release's public AND operator folders, or the new release's (never one
    of each, never a mix within a folder); the retry, or the next run of the job, converges."""
    old, new = "a" * 32, "b" * 32
    for k in itertools.count(1):
        root = tmp_path / f"crash-{k}"
        root.mkdir()
        job, first = _staged_release(root, old)
        first(["unused"])  # an earlier release is in place
        assert _visible(job) == (old,) * 4
        _, second = _staged_release(root, new)
        undo = _crash_at(monkeypatch, k)
        try:
            second(["unused"])
            crashed = False
        except OSError as error:
            assert "worker lost" in str(error)
            crashed = True
        undo()
        if not crashed:
            break  # the commit has fewer than k operations: every one was interrupted once
        assert _visible(job) in ((old,) * 4, (new,) * 4), k
        if then == "the retry":
            assert second(["unused"]) == "committed"
            assert _visible(job) == (new,) * 4
            assert second(["unused"]) == "already committed"
        else:
            commit.OutputStaging(job)  # finishes a complete set's switch, or discards it
            assert _visible(job) in ((old,) * 4, (new,) * 4), k
        assert not glob.glob(str(root / "out" / ".staging-*"))
        sets = os.listdir(root / "out" / f".sets-{job.job}-operator")
        assert sorted(sets) == sorted(["current", os.readlink(
            root / "out" / f".sets-{job.job}-operator" / "current")]), sets  # the old set is gone
    assert k > 6  # the commit's writes, its marker, its rename and its switch were each hit


def test_the_first_commit_moves_folders_of_a_version_before_aside(tmp_path):
    """Output folders written by the code before the pointer (real folders) are replaced by
    the links at the first commit; nothing of the old set remains."""
    job, first = _staged_release(tmp_path, "a" * 32)
    for folder in (job.public_path, job.operator_path):
        os.makedirs(folder)
        open(os.path.join(folder, "stale-shard.jsonl"), "w").write("{}\n")
    assert first(["unused"]) == "committed"
    assert os.path.islink(job.public_path) and os.path.islink(job.operator_path)
    assert _visible(job) == ("a" * 32,) * 4
    assert "stale-shard.jsonl" not in os.listdir(job.public_path) + os.listdir(job.operator_path)
    assert len(os.listdir(tmp_path / "out" / f".sets-{job.job}-operator")) == 2  # current and its set


def test_a_run_killed_mid_swap_is_finished_by_the_next_run(tmp_path, monkeypatch):
    job, first = _staged_release(tmp_path, "a" * 32)
    first(["unused"])
    _, second = _staged_release(tmp_path, "b" * 32)
    rename = os.rename
    monkeypatch.setattr(commit.os, "rename", lambda *a: (_ for _ in ()).throw(OSError("killed")))
    with pytest.raises(OSError):
        second(["unused"])  # its sets are complete (_SWAPPING), nothing moved yet
    monkeypatch.setattr(commit.os, "rename", rename)
    commit.OutputStaging(job)  # the next run of the job finishes the swap first
    assert json.load(open(os.path.join(job.public_path, "release.json")))["release_id"] == \
        "b" * 32
    assert not glob.glob(str(tmp_path / "out" / ".staging-*"))


def test_a_run_whose_staging_folder_vanished_fails(tmp_path, launcher, monkeypatch):
    """A second run of the job removed the first one's staging folder between the first job's
    writes and its commit: the first job fails instead of succeeding without a release."""
    staged, run_on_dataflow = launcher
    config = _secret_config(tmp_path, "active_users.yaml")
    captured, original = [], commit.after_writes
    monkeypatch.setattr(commit, "after_writes", lambda p, w, c, label, **kw: (
        captured.append(c), original(p, w, lambda files, *token: files, label, **kw))[1])
    assert job_run.main(["--config", config, *STAGE]) == 0
    run_on_dataflow(staged.pop())  # the first job's writes
    assert job_run.main(["--config", config, *STAGE]) == 0  # removes the first's staging folder
    with pytest.raises(ValueError, match="`staging folder` must be present until its commit"):
        captured[0](["unused"])


def _execute_concurrently(pipeline, run, executions=2):
    """Runs one staged graph `executions` times at once, in forked processes released by one
    barrier (timed to overlap); -> their exit codes (0: the execution finished)."""
    import multiprocessing
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(executions)

    def execute():
        barrier.wait()
        try:
            run(pipeline)
        except Exception:  # noqa: BLE001 (the loser's failure is the expected outcome)
            os._exit(1)
        os._exit(0)

    processes = [context.Process(target=execute) for _ in range(executions)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(300)
    return sorted(process.exitcode for process in processes)


def _published(folder):
    """The files of a published folder (a losing execution's Beam sinks create their empty
    temp folders before its claim fails: nothing is written into them)."""
    for temp in glob.glob(os.path.join(folder, "beam-temp-*")):
        assert not os.listdir(temp)
    return {os.path.basename(p): open(p, "rb").read()
            for p in glob.glob(os.path.join(folder, "*")) if os.path.isfile(p)}


def test_two_concurrent_executions_of_one_staged_run_publish_once(tmp_path, launcher):
    """Break 3 as it was run: a classic template launched again while the first launch still
    runs. Both executions start together; exactly one publishes, the other fails before it
    writes (its claim of the release is refused), and the public folder is that one set."""
    staged, run_on_dataflow = launcher
    config = _secret_config(tmp_path, "active_users.yaml")
    job = job_config.load(config)
    for trial in range(3):
        assert job_run.main(["--config", config, *STAGE]) == 0
        assert _execute_concurrently(staged.pop(), run_on_dataflow) == [0, 1]
        public = _published(job.public_path)
        release = json.loads(public["release.json"])["release_id"]
        assert os.path.exists(commit.release_marker(job, release))
        assert len(records_of([os.path.join(job.public_path, "records-*.jsonl")])) == \
            len(job.public_keys) * job.steps.horizon


def test_the_commit_publishes_only_if_it_won_the_marker(tmp_path, launcher, monkeypatch):
    """The second line of defence: with the start claim taken away (as in the code that was
    attacked), two overlapping executions both reach the commit; only the one that creates
    the release's marker publishes, the other raises and leaves the public set as it was."""
    staged, run_on_dataflow = launcher
    class NoClaim:  # the start claim taken away: only a fresh execution token
        claims_once = True

        def __call__(self):
            return uuid.uuid4().hex

    monkeypatch.setattr(commit, "release_claim", lambda *args: NoClaim())
    config = _secret_config(tmp_path, "active_users.yaml")
    job = job_config.load(config)
    assert job_run.main(["--config", config, *STAGE]) == 0
    template = staged.pop()
    run_on_dataflow(template)
    before = _published(job.public_path)
    with pytest.raises(Exception, match=r"was already committed by another execution"):
        run_on_dataflow(template)
    assert _published(job.public_path) == before


def test_two_concurrent_executions_of_one_staged_scheduled_run_commit_once(tmp_path, launcher):
    staged, run_on_dataflow = launcher
    config = _secret_config(tmp_path)
    state = str(tmp_path / "state")
    schedule.run_once(config, state, ORIGIN + 5 * HOUR, STAGE)
    assert _execute_concurrently(staged.pop(), run_on_dataflow) == [0, 1]
    [(released, folder)] = checkpoints.committed_checkpoints(state)
    assert released == 5
    checkpoints.verify_checkpoint(folder, checkpoints.read_json(
        checkpoints.marker_path(state, 0))["manifest_sha256"])


def test_a_staged_scheduled_graph_re_executed_after_a_rollback_publishes_nothing(tmp_path,
                                                                                launcher):
    """Attack F5 (staged): the marker, claims/ and the checkpoint folder deleted, the same
    staged graph executed again (on other data) had the same folder name and published over
    the window. The output's claim of the window names the execution: refused."""
    import shutil
    template, summary, state, run_on_dataflow = _staged_scheduled_run(tmp_path, launcher)
    published = sorted(p for p in glob.glob(os.path.join(summary["published"], "*"))
                       if os.path.isfile(p))
    before = [open(p, "rb").read() for p in published]
    [(_, folder)] = checkpoints.committed_checkpoints(state)
    os.remove(checkpoints.marker_path(state, 0))
    shutil.rmtree(os.path.join(state, "claims"))
    shutil.rmtree(folder)
    with pytest.raises(Exception, match=r"published from another checkpoint"):
        run_on_dataflow(template)
    assert [open(p, "rb").read() for p in published] == before

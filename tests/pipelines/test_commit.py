"""The job commits itself: a launcher that submits the job and exits (a Flex Template launch,
Airflow's DataflowStartFlexTemplateOperator) gets the same committed release as a driver that
waits, and a retried commit converges on the same state."""
from __future__ import annotations

import glob
import json
import os

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

    def capture(pipeline, writes, committer, label):
        captured.append(committer)
        return original(pipeline, writes, committer, label)

    monkeypatch.setattr(schedule, "after_writes", capture)
    config = write_config(tmp_path)
    state = str(tmp_path / "state")
    schedule.run_once(config, state, ORIGIN + 4 * HOUR)
    return captured[0], state, config


def test_a_retried_checkpoint_commit_is_a_no_op(tmp_path, monkeypatch):
    committer, state, _ = _commit_of(tmp_path, monkeypatch)
    marker = open(checkpoints.marker_path(state, 0), "rb").read()
    published = sorted(glob.glob(os.path.join(
        schedule.published_folder(committer.job, committer.ledger["release_id"]), "*")))
    contents = [open(p, "rb").read() for p in published]
    assert committer() == "committed"  # the retry: same marker, same ledger, same records
    assert open(checkpoints.marker_path(state, 0), "rb").read() == marker
    assert [open(p, "rb").read() for p in published] == contents
    checkpoints.verify_checkpoint(committer.folder,
                                  json.loads(marker)["manifest_sha256"])  # ledger unchanged


def test_a_commit_of_another_run_from_the_same_step_publishes_nothing(tmp_path, monkeypatch):
    committer, state, _ = _commit_of(tmp_path, monkeypatch)
    loser = commit.CommitCheckpoint(committer.job, state, committer.folder + "-other", 0, 4,
                                    committer.secret, committer.ledger, committer.publish)
    with pytest.raises(checkpoints.ConcurrentRun, match=f"in the state directory {state}"):
        loser()
    assert not os.path.exists(committer.folder + "-other")  # no ledger, no manifest, no records


def test_a_retried_run_commit_leaves_the_committed_set(tmp_path, monkeypatch, launcher):
    staged, run_on_dataflow = launcher
    captured = []
    original = commit.after_writes
    monkeypatch.setattr(commit, "after_writes", lambda p, w, c, label: (
        captured.append(c), original(p, w, c, label))[1])
    config = write_config(tmp_path, "active_users.yaml")
    job = job_config.load(config)
    assert job_run.main(["--config", config, *STAGE]) == 0
    run_on_dataflow(staged.pop())
    before = {p: open(p, "rb").read() for p in glob.glob(os.path.join(job.public_path, "*"))}
    assert captured[0]() == "already committed"
    assert {p: open(p, "rb").read() for p in glob.glob(os.path.join(job.public_path, "*"))} \
        == before

"""The claim protocol of a checkpointed streaming release (transforms/step_files.py,
transforms/stream_checkpoint.py, pipelines/stream.py `Continuation`), in process: a kill at
any file operation of a step's commit or of a continuation's claim delays the release, never
wedges it; no step is checkpointed or published twice, or with two contents."""
from __future__ import annotations

import json
import os
import types

import pytest

from pipelines import stream
from transforms import ContinualCount, SecretRef, TimeSteps
from transforms import step_files
from transforms import stream_checkpoint as ck
from transforms.validation import ValidationError

HORIZON = 5
STEPS = TimeSteps(1_700_000_000.0, 60.0, HORIZON)
KEYS = ["a", "b"]


class Killed(BaseException):
    """A kill -9 at a file operation: nothing after it runs (not an Exception: no handler
    of the code under test may swallow it)."""


def release(tmp_path):
    folder = str(tmp_path / "operator" / "checkpoint")
    transform = ContinualCount(steps=STEPS, public_keys=KEYS, epsilon=1.0,
                               secret=SecretRef(literal=b"step-claims"), insecure=True,
                               release_id="cd" * 16, checkpoint=folder)
    job = types.SimpleNamespace(operator_path=str(tmp_path / "operator"), public_keys=KEYS,
                                steps=types.SimpleNamespace(horizon=HORIZON))
    return transform, job, folder


def rows_of(step):
    return [{"key": k, "step": step, "value": 10 * step + i, "window_end": f"end-{step}"}
            for i, k in enumerate(KEYS)]


def states_of(step):
    return [(k, f"state-{k}-{step}") for k in KEYS]


def execute(tmp_path, transform, epoch, execution, token="t"):
    """One execution of `epoch` publishing its steps from epoch's first: each step claimed,
    checkpointed, then its files (as `StepFilesFn` does)."""
    _, _, folder = release(tmp_path)
    fn = step_files.StepFilesFn(str(tmp_path / "steps"), KEYS, ("jsonl",),
                                step_files.StepCheckpoint(transform.config, folder, epoch[0],
                                                          None, None, execution, epoch[1]))
    for step in range(epoch[0], HORIZON):
        fn._checkpoint(step, rows_of(step), states_of(step), token)
        step_files.publish_step(str(tmp_path / "steps"), step, rows_of(step), ("jsonl",))


def continue_release(tmp_path, transform, job, execution):
    """`--continue`: the checkpoint verified, the missing files republished, the steps from
    its first claimed (this attempt), then the execution."""
    continuation = stream.Continuation(job, transform)
    continuation.republish(types.SimpleNamespace(
        public_path=str(tmp_path), operator_path=job.operator_path,
        output=types.SimpleNamespace(formats=("jsonl",))), transform)
    if continuation.complete:  # the missing files restored: nothing left to release
        return None
    token = continuation.claim(transform)()
    execute(tmp_path, transform, continuation.epoch, execution, token)
    return continuation.epoch


REAL_CREATE = step_files.create_if_absent


def kill_at(monkeypatch, n):
    """Kills the process at the n-th file creation (0 = the first) from now on (-1: never;
    the calls are counted)."""
    calls = [0]
    real = REAL_CREATE

    def creating(path, data):
        if calls[0] == n:
            calls[0] += 1
            raise Killed(path)
        calls[0] += 1
        return real(path, data)
    for module in (step_files, ck):
        monkeypatch.setattr(module, "create_if_absent", creating)
    from transforms import claims
    monkeypatch.setattr(claims, "create_if_absent", creating)
    return calls


def published(tmp_path):
    steps = tmp_path / "steps"
    return sorted(int(n[5:13]) for n in os.listdir(steps) if n.endswith(".json")) \
        if steps.exists() else []


def test_a_kill_between_a_steps_claim_and_its_checkpoint_is_taken_over(tmp_path):
    """The campaign's wedge: step 2 claimed by the launch, which died before checkpointing it;
    the continuation from 2 takes the claim over and publishes steps 2-4."""
    transform, job, folder = release(tmp_path)
    fn = step_files.StepFilesFn(str(tmp_path / "steps"), KEYS, ("jsonl",),
                                step_files.StepCheckpoint(transform.config, folder, 0, None,
                                                          None, "launch", 0))
    for step in (0, 1):
        fn._checkpoint(step, rows_of(step), states_of(step), "t0")
        step_files.publish_step(str(tmp_path / "steps"), step, rows_of(step), ("jsonl",))
    os.makedirs(folder, exist_ok=True)
    step_files.create_if_absent(ck.join(folder, "step-00000002.claim"), json.dumps(
        {"token": "t0", "execution": "launch", "epoch": [0, 0]}).encode())
    assert continue_release(tmp_path, transform, job, "second") == (2, 1)
    assert published(tmp_path) == list(range(HORIZON))
    # the launch, still alive, can no longer publish a step (superseded from step 2 on)
    with pytest.raises(ValidationError, match="published by the latest execution"):
        fn._checkpoint(3, rows_of(3), states_of(3), "t0")


def test_a_release_that_published_nothing_starts_again_from_step_0(tmp_path):
    transform, job, folder = release(tmp_path)
    os.makedirs(folder, exist_ok=True)
    step_files.create_if_absent(ck.join(folder, "step-00000000.claim"), json.dumps(
        {"token": "t0", "execution": "launch", "epoch": [0, 0]}).encode())
    assert continue_release(tmp_path, transform, job, "restart") == (0, 1)
    assert published(tmp_path) == list(range(HORIZON))


def test_a_continuation_that_published_nothing_is_superseded_and_retried(tmp_path):
    transform, job, folder = release(tmp_path)
    execute_until = step_files.StepFilesFn(str(tmp_path / "steps"), KEYS, ("jsonl",),
                                           step_files.StepCheckpoint(transform.config, folder,
                                                                     0, None, None, "l", 0))
    execute_until._checkpoint(0, rows_of(0), states_of(0), "t")
    step_files.publish_step(str(tmp_path / "steps"), 0, rows_of(0), ("jsonl",))
    dead = stream.Continuation(job, transform)
    dead.claim(transform)()  # its claim, then killed: it published nothing
    assert os.path.exists(ck.join(folder, "from-00000001.json"))
    assert continue_release(tmp_path, transform, job, "retry") == (1, 2)
    assert os.path.exists(ck.join(folder, "from-00000001-02.json"))
    assert published(tmp_path) == list(range(HORIZON))
    stale = step_files.StepFilesFn(str(tmp_path / "steps"), KEYS, ("jsonl",),
                                   step_files.StepCheckpoint(transform.config, folder, 1, None,
                                                             None, "dead", 1))
    with pytest.raises(ValidationError, match="published by the latest execution"):
        stale._checkpoint(1, rows_of(1), states_of(1), "x")


def test_a_continuation_after_a_checkpointed_step_is_refused_and_a_concurrent_one_loses(
        tmp_path):
    transform, job, folder = release(tmp_path)
    execute(tmp_path, transform, (0, 0), "launch")  # the whole horizon: nothing to continue
    assert stream.Continuation(job, transform).complete
    other = tmp_path / "other"
    transform, job, folder = release(other)
    fn = step_files.StepFilesFn(str(other / "steps"), KEYS, ("jsonl",),
                                step_files.StepCheckpoint(transform.config, folder, 0, None,
                                                          None, "launch", 0))
    fn._checkpoint(0, rows_of(0), states_of(0), "t")
    one, two = stream.Continuation(job, transform), stream.Continuation(job, transform)
    claim_one, claim_two = one.claim(transform), two.claim(transform)  # both attempt 1
    claim_one()
    with pytest.raises(ValidationError, match="was claimed before"):
        claim_two()
    # a continuation of a checkpoint that a later step was recorded after: refused
    stale = stream.Continuation(job, transform)
    winner = step_files.StepFilesFn(str(other / "steps"), KEYS, ("jsonl",),
                                    step_files.StepCheckpoint(transform.config, folder, 1, None,
                                                              None, "one", 1))
    winner._checkpoint(1, rows_of(1), states_of(1), "t")  # the winner checkpoints step 1
    with pytest.raises(ValidationError, match="step 1 is checkpointed"):
        stale.claim(transform)()


def test_a_damaged_claim_is_refused_in_one_line_naming_it(tmp_path):
    transform, job, folder = release(tmp_path)
    os.makedirs(folder, exist_ok=True)
    path = ck.join(folder, "step-00000000.claim")
    with open(path, "w") as handle:
        handle.write('{"token": ')
    fn = step_files.StepFilesFn(str(tmp_path / "steps"), KEYS, ("jsonl",),
                                step_files.StepCheckpoint(transform.config, folder, 0, None,
                                                          None, "launch", 0))
    with pytest.raises(ValidationError) as refused:
        fn._checkpoint(0, rows_of(0), states_of(0), "t")
    assert path in str(refused.value) and "\n" not in str(refused.value)
    release_json = tmp_path / "release.json"
    release_json.write_text("not json")
    from transforms.claims import read_claim
    with pytest.raises(ValidationError, match="release.json"):
        read_claim(str(release_json))


def test_a_kill_at_every_file_operation_delays_the_release_and_never_wedges_it(tmp_path,
                                                                                 monkeypatch):
    """A kill at the n-th file creation of the launch (claims, checkpoints, step files), then
    at the n-th of the first continuation too: after at most two more `--continue`, every step
    is published once, with the launch's bytes for the steps it published."""
    operations = 0
    clean = tmp_path / "clean"
    calls = kill_at(monkeypatch, -1)  # count the operations of an uninterrupted release
    transform, job, folder = release(clean)
    execute(clean, transform, (0, 0), "launch")
    operations = calls[0]
    assert operations == HORIZON * 4  # claim, checkpoint, file, manifest per step
    expected = {n: (clean / "steps" / n).read_bytes() for n in os.listdir(clean / "steps")}
    for n in range(operations):
        for m in (None, 1, 3):  # the continuation killed too, at its m-th creation
            case = tmp_path / f"kill-{n}-{m}"
            transform, job, folder = release(case)
            kill_at(monkeypatch, n)
            with pytest.raises(Killed):
                execute(case, transform, (0, 0), "launch")
            continued = 0
            if m is not None:
                kill_at(monkeypatch, m)
                try:
                    continue_release(case, transform, job, f"second-{n}")
                    continued += 1
                except Killed:
                    pass
            kill_at(monkeypatch, -1)
            while published(case) != list(range(HORIZON)):
                continue_release(case, transform, job, f"again-{n}-{continued}")
                continued += 1
                assert continued <= 2, (n, m)
            got = {name: (case / "steps" / name).read_bytes()
                   for name in os.listdir(case / "steps")}
            assert got == expected, (n, m)
            assert ck.checkpointed_steps(folder) == list(range(HORIZON))


def test_an_event_of_a_step_published_before_a_continuation_is_late_not_dropped():
    """#44: events that arrived while the stopped job was down, of a step it had published,
    are `late` dead letters naming the step (a batch run's history stays skipped)."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to
    from transforms.messages import DEAD_LETTER, StepWindow
    from transforms.stages import AssignSteps
    transform = ContinualCount(steps=STEPS, public_keys=KEYS, epsilon=1.0, seed=1,
                               insecure=True)
    event = (("u", "a"), STEPS.start(1) + 1.0)
    for streaming in (False, True):
        options = beam.options.pipeline_options.PipelineOptions(streaming=streaming)
        with beam.Pipeline("DirectRunner" if streaming else "FnApiRunner",
                           options=options) as pipeline:
            if streaming:
                from apache_beam.testing.test_stream import TestStream as Stream
                events = pipeline | Stream().add_elements(
                    [beam.window.TimestampedValue(*event)]).advance_watermark_to_infinity()
            else:
                events = pipeline | beam.Create([event]) | beam.Map(
                    lambda e: beam.window.TimestampedValue(*e))
            out = events | AssignSteps(transform.problem, STEPS, StepWindow(3, HORIZON))
            reasons = out.dead_letters | beam.Map(lambda d: d["reason"])
            assert_that(reasons, equal_to(
                ["late: step 1 was already released (before this continuation's first step 3)"]
                if streaming else []))


def test_continue_removes_the_temp_files_a_killed_job_left_in_every_folder_it_writes(tmp_path):
    """A job killed while writing a receipt record or a step file leaves a temp file (a second
    name of nothing or of a whole file); `--continue` removes those of dead processes, in the
    receipt folders of every execution too (the campaign found one left there)."""
    import subprocess
    transform, job, folder = release(tmp_path)
    fn = step_files.StepFilesFn(str(tmp_path / "steps"), KEYS, ("jsonl",),
                                step_files.StepCheckpoint(transform.config, folder, 0, None,
                                                          None, "launch", 0))
    fn._checkpoint(0, rows_of(0), states_of(0), "t0")
    step_files.publish_step(str(tmp_path / "steps"), 0, rows_of(0), ("jsonl",))
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process has now
    left = []
    for where in (str(tmp_path / "steps"), folder, ck.join(folder, "received", "launch")):
        os.makedirs(where, exist_ok=True)
        path = os.path.join(where, f".tmp-{dead.pid}-0123abcd-received-x.jsonl")
        open(path, "w").write("half")
        left.append(path)
    continue_release(tmp_path, transform, job, "second")
    assert [path for path in left if os.path.exists(path)] == []

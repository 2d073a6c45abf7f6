"""Checkpoints of a streaming release (transforms/stream_checkpoint.py): a release stopped after
any step and continued from its checkpoint (twice) equals one uninterrupted release; a unit log
file lost or altered, a checkpoint missing, another secret, or a continuation claimed twice is
refused."""
from __future__ import annotations

import json
import os

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream as BeamTestStream
from apache_beam.transforms.window import TimestampedValue

from tests.support.beam import run
from transforms import ContinualCount, SecretRef, TimeSteps
from transforms import stream_checkpoint as ck
from transforms import streaming
from transforms.claims import ClaimOnce, guard
from transforms.messages import StepWindow
from transforms.step_files import StepCheckpoint, WriteStepFiles
from transforms.validation import ValidationError

ORIGIN, SIZE, HORIZON = 1_700_000_000.0, 60.0, 6
STEPS = TimeSteps(ORIGIN, SIZE, HORIZON)
KEYS = ["a", "b", "c"]
EVENTS = [((f"u{i % 7}", KEYS[i % 2]), ORIGIN + (i % HORIZON) * SIZE + 1.0 + i / 10)
          for i in range(40)]  # key "c" never has events
EVENTS += [(("z", "a"), ORIGIN + step * SIZE + 5.0 + n) for step, n in
           ((0, 0), (4, 0), (4, 1), (5, 0), (5, 1))]
# what the first execution read of step 2 after its last checkpoint and never published (its
# job stopped): the continuation does not see them (acknowledged by the stopped job), so unit
# "z" has spent 1 of its 4 contributions as of step 3, not 3
LOST = [(("z", "a"), ORIGIN + 2 * SIZE + 5.0 + n) for n in (0, 1)]


def count(release_id=None):
    return ContinualCount(steps=STEPS, public_keys=KEYS, epsilon=1.0, max_contributions=4,
                          max_contributions_per_step=2, secret=SecretRef(literal=b"ckpt"),
                          insecure=True, release_id=release_id, checkpoint=FOLDER[0])


FOLDER = [None]


class _Clock:
    def __init__(self, now):
        self.now = now

    def time(self):
        return self.now


def step_by_step(events):
    """`events` step by step, the watermark at each step's end (the local runner holds no
    watermark for timer output: a jump over several steps can make contributions late), then
    at the end of time (a drain)."""
    stream = BeamTestStream()
    for step in range(HORIZON):
        stream = stream.add_elements([TimestampedValue(e, t) for e, t in events
                                      if STEPS.step_of(t) == step])
        stream = stream.advance_watermark_to(STEPS.end(step))
    return stream.advance_watermark_to_infinity()


def execution(tmp_path, monkeypatch, wall: float, continuation=None):
    """One execution of the release over all EVENTS, the release gate's wall clock at `wall`
    (steps due after it stay unreleased, as when a job stops); `continuation`: (first step,
    units, keys) from the checkpoint."""
    monkeypatch.setattr(streaming, "time", _Clock(wall))
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    folder = str(tmp_path / "steps")
    with beam.Pipeline(options=options) as pipeline:
        if continuation is None:
            transform, first = count(), 0
            claim = ClaimOnce(str(tmp_path / "release.json"), {"release": "x"}, "the release")
        else:
            first, units, keys = continuation
            transform = count(release_id=json.load(open(tmp_path / "id.json")))
            claim = ClaimOnce(ck.join(FOLDER[0], ck.claim_name(first)), {"first": first},
                              f"steps from {first}")
            transform.resume(StepWindow(first, HORIZON),
                             unit_states=pipeline | "U" >> beam.Create(list(units.items())),
                             key_states=pipeline | "K" >> beam.Create(list(keys.items())))
        json.dump(transform.release_id, open(tmp_path / "id.json", "w"))
        passed = guard(pipeline, claim, "Claim")
        transform.claimed_by(passed)
        result = pipeline | step_by_step(EVENTS + (LOST if continuation is None else [])) \
            | transform
        _ = result.records | WriteStepFiles(folder, KEYS, ("jsonl",), StepCheckpoint(
            transform.config, FOLDER[0], first, result.key_states, passed,
            transform.execution))
    return transform


def published(tmp_path) -> list:
    folder = tmp_path / "steps"
    return [json.loads(line) for s in range(HORIZON)
            if (folder / f"step-{s:08d}.jsonl").exists()
            for line in open(folder / f"step-{s:08d}.jsonl")]


@pytest.fixture
def stopped_twice(tmp_path, monkeypatch):
    """Stopped after step 1, continued and stopped after step 3, continued to the end."""
    FOLDER[0] = str(tmp_path / "checkpoint")
    transform = execution(tmp_path, monkeypatch, STEPS.end(2) + 1)  # steps 0, 1 released
    assert sorted({r["step"] for r in published(tmp_path)}) == [0, 1]
    last, units, keys, _ = ck.verified_resume(transform.config, FOLDER[0], KEYS)
    assert last == 1
    execution(tmp_path, monkeypatch, STEPS.end(4) + 1, (2, units, keys))  # 2, 3
    assert sorted({r["step"] for r in published(tmp_path)}) == [0, 1, 2, 3]
    return transform


def test_a_release_stopped_and_continued_twice_equals_one_release(stopped_twice, tmp_path,
                                                                  monkeypatch):
    """Each execution processed the events of every step (also after its stop: the unit log's
    entries past the step the next execution continued from are not states of the release;
    the first one's include events the others never see, LOST), and the three together
    published what one batch release of EVENTS does, bit for bit."""
    last, units, keys, _ = ck.verified_resume(stopped_twice.config, FOLDER[0], KEYS)
    assert last == 3
    execution(tmp_path, monkeypatch, STEPS.end(HORIZON + 2), (4, units, keys))
    batch, _ = run(ContinualCount(steps=STEPS, public_keys=KEYS, epsilon=1.0,
                                  max_contributions=4, max_contributions_per_step=2,
                                  secret=SecretRef(literal=b"ckpt"), insecure=True), EVENTS)
    assert published(tmp_path) == sorted(batch, key=lambda r: (r["step"], r["key"]))


def test_a_lost_or_altered_unit_log_file_is_refused(stopped_twice):
    """Dropping one unit log file would let its units spend their caps again: the checkpoint
    lists it; a changed byte fails its MAC."""
    config = stopped_twice.config
    # a file the checkpoint at step 3 lists (a unit log written for a later step is not one)
    listed = ck.read_key_checkpoint(config, FOLDER[0], 3)["unit_logs"]
    logs = sorted(os.path.join(folder, name) for folder, _, names in
                  os.walk(os.path.join(FOLDER[0], "units")) for name in names
                  if b'"u' in open(os.path.join(folder, name), "rb").read()
                  and any(os.path.join(folder, name).endswith(entry) for entry in listed))
    data = open(logs[0], "rb").read()
    os.remove(logs[0])
    with pytest.raises(ValidationError, match=r"^`unit log` must be holding every file the "
                                              r"checkpoint at step 3 lists"):
        ck.verified_resume(config, FOLDER[0], KEYS)
    open(logs[0], "wb").write(data.replace(b'"u', b'"v', 1))
    with pytest.raises(ValidationError, match=r"^`checkpoint file` must be one this release "
                                              r"wrote, unaltered"):
        ck.verified_resume(config, FOLDER[0], KEYS)
    open(logs[0], "wb").write(data)
    assert ck.verified_resume(config, FOLDER[0], KEYS)[0] == 3


def test_a_missing_checkpoint_or_key_state_is_refused(stopped_twice):
    config = stopped_twice.config
    with pytest.raises(ValidationError, match=r"^`checkpoint` must be holding every public "
                                              r"key's state at step 3"):
        ck.verified_resume(config, FOLDER[0], KEYS + ["d"])
    os.remove(os.path.join(FOLDER[0], ck.keys_name(2)))
    with pytest.raises(ValidationError, match=r"^`checkpoint` must be of every step 0 to 3; "
                                              r"got 'steps \[0, 1, 3\]'"):
        ck.verified_resume(config, FOLDER[0], KEYS)


def test_a_checkpoint_of_another_secret_is_refused(stopped_twice):
    other = ContinualCount(steps=STEPS, public_keys=KEYS, epsilon=1.0, max_contributions=4,
                           max_contributions_per_step=2, secret=SecretRef(literal=b"other"),
                           insecure=True, release_id=stopped_twice.release_id)
    with pytest.raises(ValidationError, match=r"^`checkpoint file` must be one this release "
                                              r"wrote"):
        ck.verified_resume(other.config, FOLDER[0], KEYS)


def test_a_continuation_runs_once(stopped_twice, tmp_path, monkeypatch):
    """Continuing the same checkpoint again (a second launch, a replay): its claim exists."""
    _, units, keys, _ = ck.verified_resume(stopped_twice.config, FOLDER[0], KEYS)
    execution(tmp_path, monkeypatch, STEPS.end(4) + 1, (4, units, keys))
    with pytest.raises(Exception, match=r"steps from 4 was claimed before"):
        execution(tmp_path, monkeypatch, STEPS.end(HORIZON + 2), (4, units, keys))


def test_nothing_checkpointed_starts_again_from_step_0(tmp_path):
    """A release stopped before its first step was checkpointed published nothing (files
    follow their checkpoint): it continues from step 0 with no unit or key state."""
    FOLDER[0] = str(tmp_path / "checkpoint")
    assert ck.verified_resume(count().config, FOLDER[0], KEYS) == (-1, {}, {}, [])


def test_which_execution_published_a_step_is_read_from_the_sealed_checkpoints(stopped_twice):
    """The step claims are not sealed: renaming a step's execution in its claim (which would
    skip that execution's unit states: its units would spend their caps again) changes
    nothing; the MAC'd checkpoint of each step names its publisher."""
    config = stopped_twice.config
    before = ck.verified_resume(config, FOLDER[0], KEYS)
    for step in range(4):
        path = os.path.join(FOLDER[0], f"step-{step:08d}.claim")
        claim = json.load(open(path))
        json.dump(dict(claim, execution="0" * 16), open(path, "w"))
    assert ck.verified_resume(config, FOLDER[0], KEYS)[1] == before[1]


def test_two_different_states_of_one_unit_and_step_are_refused(stopped_twice):
    """A retried bundle that saw other events can leave two sealed, listed entries for one
    unit and step: which one was released is unknown, so the continuation is refused."""
    config = stopped_twice.config
    body = ck.read_key_checkpoint(config, FOLDER[0], 3)
    execution = body["execution"]
    data = ("\n".join([ck.codec.dumps(["u1", 3, (4.0, ("a",))]),
                       ck.codec.dumps(["u1", 3, (1.0, ("a",))])]) + "\n").encode()
    name = "units-forged.jsonl"
    folder = os.path.join(FOLDER[0], "units", execution)
    open(os.path.join(folder, name), "wb").write(ck.sealed(config, name, data))
    path = os.path.join(FOLDER[0], ck.keys_name(3))
    open(path, "wb").write(ck.key_checkpoint(
        config, 3, body["records"], body["key_states"],
        body["unit_logs"] + [f"units/{execution}/{name}"], execution))
    with pytest.raises(ValidationError, match=r"^`unit log` must be one state per unit and "
                                              r"step \(two differ at step 3"):
        ck.verified_resume(config, FOLDER[0], KEYS)


def test_a_checkpointed_step_republishes_its_files_byte_for_byte(stopped_twice, tmp_path):
    """A job stopped between a step's checkpoint and its files leaves the step unpublished;
    the continuation writes them from the checkpoint's records: the same bytes."""
    from transforms.step_files import publish_step
    records = ck.read_key_checkpoint(stopped_twice.config, FOLDER[0], 1)["records"]
    publish_step(str(tmp_path / "again"), 1, sorted(records, key=lambda r: r["key"]),
                 ("jsonl",))
    assert (tmp_path / "again" / "step-00000001.jsonl").read_bytes() == \
        (tmp_path / "steps" / "step-00000001.jsonl").read_bytes()


def test_a_step_released_again_after_a_restore_is_accepted_only_when_the_same(stopped_twice):
    """`replayed_step` (a runner that restored the job from an earlier state of itself, Flink):
    the execution that checkpointed the step, with the same records and key states, is the
    same step; other records (1.0 for 1 included), states or executions are not."""
    config = stopped_twice.config
    body = ck.read_key_checkpoint(config, FOLDER[0], 3)
    records, states, execution = body["records"], body["key_states"], body["execution"]
    assert ck.replayed_step(config, FOLDER[0], 3, records, states, execution)
    other = [dict(records[0], value=records[0]["value"] + 1)] + records[1:]
    assert not ck.replayed_step(config, FOLDER[0], 3, other, states, execution)
    as_float = [dict(r, step=float(r["step"])) for r in records]
    assert as_float == records  # equal in Python, not in the files
    assert not ck.replayed_step(config, FOLDER[0], 3, as_float, states, execution)
    assert not ck.replayed_step(config, FOLDER[0], 3, records, states[::-1], execution)
    assert not ck.replayed_step(config, FOLDER[0], 3, records, states, "f" * 16)
    assert not ck.replayed_step(config, FOLDER[0], 5, records, states, execution)  # none yet

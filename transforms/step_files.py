"""Per-step publication of an unbounded release: each step's records written once, whole.

    result.records | WriteStepFiles("out/active-users", public_keys, formats=("jsonl",))

A stateful collector keyed by step holds a step's records until every public key's record of
it is in, then writes `step-NNNNNNNN.<format>` (the records sorted by key, encoded as the
sinks encode them) and the step's manifest `step-NNNNNNNN.json` (record count and each file's
SHA-256), each with an atomic create-if-absent (`durable.create_if_absent`: a local hard link of
a fsynced temporary file, or a gs:// generation-match write), and emits the manifest. So a step
is never visible half-written, and never published twice: a retried bundle finds its own bytes
(accepted), other bytes for a published step are refused (fail closed). A key that halted (the
exact-totals limit) never completes its steps: they are not published.
"""
from __future__ import annotations

import hashlib
import json
from typing import Sequence, Tuple

import apache_beam as beam
from apache_beam.coders import StrUtf8Coder, VarIntCoder
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec

from transforms.claims import ClaimedByDriver, claimed_token
from transforms.durable import create_if_absent
from transforms.release import key_text
from transforms.sinks import encode_records
from transforms.validation import fail
from transforms.streams import codec
from transforms import stream_checkpoint as ck

SUFFIXES = {"parquet": ".parquet", "jsonl": ".jsonl", "csv": ".csv"}


def step_name(folder: str, step: int, suffix: str) -> str:
    return f"{folder.rstrip('/')}/step-{step:08d}{suffix}"


def publish_once(path: str, data: bytes) -> None:
    """Create `path` with `data` unless it exists; an existing file must hold these bytes (a
    retried write of the same step), else the step was published otherwise: refused."""
    if create_if_absent(path, data):
        return
    from apache_beam.io.filesystems import FileSystems
    with FileSystems.open(path) as handle:
        found = handle.read()
    if found != data:
        fail("step file", f"published once ({path} exists with other records: a step is never "
                          f"published twice)", path)


def publish_step(folder: str, step: int, rows: list, formats) -> dict:
    """Step `step`'s files (`rows`: its records sorted by key) in each format, then its
    manifest, each published once (`publish_once`); -> the manifest."""
    files = {}
    for fmt in formats:
        data = encode_records(rows, fmt)
        path = step_name(folder, step, SUFFIXES[fmt])
        publish_once(path, data)
        files[fmt] = {"name": path.rsplit("/", 1)[-1],  # beside the manifest
                      "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"step": step, "records": len(rows), "files": files,
                "window_end": rows[0]["window_end"]}
    publish_once(step_name(folder, step, ".json"),
                 json.dumps(manifest, sort_keys=True, indent=1).encode("utf-8"))
    return manifest


class StepCheckpoint:
    """What a checkpointed release's steps carry (`transforms.stream_checkpoint`): its config
    (the checkpoints' MAC key), the checkpoint folder, the first step of this execution's
    window, the keys' states after each step (the release's `key_states`), and the
    execution's claim token (the singleton of its guard)."""

    def __init__(self, config, folder: str, first: int, key_states, passed, execution: str,
                 attempt: int = None):
        self.config, self.folder, self.first = config, folder, first
        self.key_states, self.passed, self.execution = key_states, passed, execution
        if attempt is None:  # the launch (0, 0), or a continuation's first attempt
            attempt = 1 if first > 0 else 0
        self.epoch = (first, attempt)  # `stream_checkpoint.epochs`


class StepFilesFn(beam.DoFn):
    """(step, line) -> the step's manifest once all its public keys' lines are in: a record
    (JSON), or, checkpointed, a record with its key's sealed state after the step
    ({"record": ..., "state": codec line}: one element and one state write per key and step,
    as without checkpoints). A checkpointed step is claimed by this execution and checkpointed
    before its files are written."""
    RECORDS = BagStateSpec("records", StrUtf8Coder())
    COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())

    def __init__(self, folder: str, public_keys: Sequence, formats: Tuple[str, ...],
                 checkpoint: "StepCheckpoint" = None):
        self.folder, self.formats = folder, tuple(formats)
        self.keys = frozenset(key_text(k) for k in public_keys)
        self.checkpoint = None if checkpoint is None else (
            checkpoint.config, checkpoint.folder, checkpoint.epoch, checkpoint.execution)
        # a job the runner may restore from an earlier state of itself (Flink: its claim is
        # the driver's) releases a step again after a restore: the same step is accepted
        self.replays = checkpoint is not None and isinstance(checkpoint.passed,
                                                             ClaimedByDriver)

    def process(self, element, records=beam.DoFn.StateParam(RECORDS),
                count=beam.DoFn.StateParam(COUNT)):
        return self._process(element, None, records, count)

    def _process(self, element, token, records, count):
        step, line = element
        records.add(line)
        seen = (count.read() or 0) + 1
        count.write(seen)
        if seen < len(self.keys):
            return
        items = [json.loads(x) for x in records.read()]
        if self.checkpoint is not None:
            states = sorted((codec.loads(item["state"]) for item in items),
                            key=lambda pair: key_text(pair[0]))
            items = [item["record"] for item in items]
        rows = sorted(items, key=lambda r: r["key"])
        if [r["key"] for r in rows] != sorted(self.keys):
            fail("records", f"one per public key at step {step}",
                 sorted(r["key"] for r in rows))
        if self.checkpoint is not None:
            if [key_text(pair[0]) for pair in states] != sorted(self.keys):
                fail("key states", f"one per public key at step {step}",
                     sorted(key_text(pair[0]) for pair in states))
            self._checkpoint(step, rows, states, token)
        manifest = publish_step(self.folder, step, rows, self.formats)
        records.clear()
        count.clear()
        yield manifest

    def _checkpoint(self, step: int, rows: list, states: list, token) -> None:
        """Claims `step` for this execution, refuses when a later epoch (a continuation, or a
        retry of one) claimed it, and writes the step's checkpoint (before its files). A claim
        of an earlier epoch is taken over: its execution stopped before checkpointing the step
        (else this epoch would not start at or before it); the checkpoint, written once,
        decides which execution publishes the step."""
        config, folder, epoch, execution = self.checkpoint
        epoch = tuple(epoch)

        def superseded():
            later = ck.superseding(folder, epoch, step)
            if later:
                fail("step", f"published by the latest execution (a continuation claimed the "
                             f"steps from {later[0][0]})", step)
        superseded()  # before the step's claim: a superseded execution leaves none
        claim = ck.join(folder, f"step-{step:08d}.claim")
        mine = json.dumps({"token": str(token), "execution": execution, "epoch": list(epoch)},
                          sort_keys=True)
        if not create_if_absent(claim, mine.encode("utf-8")):
            found = read_step_claim(claim)
            if found != json.loads(mine) and tuple(found.get("epoch", ck.LAUNCH)) >= epoch:
                fail("step", f"published by one execution (step {step} was claimed by "
                             f"another execution of release {config.release_id})", claim)
        superseded()
        if self.replays and ck.replayed_step(config, folder, step, rows, states, execution):
            return  # released again after a restore, the same: checkpointed once
        # every unit log file written so far: the ones behind what step `step` releases too
        publish_once(ck.join(folder, ck.keys_name(step)),
                     ck.key_checkpoint(config, step, rows, states, ck.unit_log_files(folder),
                                       execution))


def read_step_claim(path: str) -> dict:
    """A step's claim (`StepFilesFn._checkpoint`), or one error naming the file."""
    from apache_beam.io.filesystems import FileSystems
    try:
        with FileSystems.open(path) as handle:
            found = json.loads(handle.read().decode("utf-8"))
        if not isinstance(found, dict):
            raise ValueError("not an object")
        return found
    except (OSError, ValueError, UnicodeDecodeError) as error:
        fail("step claim", f"a JSON object this release wrote ({type(error).__name__}: delete "
                           f"the damaged file to let the step be claimed again)", path)


class CheckpointedStepFilesFn(StepFilesFn):
    """`StepFilesFn` of a checkpointed release: `token`, the side input of this execution's
    claim token."""

    def process(self, element, token, records=beam.DoFn.StateParam(StepFilesFn.RECORDS),
                count=beam.DoFn.StateParam(StepFilesFn.COUNT)):
        return self._process(element, token, records, count)


class WriteStepFiles(beam.PTransform):
    """Records of an unbounded release -> one file per step and format under `folder`, written
    once every public key's record of the step is in (see the module docstring); emits each
    step's manifest. `checkpoint` (a `StepCheckpoint`): each step is first claimed by this
    execution and checkpointed (`transforms.stream_checkpoint`); its records then come with
    the release's key states (the records applied to are not read again)."""

    def __init__(self, folder: str, public_keys: Sequence, formats=("jsonl",),
                 checkpoint: StepCheckpoint = None):
        super().__init__()
        for fmt in formats:
            if fmt not in SUFFIXES:
                fail("formats", "among " + ", ".join(map(repr, SUFFIXES)), fmt)
        if not list(public_keys):
            fail("public_keys", "a non-empty list (the keys every step holds)", public_keys)
        self.folder, self.public_keys, self.formats = folder, list(public_keys), tuple(formats)
        self.checkpoint = checkpoint

    def expand(self, records):
        if self.checkpoint is None:
            lines = records | "ByStep" >> beam.Map(
                lambda record: (record["step"], json.dumps(record, sort_keys=True)))
            return lines | "PublishCompleteSteps" >> beam.ParDo(StepFilesFn(
                self.folder, self.public_keys, self.formats))
        # checkpointed: the release's key states carry each key's record of the step too
        lines = self.checkpoint.key_states | "ByStep" >> beam.Map(
            lambda item: (item[0], json.dumps({"record": item[1][2], "state": codec.dumps(
                (item[1][0], item[1][1]))}, sort_keys=True)))
        return lines | "PublishCompleteSteps" >> beam.ParDo(CheckpointedStepFilesFn(
            self.folder, self.public_keys, self.formats, self.checkpoint),
            claimed_token(self.checkpoint.passed))

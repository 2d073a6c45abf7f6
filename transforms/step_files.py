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

from transforms.durable import create_if_absent
from transforms.release import key_text
from transforms.sinks import encode_records
from transforms.validation import fail

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


class StepFilesFn(beam.DoFn):
    """(step, record) -> the step's manifest once all its public keys' records are in."""
    RECORDS = BagStateSpec("records", StrUtf8Coder())
    COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())

    def __init__(self, folder: str, public_keys: Sequence, formats: Tuple[str, ...]):
        self.folder, self.formats = folder, tuple(formats)
        self.keys = frozenset(key_text(k) for k in public_keys)

    def process(self, element, records=beam.DoFn.StateParam(RECORDS),
                count=beam.DoFn.StateParam(COUNT)):
        step, record = element
        if record["key"] not in self.keys:
            fail("record", "of a public key", record["key"])
        records.add(json.dumps(record, sort_keys=True))
        seen = (count.read() or 0) + 1
        count.write(seen)
        if seen < len(self.keys):
            return
        rows = sorted((json.loads(line) for line in records.read()), key=lambda r: r["key"])
        if [r["key"] for r in rows] != sorted(self.keys):
            fail("records", f"one per public key at step {step}",
                 sorted(r["key"] for r in rows))
        files = {}
        for fmt in self.formats:
            data = encode_records(rows, fmt)
            path = step_name(self.folder, step, SUFFIXES[fmt])
            publish_once(path, data)
            files[fmt] = {"path": path, "sha256": hashlib.sha256(data).hexdigest()}
        manifest = {"step": step, "records": len(rows), "files": files,
                    "window_end": rows[0]["window_end"]}
        publish_once(step_name(self.folder, step, ".json"),
                     json.dumps(manifest, sort_keys=True, indent=1).encode("utf-8"))
        records.clear()
        count.clear()
        yield manifest


class WriteStepFiles(beam.PTransform):
    """Records of an unbounded release -> one file per step and format under `folder`, written
    once every public key's record of the step is in (see the module docstring); emits each
    step's manifest."""

    def __init__(self, folder: str, public_keys: Sequence, formats=("jsonl",)):
        super().__init__()
        for fmt in formats:
            if fmt not in SUFFIXES:
                fail("formats", "among " + ", ".join(map(repr, SUFFIXES)), fmt)
        if not list(public_keys):
            fail("public_keys", "a non-empty list (the keys every step holds)", public_keys)
        self.folder, self.public_keys, self.formats = folder, list(public_keys), tuple(formats)

    def expand(self, records):
        return (records
                | "ByStep" >> beam.Map(lambda record: (record["step"], record))
                | "PublishCompleteSteps" >> beam.ParDo(StepFilesFn(
                    self.folder, self.public_keys, self.formats)))

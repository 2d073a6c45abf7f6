"""Per-step publication (transforms/step_files.py): each step's records once, whole."""
from __future__ import annotations

import glob
import hashlib
import json
import os

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream as BeamTestStream
from apache_beam.transforms.window import TimestampedValue

from tests.support.beam import run
from tests.test_streaming import EVENTS, STEPS, count
from transforms.step_files import WriteStepFiles, publish_once


def test_every_step_is_one_whole_file_of_every_public_key_equal_to_batch(tmp_path):
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    folder = str(tmp_path / "steps")
    by_step = {}
    for element, ts in EVENTS:
        by_step.setdefault(STEPS.step_of(ts), []).append(TimestampedValue(element, ts))
    with beam.Pipeline(options=options) as pipeline:
        stream = BeamTestStream()
        for step in range(STEPS.horizon):
            if by_step.get(step):
                stream = stream.add_elements(by_step[step])
            stream = stream.advance_watermark_to(STEPS.end(step))
        stream = stream.advance_watermark_to(STEPS.end(STEPS.horizon + 3))
        result = pipeline | stream.advance_watermark_to_infinity() | count(1)
        _ = result.records | WriteStepFiles(folder, ["a", "b", "c"], formats=("jsonl", "csv"))
    batch, _ = run(count(1), EVENTS)
    for step in range(STEPS.horizon):
        path = os.path.join(folder, f"step-{step:08d}.jsonl")
        rows = [json.loads(line) for line in open(path)]
        assert [r["key"] for r in rows] == ["a", "b", "c"]
        assert rows == [r for r in batch if r["step"] == step]
        manifest = json.load(open(os.path.join(folder, f"step-{step:08d}.json")))
        assert manifest["records"] == 3 and set(manifest["files"]) == {"jsonl", "csv"}
        for entry in manifest["files"].values():
            data = open(os.path.join(folder, entry["name"]), "rb").read()
            assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert len(glob.glob(os.path.join(folder, "step-*"))) == 3 * STEPS.horizon
    assert not glob.glob(os.path.join(folder, ".tmp-*"))  # no temporary file left


def test_a_step_is_published_once_a_retry_finds_its_own_bytes(tmp_path):
    path = str(tmp_path / "step-00000001.jsonl")
    publish_once(path, b"records\n")
    publish_once(path, b"records\n")  # a retried bundle: the same bytes, accepted
    with pytest.raises(ValueError, match=r"^`step file` must be published once"):
        publish_once(path, b"other records\n")
    assert open(path, "rb").read() == b"records\n"


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"^`formats` must be among"):
        WriteStepFiles("x", ["a"], formats=("xml",))
    with pytest.raises(ValueError, match=r"^`public_keys` must be a non-empty list"):
        WriteStepFiles("x", [])

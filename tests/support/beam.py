"""Running the transforms on the local runners and collecting what they emit."""
from __future__ import annotations

import json
import os
import tempfile

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream as BeamTestStream
from apache_beam.transforms.window import TimestampedValue


class AppendJson(beam.DoFn):
    """Appends each element as one JSON line (no GroupByKey after timers: Beam 2.77 loses timer output there)."""

    def __init__(self, path):
        self.path = path

    def process(self, element):
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(element, sort_keys=True, default=str) + "\n")


def read_json_lines(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def run(transform, events, mode="batch", steps=None, extra_args=()):
    """events: [(element, timestamp seconds)] -> (records, dead letters) as sorted lists."""
    folder = tempfile.mkdtemp(prefix="continual-test-")
    records_path = os.path.join(folder, "records.jsonl")
    dead_path = os.path.join(folder, "dead.jsonl")
    if mode == "streaming":
        options = PipelineOptions(list(extra_args))
        options.view_as(StandardOptions).streaming = True
    elif mode == "multi_processing":
        options = PipelineOptions(["--direct_running_mode=multi_processing",
                                   "--direct_num_workers=2", *extra_args])
    else:
        options = PipelineOptions(["--runner=FnApiRunner", *extra_args])
    with beam.Pipeline(options=options) as pipeline:
        if mode == "streaming":
            stream = BeamTestStream()
            by_step = {}
            for element, ts in events:
                by_step.setdefault(steps.step_of(ts), []).append(TimestampedValue(element, ts))
            late = by_step.pop(None, [])
            if late:
                stream = stream.add_elements(late)
            for step in range(steps.horizon):
                if by_step.get(step):
                    stream = stream.add_elements(by_step[step])
                stream = stream.advance_watermark_to(steps.end(step))
            stream = stream.advance_watermark_to(steps.end(steps.horizon + 2))
            stream = stream.advance_watermark_to_infinity()
            collection = pipeline | stream
        else:
            collection = (pipeline | beam.Create(events, reshuffle=False)
                          | beam.Map(lambda e: TimestampedValue(e[0], e[1])))
        result = collection | transform
        result.records | "Collect records" >> beam.ParDo(AppendJson(records_path))
        result.dead_letters | "Collect dead letters" >> beam.ParDo(AppendJson(dead_path))
    records = sorted(read_json_lines(records_path), key=lambda r: (r["key"], r["step"]))
    dead = sorted(read_json_lines(dead_path), key=lambda r: (r["reason"], r["record"]))
    return records, dead

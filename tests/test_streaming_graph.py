"""The streaming graph's stateful steps, their state cells and coders, against a golden file:
a streaming job updated in place (Dataflow `--update`) maps its state by step name, cell name
and coder; renaming any of them strands the state (refresh the golden file only on purpose:
python3 -m tests.test_streaming_graph)."""
from __future__ import annotations

import json
import os
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.transforms.userstate import get_dofn_specs, is_stateful_dofn
from apache_beam.testing.test_stream import TestStream as BeamTestStream

from transforms import SecretRef, TimeSteps
from transforms.registry import SPECS

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden",
                      "streaming_state_steps.json")
BOUNDS = {"sum": {"max_value": 10.0}, "mean": {"max_value": 10.0},
          "count_distinct": {"max_flips": 2}, "degree_count": {"max_updates": 2},
          "triangle_count": {"max_degree": 3, "max_contribution": 4}}


def stateful_steps() -> dict:
    """{transform: [[step label, [[cell, coder class] ...], [timer ...]] ...]} on unbounded
    input, for every registry transform."""
    out = {}
    for name, spec in SPECS.items():
        options = PipelineOptions()
        options.view_as(StandardOptions).streaming = True
        pipeline = beam.Pipeline(options=options)
        kwargs = dict(steps=TimeSteps(0, 60, 4), epsilon=1.0, insecure=True,
                      secret=SecretRef(literal=b"graph"), **BOUNDS.get(name, {}))
        if spec.single_key is None:
            kwargs["public_keys"] = ["a"]
        _ = (pipeline | BeamTestStream().advance_watermark_to_infinity()
             | spec.class_name >> spec.transform_class()(**kwargs))
        steps = []

        class Visit(beam.pipeline.PipelineVisitor):
            def visit_transform(self, node):
                fn = getattr(node.transform, "fn", None)
                if not isinstance(fn, beam.DoFn):
                    return
                if not is_stateful_dofn(fn):
                    return
                state_specs, timer_specs = get_dofn_specs(fn)
                cells = sorted([s.name, type(s.coder).__module__ + "." + type(s.coder).__name__]
                               for s in state_specs)
                timers = sorted([t.name, str(t.time_domain)] for t in timer_specs)
                steps.append([node.full_label, cells, timers])
        pipeline.visit(Visit())
        out[name] = steps
    return out


def test_stateful_streaming_steps_cells_and_coders_are_the_golden_ones():
    with open(GOLDEN, encoding="utf-8") as handle:
        golden = json.load(handle)
    assert stateful_steps() == golden


if __name__ == "__main__":  # refresh the golden file (on purpose only)
    with open(GOLDEN, "w", encoding="utf-8") as handle:
        json.dump(stateful_steps(), handle, indent=1, sort_keys=True)
        handle.write("\n")
    sys.exit(0)

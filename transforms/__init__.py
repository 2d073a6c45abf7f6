"""Differentially private continual release for Apache Beam.

`transforms.mechanisms` (numpy) and `transforms.streams` (pure Python) are Beam-free and
importable on their own; the Beam transforms below are loaded on first use.
"""
from transforms.registry import SPECS as _SPECS

_BEAM_EXPORTS = {
    **{spec.class_name: spec.module for spec in _SPECS.values()},
    "TimeSteps": "transforms.steps", "SecretRef": "transforms.secret",
    "WriteRecordsToParquet": "transforms.sinks", "WriteRecordsToJsonLines": "transforms.sinks",
    "WriteRecordsToCsv": "transforms.sinks", "ArrowEvents": "transforms.arrow_input",
}


def __getattr__(name):
    if name in _BEAM_EXPORTS:
        import importlib
        return getattr(importlib.import_module(_BEAM_EXPORTS[name]), name)
    raise AttributeError(f"module 'transforms' has no attribute {name!r}")


__all__ = sorted(_BEAM_EXPORTS)
